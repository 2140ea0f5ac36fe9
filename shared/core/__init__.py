"""The pure core: ids, events, fold, views, packer, planning, decisions. No I/O (docs/architecture.md)."""

"""Context packing and token counting (pure)."""

"""Labs: many runs forked with one edit, judged before and after (docs/forks.md)."""

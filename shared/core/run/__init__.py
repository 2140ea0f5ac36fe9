"""A run's log and what is folded from it: ids, events, state, the fold, views, planning, crash points (pure)."""

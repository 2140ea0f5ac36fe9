"""Golden event logs and their expected folded states (see regen.py)."""

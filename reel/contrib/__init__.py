"""Integrations of Reel with other agent frameworks (each needs its own optional extra)."""

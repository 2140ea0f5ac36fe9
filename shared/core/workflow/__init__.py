"""Workflow specs and their load-time checks: steps, models, tools, agent tools (pure)."""

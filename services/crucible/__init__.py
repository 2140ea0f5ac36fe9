"""Crucible's shell: world, judge, proposer, gates, loop, session log, service and CLI."""

"""Crucible's shell (ADR 0004): world, judge, proposer, gates, loop, session log, service and CLI."""

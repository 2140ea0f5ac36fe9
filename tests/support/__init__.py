"""Test helpers shared across suites (the loopback chat-completions server)."""

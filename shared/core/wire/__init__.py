"""What crosses NATS besides the log: commands and replies, subjects, input limits, live messages (pure)."""

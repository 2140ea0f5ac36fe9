"""Running processes: one process-group runner and what runs on it (command tools, the command verifier)."""

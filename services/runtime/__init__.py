"""What every service process shares: the entry runner, the health probe, resuming an executor."""

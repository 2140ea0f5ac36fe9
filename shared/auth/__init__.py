"""Who may do what: NATS roles, the ``reel auth init`` directory, this process's secrets."""

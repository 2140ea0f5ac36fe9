"""The ``reel`` command line's rough edges a fresh user met: real processes on a real nats-server."""

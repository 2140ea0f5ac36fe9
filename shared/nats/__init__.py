"""NATS JetStream adapters of the core's ports: event log, blob store, snapshots, leases, infra, consumer shell."""

"""Reel: durable, rewindable, verifiable AI-agent runs on NATS JetStream.

The package holds the engine as ``reel.shared`` (the event model, fold, views, packer and adapters) and
``reel.services`` (the executor, mutators, verifier, CLI and UI processes).
"""

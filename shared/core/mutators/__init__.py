"""The mutators' pure decisions: cancel, rewind, recovery (respond's: :mod:`shared.core.input.respond`)."""

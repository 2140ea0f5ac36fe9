"""The mutators' pure decisions: cancel, rewind, recovery (respond's: :mod:`reel.shared.core.input.respond`)."""

"""Verification, pure: verifier specs, the verifier's decisions, the built-ins, reported outcomes."""

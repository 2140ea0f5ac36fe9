"""Verifier service: judges runs resting in ``Verifying`` and completes them."""

"""Environments and secrets, pure: ``${NAME}`` interpolation, a tool's allow-listed environment, redaction."""

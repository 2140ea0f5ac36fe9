"""The fault suite: real processes killed, restarted and fed bad input."""

"""The fault suite (issue 10 item 6): real processes killed, restarted and fed bad input."""

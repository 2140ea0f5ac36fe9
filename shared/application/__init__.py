"""The application layer over the ports: fenced commits, the workflow cache, verifier runs, tool import checks."""

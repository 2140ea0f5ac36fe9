"""``python -m reel.services.recovery``: run one recovery service instance (env: see shared/runtime/config.py)."""

from reel.services.runtime.runner import main_for

from .app import serve

if __name__ == "__main__":
    main_for("recovery", serve)

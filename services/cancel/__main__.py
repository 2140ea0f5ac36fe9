"""``python -m reel.services.cancel``: run one cancel service instance (env: see shared/runtime/config.py)."""

from reel.services.runtime.runner import main_for

from .app import serve

if __name__ == "__main__":
    main_for("cancel", serve)

"""``python -P -m reel.services.retention``: run the retention service (env: see shared/runtime/config.py)."""

from reel.services.runtime.runner import main_for

from .app import serve

if __name__ == "__main__":
    main_for("retention", serve)

"""``python -m reel.services.crucible``: run one Crucible worker (env: see shared/runtime/config.py)."""

from reel.services.runtime.runner import main_for

from .app import serve

if __name__ == "__main__":
    main_for("crucible", serve)

"""``python -m services.crucible``: run one Crucible worker (env: see shared/config.py)."""

from services.runner import main_for

from .app import serve

if __name__ == "__main__":
    main_for("crucible", serve)

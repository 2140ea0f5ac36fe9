"""``python -m reel.services.cli``: the ``reel`` command line."""

from reel.services.cli import main

if __name__ == "__main__":
    main()

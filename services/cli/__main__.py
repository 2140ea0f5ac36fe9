"""``python -m services.cli``: the ``reel`` command line."""

from services.cli import main

if __name__ == "__main__":
    main()

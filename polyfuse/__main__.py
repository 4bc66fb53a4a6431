"""``python -m polyfuse``: the same as the ``polyfuse`` command."""

from polyfuse.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

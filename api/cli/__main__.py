"""``python -m fastslow.api.cli``: the ``fastslow`` command, for a process without the console script."""

from . import main

if __name__ == "__main__":  # not when a tool imports every module of the package
    main()

"""``python -m lbbench``: the command line, as the ``lbbench`` console script runs it."""

from .cli.main import main

if __name__ == "__main__":  # a spawned worker process imports this module too
    main()

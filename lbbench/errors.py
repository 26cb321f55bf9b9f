"""The library's user errors: what a user can fix, named in the library's own terms.

Two kinds, siblings under ``UserError``; the CLI catches ``UserError`` and prints one line, exit code 2:

- ``InputError``: bad input — a ``RunConfig`` field (``rate_per_s``), a flag's value, a file, a row. A library
  function does not know which command line called it, so its errors name the input, never a flag;
  ``InputError.field`` carries that name and the CLI maps it to the flag a user typed (``lbbench.cli.flags``).
- ``SetupError``: the input is well formed but what it points at does not work — an endpoint that does not
  answer or is not the engine it should be, a vLLM that does not start, a measurement the engine spoils, a
  router that returns an impossible decision.

Every error raised for a user's input or setup derives from one of the two (``tests/test_errors.py`` walks
the package to keep it so); anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the user can fix. ``str()`` is ``"FIELD: PROBLEM"`` (or the problem alone when no field
    applies)."""

    def __init__(self, problem: str, field: str | None = None):
        self.problem = problem
        self.field = field
        super().__init__(f"{field}: {problem}" if field else problem)


class InputError(UserError, ValueError):
    """Bad user input: a field, flag value, file or row (see the module docstring)."""


class SetupError(UserError, RuntimeError):
    """What the input points at does not work: an endpoint, an engine, a launch, a router (module docstring)."""

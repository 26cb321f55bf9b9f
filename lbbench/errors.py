"""The library's bad-input error: it names what is wrong in the library's own terms.

A library function does not know which command line called it, so its errors name the input — a
``RunConfig`` field (``rate_per_s``), a file, a row — never a flag. ``InputError.field`` carries that
name; the CLI maps it to the flag a user typed (``lbbench.cli.flags``) and prints one line.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input. ``str()`` is ``"FIELD: PROBLEM"`` (or the problem alone when no field applies)."""

    def __init__(self, problem: str, field: str | None = None):
        self.problem = problem
        self.field = field
        super().__init__(f"{field}: {problem}" if field else problem)

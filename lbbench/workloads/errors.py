"""Errors raised by workload generators and trace readers.

Both are ``ValueError`` subclasses so a command line can turn them into one
clear line and exit code 2 without knowing where they came from.
"""

from __future__ import annotations

from ..errors import InputError


class WorkloadError(InputError):
    """A workload was asked for with parameters that make no sense."""


class TraceError(WorkloadError):
    """A trace file cannot be read; the message names the file (and row)."""

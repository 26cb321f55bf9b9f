"""The ``lbbench`` command line: click commands, one module per command family, thin over the library."""

from .main import main

__all__ = ["main"]

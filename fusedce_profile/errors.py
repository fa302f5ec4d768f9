"""Errors the public API raises; the command line maps each to its exit code."""


class UsageError(ValueError):
    """Bad input, said in one line naming the argument and what was expected (exit 2)."""

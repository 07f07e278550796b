"""The one error type the CLI turns into a single stderr line and exit code 2."""


class UsageError(Exception):
    """Bad input: unknown model, unparsable size, impossible layout, ..."""

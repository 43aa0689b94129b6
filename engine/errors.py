"""The base of every error meant for the user: the CLI prints its message as one line, no traceback."""


class DualhubError(Exception):
    """A problem the user can act on (bad input, missing file, wrong model). The message says what to do."""

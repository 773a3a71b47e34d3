"""Errors the user can act on. The CLI prints them as one line and exits non-zero."""


class DflashError(Exception):
    """A problem the user can fix: bad input, an unreachable host, a refused key.

    The message is one line that says what is wrong and what to do; the CLI prints it
    without a traceback and exits with `exit_code`.
    """

    exit_code = 2


class RemoteCommandError(DflashError):
    """A remote command failed; the message carries the remote's own one-line reason."""

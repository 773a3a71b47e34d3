"""Errors the user can act on. The CLI prints them as one line and exits non-zero."""


class DflashError(Exception):
    """A problem the user can fix; its one-line message says what is wrong and what to do."""

    exit_code = 2


class RemoteCommandError(DflashError):
    """A remote command failed; the message carries the remote's own one-line reason."""

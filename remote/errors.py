"""The one error type a remote command raises for a problem the user can fix."""


class UserError(Exception):
    """A problem with the input (a path, a config, a flag), not a bug.

    The remote CLI prints it as one line on stderr, prefixed ``dflash-remote: error:``, and
    exits with `EXIT_USER_ERROR`, so the controller can show it verbatim.
    """


EXIT_USER_ERROR = 3
ERROR_PREFIX = "dflash-remote: error: "

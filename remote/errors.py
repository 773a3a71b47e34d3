"""The one error type a remote command raises for a problem the user can fix."""


class UserError(Exception):
    """A problem with the input, not a bug: one line the controller shows verbatim."""


EXIT_USER_ERROR = 3
ERROR_PREFIX = "dflash-remote: error: "

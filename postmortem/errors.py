"""The one exception a user sees: a sentence saying what is wrong with what they asked."""


class PostmortemError(Exception):
    """A user-facing error (bad path, bad flag, unreadable history); the CLI prints it and exits 2."""

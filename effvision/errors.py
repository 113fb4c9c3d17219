"""User-facing errors: one clear line for people, a traceback only with --debug."""


class EffvisionError(Exception):
    """A problem with the user's input (name, file, recipe, data); shown as one line, exit 1."""

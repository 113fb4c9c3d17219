"""User-facing errors: one clear line for people, a traceback only with --debug."""


class EffvisionError(Exception):
    """A problem with the user's input (name, file, recipe, data); shown as one line, exit 1."""


def one_line(exc: BaseException, limit: int = 300) -> str:
    """'Type: first non-empty line of the message', cut to `limit` characters (the type alone
    for an empty message): how a recorded failure reads in a table or a report."""
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return (f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:limit]

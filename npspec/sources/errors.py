"""CheckpointError, raised by every layer that reads or checks a model, and the helpers that keep a message on one
line. Imports nothing of npspec.
"""


class CheckpointError(ValueError):
    """A model file or directory is missing, malformed or inconsistent."""


def oneline(e):
    """An exception's message on one line, or its type's name if empty."""
    return " ".join(str(e).split()) or type(e).__name__


def capped(problems, limit=10):
    """`problems` joined by "; ", at most `limit`, then "... and N more"."""
    shown = "; ".join(problems[:limit])
    return shown + (f"; ... and {len(problems) - limit:,} more" if len(problems) > limit else "")

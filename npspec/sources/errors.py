"""npspec's error for bad model files, and the helpers that keep every error message on one line.

Imports nothing of npspec: every layer that reads or checks a model (tensors, files, huggingface,
quantized, sources, the commands) raises CheckpointError and formats with oneline and capped.
"""


class CheckpointError(ValueError):
    """A model file or directory is missing, malformed or inconsistent."""


def oneline(e):
    """An exception's message on one line (library messages often span several), with its type if empty."""
    return " ".join(str(e).split()) or type(e).__name__


def capped(problems, limit=10):
    """Problems joined with "; ", at most `limit` of them, then "... and N more" (an error stays one readable line)."""
    shown = "; ".join(problems[:limit])
    return shown + (f"; ... and {len(problems) - limit:,} more" if len(problems) > limit else "")

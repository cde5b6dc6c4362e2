"""CheckpointError, raised by every layer that reads or checks a model, and the helpers that keep a message on one
line. Imports nothing of npspec.
"""


class CheckpointError(ValueError):
    """A model file or directory is missing, malformed or inconsistent."""


class NoCodes(ValueError):
    """A kernel that reads int codes (dequant-panels, compiled-quant) was named for a model whose weights are float32: it would decode
    the float weights, not the quantized model asked for. `option`: how the caller named the kernel, `spec`: how it
    names a quantized SPEC (the library's by default; the CLI passes its flags)."""

    def __init__(self, kernel, role, source, option=None, spec="int8-g64:SPEC"):
        self.kernel, self.role, self.source = kernel, role, source
        option = option or f"kernel={kernel!r}"
        super().__init__(f"{option} reads a quantized {role}'s int codes, and the {role} {source} holds float32 "
                         f"weights: give an int scheme such as {spec}, or drop {option}")


def oneline(e):
    """An exception's message on one line, or its type's name if empty."""
    return " ".join(str(e).split()) or type(e).__name__


def capped(problems, limit=10):
    """`problems` joined by "; ", at most `limit`, then "... and N more"."""
    shown = "; ".join(problems[:limit])
    return shown + (f"; ... and {len(problems) - limit:,} more" if len(problems) > limit else "")

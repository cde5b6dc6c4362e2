"""Progress bars for long work (building a `random:` model, converting, loading), shown only when asked.

Whether to show progress is the caller's explicit choice: functions that do long work take a
`progress` argument, None (the default: nothing shown) or a factory such as `terminal_bars`:

    progress(desc, total, unit) -> a bar: a context manager with update(n)

and call `bar(progress, desc, total, unit)` to get one. Nothing here reads the environment by
itself: the commands decide with `show_progress(quiet, stream, environ)` (--quiet, NPSPEC_QUIET,
TQDM_DISABLE, and whether stderr is a terminal) and pass `terminal_bars` or None down.
Imports tqdm (a huggingface_hub requirement) and the standard library only.
"""

import sys

from tqdm import tqdm

QUIET_ENV = "NPSPEC_QUIET"
DELAY = 0.5  # seconds: quicker work shows no bar


class NoBar:
    """A bar that shows nothing: what `bar` returns when progress is None."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        pass


def bar(progress, desc, total, unit="B"):
    """A bar from the factory `progress` (None: NoBar) for `total` units (bytes by default) described by `desc`."""
    return NoBar() if progress is None else progress(desc, total, unit)


def terminal_bars(desc, total, unit="B"):
    """A tqdm bar on stderr, shown once the work has taken DELAY seconds, gone when it is done; bytes as kB/MB/GB."""
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, file=sys.stderr, leave=False,
                delay=DELAY, disable=False)


def _truthy(value):
    return value is not None and value.strip().lower() not in ("", "0", "false", "no", "off")


def show_progress(quiet, stream, environ):
    """Whether a command shows progress bars: not `quiet` (its --quiet), neither NPSPEC_QUIET nor TQDM_DISABLE
    set to a true value in `environ` (a mapping, e.g. os.environ), and `stream` (stderr) a terminal."""
    if quiet or _truthy(environ.get(QUIET_ENV)) or _truthy(environ.get("TQDM_DISABLE")):
        return False
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False

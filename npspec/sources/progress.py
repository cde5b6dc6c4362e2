"""Progress bars for long work, shown only when a caller asks: functions that do long work take `progress`, None
(nothing shown) or a factory such as `terminal_bars`, `progress(desc, total, unit)` -> a context manager with
update(n), and call `bar(progress, ...)`. The commands decide with `show_progress` (--quiet, NPSPEC_QUIET,
TQDM_DISABLE, a terminal). Imports tqdm and the standard library only.
"""

import sys

from tqdm import tqdm

QUIET_ENV = "NPSPEC_QUIET"
DELAY = 0.5  # seconds: quicker work shows no bar


class NoBar:  # what `bar` returns when progress is None: shows nothing
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        pass


def bar(progress, desc, total, unit="B"):
    """A bar of `total` units (bytes by default) from the factory `progress` (None: NoBar)."""
    return NoBar() if progress is None else progress(desc, total, unit)


def terminal_bars(desc, total, unit="B"):
    """A tqdm bar on stderr, shown once the work has taken DELAY s, gone when done."""
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, file=sys.stderr, leave=False,
                delay=DELAY, disable=False)


def _truthy(value):
    return value is not None and value.strip().lower() not in ("", "0", "false", "no", "off")


def show_progress(quiet, stream, environ):
    """Whether a command shows bars: not `quiet`, neither NPSPEC_QUIET nor TQDM_DISABLE true in `environ`,
    and `stream` (stderr) a terminal."""
    if quiet or _truthy(environ.get(QUIET_ENV)) or _truthy(environ.get("TQDM_DISABLE")):
        return False
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False

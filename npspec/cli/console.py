"""The commands' streams. Every command takes `out` and `err` in its `main(argv, out=None, err=None)` and passes them
down; nothing replaces sys.stdout or sys.stderr.

A closed stderr becomes os.devnull (error_stream): messages are dropped, never printed to stdout; a write that
fails (`2>/dev/full`) drops the rest too (DroppingStream), so stderr never changes a command's exit status.
Parser writes help and version to `out`, a usage error to `err` as one line, and lets a failed write raise.
parse and parsed give (args, None) or (None, the exit status); streams and parsed open every main alike.
integer and number read every number the commands take: Python's int() and float() syntax, ASCII only.
terminate_as_interrupt raises SIGTERM as Terminated (a KeyboardInterrupt), so cleanup runs as for Ctrl-C.
notes_to(err, name) sends the "npspec" loggers' notes to `err` while a command runs, a line each: "npspec: ..."
for the library's, "NAME: note: ..." for the command's own (npspec.cli's loggers).
Imports the standard library only.
"""

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading


def error_stream(err):
    """`err` as a DroppingStream, to os.devnull if it is None (stderr closed): never stdout (module docstring)."""
    if isinstance(err, DroppingStream):
        return err
    return DroppingStream(err if err is not None else open(os.devnull, "w", encoding="utf-8"))


class DroppingStream:
    """A text stream for messages: writes and flushes go to `stream` until one raises OSError (a full disk, a closed
    descriptor, a reader gone), and after that to os.devnull. Everything else (isatty, fileno...) is `stream`'s."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        try:
            return self.stream.write(text)
        except OSError:
            self.dropped()
            return len(text)

    def flush(self):
        try:
            self.stream.flush()
        except OSError:
            self.dropped()

    def dropped(self):
        """Send the rest to os.devnull."""
        self.stream = open(os.devnull, "w", encoding="utf-8")

    def __getattr__(self, name):
        return getattr(self.stream, name)


def integer(text):  # str -> int
    """int(text) for ASCII text only (`4`, `-1`, ` 12 `; int() alone reads `٣` and `１２`): an integer option's
    argparse type and NPSPEC_NUM_THREADS's parser. Raises ValueError (argparse: `invalid integer value: '٣'`)."""
    if not text.isascii():
        raise ValueError(f"{text!r} is not written in ASCII")
    return int(text)


def number(text):  # str -> float
    """float(text) for ASCII text only (`0.8`, `1e-3`, `inf`; not `٠.٥`), else ValueError: a real option's type."""
    if not text.isascii():
        raise ValueError(f"{text!r} is not written in ASCII")
    return float(text)


TO_ERR = object()  # Parser's own name for "the command's stderr"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser writing help and version to `out`, usage errors to `err` (default: sys.stdout, sys.stderr
    when written), each write flushed; a failed one (a closed stdout too) raises OSError."""

    def __init__(self, *args, out=None, err=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.out, self.err = out, err

    def error(self, message):  # one line on the command's stderr, status 2 (argparse's own also prints the usage,
        # and would print it to STDOUT when stderr is closed)
        self.exit(2, f"{self.prog}: error: {message}; `{self.prog} --help` lists the options\n")

    def exit(self, status=0, message=None):
        if message:
            self._print_message(message, TO_ERR)
        sys.exit(status)

    def _print_message(self, message, file=None):  # argparse's one writer (help, version, usage, errors)
        if not message:
            return
        to_stdout = file is not TO_ERR and file is sys.stdout  # help and version; None: a closed stream
        stream = (self.out if self.out is not None else sys.stdout) if to_stdout else \
            error_stream(self.err if self.err is not None else sys.stderr)
        if stream is None:
            raise OSError("stdout is closed")
        stream.write(message)
        stream.flush()


def parse(parser, argv, err, name):
    """(parser.parse_args(argv), None), or (None, status): 0 after --help or --version, 2 after a usage error, 1
    with one line on `err` naming `name` when stdout cannot take the help."""
    try:
        return parser.parse_args(argv), None
    except SystemExit as e:
        return None, e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except OSError as e:
        print(f"{name}: error: cannot write to stdout ({e.strerror or e}); check where stdout goes", file=err)
        return None, 1


def streams(out, err):  # -> (out, err)
    """A command's streams: `out`, else sys.stdout; `err`, else sys.stderr, through error_stream (read when called)."""
    return (sys.stdout if out is None else out), error_stream(sys.stderr if err is None else err)


def parsed(build, argv, err, name):  # -> (args, None) or (None, status)
    """parse(build(), argv, err, name), or (None, 130) with `{name}: interrupted` on `err` after Ctrl-C."""
    try:
        return parse(build(), argv, err, name)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=err)
        return None, 130


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the signal arrives as an interruption, so that the same cleanup runs as for Ctrl-C."""


@contextlib.contextmanager
def terminate_as_interrupt():
    """While the block runs, SIGTERM raises Terminated instead of killing the process (no-op off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class NoteHandler(logging.Handler):
    """Writes each record to the stream `err` as one flushed line: "NAME: note: MESSAGE" for npspec.cli's loggers (the
    command's own notes), "npspec: MESSAGE" for the library's. A failed write raises, as a print would."""

    def __init__(self, err, name):
        super().__init__()
        self.err, self.command = err, name

    def emit(self, record):
        message = record.getMessage()
        cli = record.name == "npspec.cli" or record.name.startswith("npspec.cli.")
        print(f"{self.command}: note: {message}" if cli else f"npspec: {message}", file=self.err, flush=True)


def notes_to(err, name):
    """While the block runs, the "npspec" logger's INFO records and above go to `err` (NoteHandler, naming the
    command `name`); its level and handlers are put back after."""
    return handled(NoteHandler(err, name))


@contextlib.contextmanager
def handled(handler):
    """While the block runs, `handler` gets the "npspec" logger's INFO records and above; level and handlers put back."""
    logger = logging.getLogger("npspec")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)

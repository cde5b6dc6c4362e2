"""A Ctrl-C while one of npspec's commands is still importing: one line and exit 130, not a traceback.

The imports (numpy, tokenizers, safetensors, npspec's modules) take about 0.4 s; a Ctrl-C in that time
used to print a traceback from deep inside an import. npspec/__init__.py calls
`exit_on_interrupt_while_starting` as its very first statement, and each command's main calls
`started()` before it does anything, which puts Python's handler (KeyboardInterrupt) back. Only
npspec's own commands are affected (is_command): a library user's Ctrl-C during `import npspec`
stays a KeyboardInterrupt. The interpreter's own start (site, runpy), before npspec's first line,
is out of reach. The other end: once a Ctrl-C has stopped a command and its last words are printed,
`exit_on_another_interrupt` makes a second Ctrl-C end the process at once with 130 and nothing more.
Imports the standard library only (the lightest modules: it runs first).
"""

import atexit
import os
import signal
import sys
import threading

COMMAND_MODULES = ("npspec.cli", "npspec.generate", "npspec.cli.generate", "npspec.cli.convert", "npspec.testing")  # what `python -m` may run


def _exit_while_starting(signum, frame):
    """SIGINT while a command imports: one line, exit 130 (nothing has been done that needs undoing)."""
    try:
        os.write(2, b"npspec: interrupted while starting\n")
    except OSError:  # stderr closed
        pass
    os._exit(130)


def is_command(orig_argv):
    """Whether the interpreter's original command line (sys.orig_argv) runs one of npspec's commands: the `npspec`
    console script, or `python -m` one of COMMAND_MODULES."""
    if not orig_argv:
        return False
    if "-m" in orig_argv[1:-1]:
        return orig_argv[orig_argv.index("-m", 1) + 1] in COMMAND_MODULES
    return any(os.path.splitext(os.path.basename(a))[0] == "npspec" for a in orig_argv[:2])


def exit_on_interrupt_while_starting(orig_argv):
    """Make a Ctrl-C that arrives while a command is still importing print one line and exit 130, as a Ctrl-C later
    does, instead of a traceback. Only for npspec's commands (is_command(orig_argv)) in the main thread. The
    command's main puts the usual handler back (`started`) before it does anything."""
    if is_command(orig_argv) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _exit_while_starting)


def started():
    """Put back Python's SIGINT handler (KeyboardInterrupt) if exit_on_interrupt_while_starting installed its own;
    every command's main calls it first."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is _exit_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _exit_interrupted(signum, frame):
    """Another SIGINT while an interrupted command exits: exit 130 at once (its last words are printed)."""
    os._exit(130)


def exit_on_another_interrupt():
    """Once a Ctrl-C (or SIGTERM) has stopped a command and its output and summary are printed, make another Ctrl-C
    end the process at once with status 130, printing nothing. Python would raise it wherever the exit is (freeing
    the models, the threads' shutdown), where it cannot propagate (`Exception ignored ... KeyboardInterrupt`). From
    the atexit callbacks on it is ignored: the interpreter then puts SIGINT's default action back, which would kill
    the process by the signal, and what is left (flushing, freeing) never waits. Only for npspec's commands
    (is_command(sys.orig_argv)) in the main thread: a library user's Ctrl-C stays theirs."""
    if is_command(sys.orig_argv) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _exit_interrupted)
        atexit.register(signal.signal, signal.SIGINT, signal.SIG_IGN)

"""A Ctrl-C while one of npspec's commands is still importing: one line and exit 130, not a traceback.

npspec/__init__.py calls exit_on_interrupt_while_starting first; each command's main calls started(), which puts
Python's handler back and raises again a Ctrl-C that C code swallowed (unraisable_hook). exit_on_another_interrupt
makes a second Ctrl-C, once an interrupted command's last words are printed, end it at once with 130. Only npspec's
own commands are affected (is_command): a library user's Ctrl-C stays a KeyboardInterrupt. Imports the standard
library only (it runs first).
"""

import _thread
import atexit
import os
import signal
import sys
import threading

COMMAND_MODULES = ("npspec.cli", "npspec.generate", "npspec.cli.generate", "npspec.cli.convert", "npspec.testing")  # what `python -m` may run


def _exit_while_starting(signum, frame):
    """SIGINT or SIGTERM while a command imports: one line, exit 130 (nothing has been done that needs undoing)."""
    try:
        os.write(2, b"npspec: interrupted while starting\n")
    except OSError:  # stderr closed
        pass
    os._exit(130)


def is_command(orig_argv):
    """Whether sys.orig_argv runs one of npspec's commands: the `npspec` script, or -m one of COMMAND_MODULES."""
    if not orig_argv:
        return False
    if "-m" in orig_argv[1:-1]:
        return orig_argv[orig_argv.index("-m", 1) + 1] in COMMAND_MODULES
    return any(os.path.splitext(os.path.basename(a))[0] == "npspec" for a in orig_argv[:2])


def exit_on_interrupt_while_starting(orig_argv):
    """While a command imports (is_command(orig_argv), main thread), a Ctrl-C or SIGTERM prints one line and exits
    130, as either does later on."""
    if is_command(orig_argv) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _exit_while_starting)
        signal.signal(signal.SIGTERM, _exit_while_starting)


def started():
    """Put Python's SIGINT and SIGTERM handlers back if exit_on_interrupt_while_starting set its own, and for a
    command install unraisable_hook; every main calls it first."""
    if threading.current_thread() is threading.main_thread():
        for signum, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
            if signal.getsignal(signum) is _exit_while_starting:
                signal.signal(signum, default)
        if is_command(sys.orig_argv):
            sys.unraisablehook = unraisable_hook


def unraisable_hook(unraisable, interrupt=None, fallback=None):
    """A command's sys.unraisablehook: a KeyboardInterrupt swallowed where it was raised (numba's compile callbacks)
    is raised again by `interrupt` (default interrupt_soon); anything else goes to `fallback`
    (default sys.__unraisablehook__)."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        (interrupt or interrupt_soon)()
    else:
        (fallback or sys.__unraisablehook__)(unraisable)


def interrupt_soon(seconds=0.01):
    """A Ctrl-C for the main thread from another thread `seconds` later: after the hook that calls it has returned
    (raised inside the hook, it would be swallowed again); swallowed again, it comes back through the hook."""
    timer = threading.Timer(seconds, _thread.interrupt_main)
    timer.daemon = True
    timer.start()


def _ignore_unraisable(unraisable):  # an interrupted command exits: its half-built objects' destructors may fail
    pass


def _exit_interrupted(signum, frame):
    """Another SIGINT while an interrupted command exits: exit 130 at once (its last words are printed)."""
    os._exit(130)


def exit_on_another_interrupt():
    """Once Ctrl-C or SIGTERM stopped a command and its last words are printed, another Ctrl-C exits 130 at once
    (Python would raise it where it cannot propagate: freeing models, threads' shutdown); from the atexit callbacks
    on it is ignored, and so are destructors' errors. Only for npspec's commands, in the main thread."""
    if exit_on_a_late_interrupt():
        sys.unraisablehook = _ignore_unraisable


def exit_on_a_late_interrupt():  # -> bool: whether it applies (an npspec command's main thread)
    """Once a command's output and summary are printed, a Ctrl-C while the process ends (freeing models, threads'
    shutdown) exits 130 at once instead of killing it by the signal; from the atexit callbacks on it is ignored."""
    if not (is_command(sys.orig_argv) and threading.current_thread() is threading.main_thread()):
        return False
    signal.signal(signal.SIGINT, _exit_interrupted)
    # from the atexit callbacks on, the interpreter's default action would kill the process by the signal
    atexit.register(signal.signal, signal.SIGINT, signal.SIG_IGN)
    return True

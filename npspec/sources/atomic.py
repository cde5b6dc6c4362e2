"""Crash-safe file system work, whatever the files hold: atomic writes, locks, atomic directory swaps.

One mechanism for every file npspec writes (converted models, the conversion cache, --html pages,
the kit's vectors, bench results):
  * `atomic_write(path, write)`: the content is written to a temporary file beside `path` and renamed
    onto it, so a reader sees the old file or the new one, never half of one. Only a regular file is
    ever replaced: a symlink, a directory, a FIFO or a device at `path` is refused (NotRegularFile)
    rather than replaced by a file (running as root, `--force /dev/null` used to make /dev/null a
    regular file) or written through (a symlink's target is not what the user named).
  * `locked(lock_file)`: an exclusive lock held while a block runs, filelock's (an OS lock on Unix and
    Windows, released by the OS when its holder dies, even by SIGKILL); the lock file is removed when
    released. The conversion cache (npspec.sources.cache) uses the same.
  * `remove_leftovers(path)`: under the lock every writer of `path` holds, the temporary files of an
    atomic_write that a SIGKILL stopped are deleted (no handler runs for it).
  * `exchange(a, b)`: swap two directories in one step (Linux renameat2 RENAME_EXCHANGE), so that a
    reader of `b` always finds a complete directory; where the OS lacks it, two renames.
  * `public_mode(path)`: give a directory made by mkdtemp (mode 0700) the mode the umask gives a new one.
  * `kind(path)` and `described(path)`: what a path is (a symlink: where it leads), for checks and messages.
  * `expand(path, what)`: `~` and `~user` expanded, or a one-line ValueError naming the path;
    `resolved(path, what)`: its symlinks followed, or a one-line ValueError naming the link that loops.
Imports filelock and the standard library only.
"""

import contextlib
import ctypes
import errno
import glob
import os
import re
import stat
import tempfile
from pathlib import Path

from filelock import FileLock, Timeout


class NotRegularFile(OSError):
    """A path to be replaced exists and is not a regular file (a symlink, directory, FIFO or device)."""


def kind(path):
    """What `path` is, without following a symlink: "missing", "file", "symlink", "directory", "FIFO",
    "device", "socket" or "special file". Raises OSError (ENAMETOOLONG, EACCES...) from lstat."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except NotADirectoryError:
        return "missing"
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISLNK, "symlink"), (stat.S_ISDIR, "directory"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "device"), (stat.S_ISBLK, "device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def described(path):
    """What `path` is, for a message: "a regular file", "missing", "a FIFO", "a directory", "a device", ..., and for a
    symlink where it leads: "a symlink loop", "a dangling symlink (to x)", "a symlink to a device (/dev/zero)"."""
    what = kind(path)
    if what == "missing":
        return what
    if what != "symlink":
        return "a regular file" if what == "file" else f"a {what}"
    to = os.readlink(path)
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return "a symlink loop" if e.errno == errno.ELOOP else f"a dangling symlink (to {to})"
    for test, name in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISCHR, "device"), (stat.S_ISBLK, "device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return f"a symlink to a {name} ({to})"
    return f"a symlink to a special file ({to})"


def replace_problem(path):
    """A one-line reason why `path` may not be replaced by a new file (it is not a regular file), or None.
    Raises OSError from lstat (a name too long, no permission to look)."""
    what = kind(path)
    if what in ("missing", "file"):
        return None
    return (f"{path} is a {what}, not a regular file; npspec replaces only a regular file: "
            "name a new file or an existing regular one")


def umask():
    """The process's umask (read by setting and restoring it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path, write):
    """Call `write(tmp_path)`, then rename the temporary file onto `path` (same directory), mode 0666 & ~umask.

    path may be missing or a regular file; anything else (a symlink included) raises NotRegularFile,
    checked before writing and again just before the rename. Raises OSError from the writes; the
    temporary file is then removed and `path` is as it was.
    """
    path = Path(path)
    if problem := replace_problem(path):
        raise NotRegularFile(problem)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp creates 0600; the result is an ordinary file
        if problem := replace_problem(path):  # something else took the name meanwhile
            raise NotRegularFile(problem)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def remove_leftovers(path):
    """Delete the temporary files that atomic_write(`path`) left behind when its process was killed before it could
    clean up (SIGKILL, a power cut): the regular files beside `path` named as its mkstemp names them, `.NAME.` then 8
    of tempfile's random characters then `.tmp` (a user's `.NAME.backup.tmp` stays). Call it only while holding the
    lock that every writer of `path` holds, so that no write is in progress. Returns how many were deleted."""
    path = Path(path)
    removed = 0
    ours = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp")
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        if ours.fullmatch(tmp.name) and tmp.is_file() and not tmp.is_symlink():
            tmp.unlink(missing_ok=True)
            removed += 1
    return removed


def public_mode(path):
    """Give the directory `path` (made by mkdtemp: 0700) the mode a new directory gets from the umask."""
    os.chmod(path, 0o777 & ~umask())


@contextlib.contextmanager
def locked(lock_file, blocking=True, timeout=-1):
    """Hold an exclusive filelock on the file `lock_file` (created if missing, and left in place when released:
    filelock's Unix lock never deletes its file, so a process waiting on it never holds a lock on a deleted file
    while a third locks a new one).

    Yields True when held; False when `blocking` is False and another process (or another lock object
    in this one) holds it. timeout: seconds to wait when blocking (-1: forever); filelock.Timeout is
    raised past it. Raises OSError if the lock file cannot be created.
    """
    lock = FileLock(lock_file)
    try:
        lock.acquire(timeout=timeout if blocking else 0)
    except Timeout:
        if blocking:
            raise
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


RENAME_EXCHANGE = 2  # linux/fs.h
AT_FDCWD = -100


def _renameat2():
    try:
        return ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # not glibc 2.28+ / not Linux
        return None


def exchange(a, b):
    """Swap the existing directories `a` and `b` atomically: afterwards `b` holds what `a` held and `a` what `b` did.

    Linux's renameat2(RENAME_EXCHANGE): no moment exists at which `b` is missing, so a process opening
    a file inside `b` meanwhile opens the old one or the new one. Where the OS or file system lacks it,
    two renames through a temporary name beside `b` (a reader may then find `b` missing for that
    instant). Returns True if the swap was atomic. Raises OSError; both are then as they were.
    """
    call = _renameat2()
    if call is not None:
        if call(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
            return True
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(code, os.strerror(code), str(b))
    b = Path(b)
    aside = Path(tempfile.mkdtemp(prefix=f".{b.name}.", suffix=".old", dir=b.parent))
    os.rename(b, aside)  # onto the empty directory mkdtemp made
    try:
        os.rename(a, b)
    except BaseException:
        os.rename(aside, b)
        raise
    os.rename(aside, a)
    return False


def expand(path, what):
    """`path` (a str or Path) with `~` / `~user` expanded, as a Path. Raises ValueError naming `what` and the path
    when the home directory is unknown (`~nouser/x`)."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise ValueError(f"{what} {str(path)!r}: cannot expand {str(path).split('/')[0]} (no such user or "
                         "home directory); give the full path") from None


def resolved(path, what):
    """`path` made absolute with every symlink followed (Path.resolve; `~` is not expanded: see expand), as a Path.

    Raises ValueError, one line naming `what`, the path and the link, when a symlink on it loops (Path.resolve
    raises RuntimeError "Symlink loop" for it before Python 3.13, and returns a path that cannot be opened after).
    """
    try:
        out = Path(path).resolve()
    except RuntimeError:
        out = None
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        out = None
    link = looping_link(path)
    if out is None or link is not None:
        raise ValueError(f"{what} {str(path)!r}: {link or path} is a symlink loop (following its links never "
                         "ends); fix or remove that link, or give another path")
    return out


def looping_link(path):
    """The first component of `path` (made absolute) whose links loop (os.stat fails with ELOOP), else None."""
    path = Path(os.path.abspath(path))
    for prefix in [*reversed(path.parents), path]:
        try:
            os.stat(prefix)
        except OSError as e:
            return prefix if e.errno == errno.ELOOP else None
    return None

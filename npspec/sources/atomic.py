"""Crash-safe file system work for every file npspec writes: `atomic_write` (a temporary file renamed onto the
path, which must be missing or a regular file: NotRegularFile otherwise), `locked` (filelock's exclusive lock, which
the OS releases when its holder dies), `remove_leftovers` (a killed atomic_write's temporary files), `exchange` (two
directories swapped in one step where Linux can), `public_mode`, `kind` and `described` (what a path is, for
messages), `expand` (`~user`) and `resolved` (symlinks followed, or one line naming the link that loops). Imports
filelock and the standard library only.
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
    """What `path` is, without following a symlink: "missing", "file", "symlink", "directory", "FIFO", "device",
    "socket" or "special file". Raises OSError from lstat."""
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
    """Why `path` may not be replaced by a new file (not a regular file), one line, or None. Raises
    OSError from lstat."""
    what = kind(path)
    if what in ("missing", "file"):
        return None
    return (f"{path} is a {what}, not a regular file; npspec replaces only a regular file: "
            "name a new file or an existing regular one")


def umask():  # the process's umask (set and restored)
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path, write):
    """write(tmp) beside `path`, then rename it onto `path`, mode 0666 & ~umask. Raises NotRegularFile for
    anything but a missing or regular `path` (checked before and just before the rename), OSError from the writes (the
    temporary file removed, `path` as it was)."""
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
    """Delete the temporary files a killed atomic_write(`path`) left (`.NAME.` + 8 of mkstemp's
    characters + `.tmp`, regular files only), under the lock every writer of `path` holds. Returns how many."""
    path = Path(path)
    removed = 0
    ours = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp")
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        if ours.fullmatch(tmp.name) and tmp.is_file() and not tmp.is_symlink():
            tmp.unlink(missing_ok=True)
            removed += 1
    return removed


def public_mode(path):  # a mkdtemp directory (0700) given the mode the umask gives a new one
    os.chmod(path, 0o777 & ~umask())


@contextlib.contextmanager
def locked(lock_file, blocking=True, timeout=-1):
    """Hold filelock's exclusive lock on `lock_file` (created, left in place after). Yields True when held, False
    when not `blocking` and another holds it; raises filelock.Timeout past `timeout` seconds (-1: forever), OSError if
    the lock file cannot be created."""
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
    """Swap the directories `a` and `b` (Linux renameat2 RENAME_EXCHANGE: `b` never missing; elsewhere two
    renames). Returns whether it was atomic. Raises OSError, both left as they were."""
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
    """`path` with `~` / `~user` expanded, a Path. Raises ValueError naming `what` for an unknown home."""
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

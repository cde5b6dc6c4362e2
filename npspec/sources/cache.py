"""The conversion cache: Hugging Face checkpoints (hub or local) and `random:` models, converted once.

npspec runs only its converted layout (npspec.sources.files). A Hugging Face checkpoint (from the
hub, or a local directory) is converted, and a `random:` model built, once into the cache directory,
and later runs load the conversion:

    $NPSPEC_CACHE (else $XDG_CACHE_HOME/npspec, else ~/.cache/npspec)
        hub/<org>--<name>/<commit>/          a hub checkpoint, keyed by the hub commit it came from
        local/<dir name>-<fingerprint>/      a local Hugging Face directory, keyed by its path and
                                             the sizes and mtimes of its files
        random/<shape>-seed<seed>-<config>/  a `random:` model (config: a hash of its shape)
        choices.json                         the kernel each role decodes with, measured per machine (npspec.sources.choices)
        .locks/                              one lock file per entry (and one for choices.json)

Each entry is built in a hidden staging directory beside it and renamed into place, complete,
under a lock (filelock, a huggingface_hub requirement: an OS lock on Unix and Windows, which
the OS releases when its holder dies): a killed conversion leaves no half-written model, and
two processes converting the same model at once convert it once (the second waits, says so,
and gives up with the lock file's name after LOCK_TIMEOUT). The rename alone would keep the
cache whole without the lock (a process that loses the race discards its copy).

Downloads use huggingface_hub (its cache, HF_HUB_CACHE / HF_HOME, its progress bars and
HF_HUB_OFFLINE), fetching only `config.json`, `model.safetensors` and `tokenizer.json`.
Imports npspec.sources.files, npspec.sources.huggingface, npspec.sources.init and the registry and shipped files of
npspec.sources; huggingface_hub, filelock. The locks are npspec.sources.atomic's (filelock), as for every
file npspec writes. Nothing here prints: notes for the user (a conversion starting, a wait for
another process) go to the `note` callback the caller passes (the commands print them on stderr).
"""

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from filelock import Timeout
from huggingface_hub import constants

from .atomic import locked, public_mode
from .errors import CheckpointError, oneline
from .files import save_converted
from .huggingface import convert_into, read_source
from .init import iter_tensors
from .names import SHAPES
from .shipped import gpt2_tokenizer_json

log = logging.getLogger(__name__)

CACHE_ENV = "NPSPEC_CACHE"
HUB_FILES = ["config.json", "model.safetensors", "tokenizer.json"]
RANDOM_SEED = 0
LOCK_TIMEOUT = 3600.0  # seconds a run waits for another converting the same model (gpt2-xl converts in minutes)


def cache_dir():
    """npspec's cache directory: $NPSPEC_CACHE, else $XDG_CACHE_HOME/npspec, else ~/.cache/npspec (not created)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path("~/.cache").expanduser()
    return Path(base) / "npspec"


@contextmanager
def _lock(path, timeout, what):
    """Hold the cache entry's lock file `path` (npspec.sources.atomic.locked: filelock, which the OS releases if the holder
    dies).

    If another process holds it, say so through `note` and wait up to `timeout` seconds. Raises
    CheckpointError naming the lock file if it is still held then.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as hold:
        if not hold.enter_context(locked(path, blocking=False)):
            log.info(f"another process is building {what}: waiting for it (lock file {path}, up to {timeout:g} s)")
            try:
                hold.enter_context(locked(path, timeout=timeout))
            except Timeout:
                raise CheckpointError(f"another process still holds the lock file {path} after {timeout:g} s; "
                                      "let it finish converting or stop it (if none is running, delete the lock "
                                      "file), and run again") from None
        yield


def _entry_of(partial):
    """The cache entry a staging directory `.NAME.<random>.partial` was building (a Path beside it)."""
    return partial.parent / partial.name[1:-len(".partial")].rsplit(".", 1)[0]


def clean_stale(root):
    """Delete the staging directories (`.NAME.*.partial`) that killed builds left anywhere in the cache `root`.

    Each is deleted under its entry's lock, taken without waiting: a staging directory whose entry is
    locked belongs to a live build and is left alone. Called at every cache use (cached), so a
    SIGKILLed build's leftovers go at the next run, not only when the same entry is rebuilt. Raises
    nothing (a cache that cannot be written is reported by the build that needs it).
    """
    root = Path(root)
    for partial in [*root.glob("*/.*.partial"), *root.glob("hub/*/.*.partial")]:
        try:
            with locked(lock_file(root, _entry_of(partial)), blocking=False) as free:
                if free:
                    shutil.rmtree(partial, ignore_errors=True)
        except OSError:
            return


def publish(staging, final):
    """Rename the complete directory `staging` to `final`; if another process published `final` first, keep
    theirs and delete `staging`. Returns True if this call published it."""
    try:
        os.rename(staging, final)
        return True
    except OSError:
        if not (final / "model.safetensors").is_file():
            raise
        shutil.rmtree(staging, ignore_errors=True)
        return False


def lock_file(root, final):
    """The lock file of the cache entry `final` inside the cache `root`: `.locks/<its path, parts joined by -->.lock`."""
    return Path(root) / ".locks" / f"{'--'.join(Path(final).relative_to(root).parts)}.lock"


def entry_lock(root, final, lock_timeout=LOCK_TIMEOUT):
    """A context manager holding the cache entry's lock (the one `cached` builds it under), taken when entered:
    what files.load_model holds while it rewrites the entry's format-1 file as format 2. Entering raises OSError
    for a cache that cannot be written and CheckpointError for a lock still held after lock_timeout."""
    return _lock(lock_file(root, final), lock_timeout, f"{final} (rewriting it as format 2)")


def cached(root, final, build, what, lock_timeout=LOCK_TIMEOUT):
    """Return the cache entry `final` (inside the cache `root`), building it first with `build(staging_dir)`
    if it is not there.

    build writes a converted model into the (empty, existing) staging directory it is given.
    what: a description for the one-line note said when building. lock_timeout: seconds to
    wait while another process builds the same entry. note: None (say nothing), or called with
    one line for the user (building, waiting for another process); the commands print it on
    stderr. Staging directories that killed builds left anywhere in the cache are deleted first
    (clean_stale); the entry is given the umask's mode (not mkdtemp's 0700). Raises
    CheckpointError (from build, for a cache that cannot be written, or a lock still held after
    lock_timeout); the cache is then left as it was.
    """
    root, final = Path(root), Path(final)
    clean_stale(root)
    if final.is_dir():
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        lock = lock_file(root, final)
        with _lock(lock, lock_timeout, what):
            if final.is_dir():  # another process built it while we waited
                return final
            staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
            try:
                public_mode(staging)
                log.info(f"converting {what} into {final} (once; later runs reuse it)")
                build(staging)
                publish(staging, final)
            except BaseException:
                lock.unlink(missing_ok=True)  # a failed conversion leaves no lock file (a racing run at worst converts twice)
                raise
            finally:
                if staging.exists():
                    shutil.rmtree(staging, ignore_errors=True)
    except OSError as e:
        raise CheckpointError(f"cannot write npspec's cache {root} ({oneline(e)}); "
                              f"set {CACHE_ENV} to a writable directory") from e
    return final


def fallback_tokenizer_json(src):
    """The tokenizer text convert gets for the Hugging Face directory `src`: None if it has its own
    tokenizer.json, else GPT-2's."""
    return None if (Path(src) / "tokenizer.json").is_file() else gpt2_tokenizer_json()


def check_hf(src):
    """Check a Hugging Face directory before converting it (huggingface.read_source, with the fallback
    tokenizer), so config-level problems come before the "converting" note. Raises CheckpointError."""
    read_source(src, fallback_tokenizer_json(src))


def convert_hf(src, out_dir, source, source_sha256=None, progress=None):
    """Convert the Hugging Face directory `src` into the staging directory `out_dir` (huggingface.convert_into
    checks it), with `progress` bars (npspec.sources.progress; None shows nothing). Raises CheckpointError."""
    return convert_into(src, out_dir, source=source, tokenizer_json=fallback_tokenizer_json(src),
                        source_sha256=source_sha256, progress=progress)


def from_local(src, root, progress=None):
    """A local Hugging Face checkpoint directory, converted into the cache on first use (with `progress` bars,
    npspec.sources.progress; None shows nothing). Returns the entry's path."""
    src = Path(src).resolve()
    stats = [[name, (src / name).stat().st_size, (src / name).stat().st_mtime_ns]
             for name in HUB_FILES if (src / name).is_file()]
    key = hashlib.sha256(json.dumps([str(src), stats]).encode()).hexdigest()[:16]
    final = root / "local" / f"{src.name}-{key}"
    if not final.is_dir():
        check_hf(src)  # config-level problems before the "converting" note
    return cached(root, final, lambda out: convert_hf(src, out, source=str(src), progress=progress), str(src))


def random_key(shape, seed):
    """The cache entry name of `random:<shape>` with `seed`: changes whenever the shape's config does."""
    digest = hashlib.sha256(repr(SHAPES[shape]).encode()).hexdigest()[:8]
    return f"{shape}-seed{seed}-{digest}"


def from_random(shape, root, seed=RANDOM_SEED, progress=None):
    """`random:<shape>`: GPT-2's initialisation with `seed` (npspec.sources.init), saved into the cache in npspec's
    layout with GPT-2's tokenizer (source_sha256 null: there is no source file).

    Returns the entry's path. Each tensor is written as soon as it is drawn (init.iter_tensors, which draws
    the next one meanwhile): peak memory while building is a few tensors (gpt2-large: under 1 GB).
    progress: a bar factory (npspec.sources.progress) for the long steps; None shows nothing.
    Raises CheckpointError for an unknown shape.
    """
    if shape not in SHAPES:
        raise CheckpointError(f"unknown random shape {shape!r}; use one of: "
                              + ", ".join(f"random:{s}" for s in SHAPES))
    config = SHAPES[shape]
    final = root / "random" / random_key(shape, seed)

    def build(out):  # the generator's numbers are the cost; writing overlaps them; nothing is read or hashed
        save_converted(out, iter_tensors(config, seed, progress), config, source=f"random:{shape} (npspec.sources.init, "
                       f"seed {seed})", source_sha256=None, tokenizer_json=gpt2_tokenizer_json())

    return cached(root, final, build, f"random:{shape} (seed {seed})")


def _offline():
    return bool(constants.HF_HUB_OFFLINE)


def _unreachable(spec, repo_id, why):
    reason = "HF_HUB_OFFLINE is set" if _offline() else "the hub cannot be reached"
    name = spec if spec == repo_id else f"{spec} ({repo_id})"
    return CheckpointError(
        f"{name} {why} and {reason}; on a connected machine run "
        f"`hf download {repo_id} {' '.join(HUB_FILES)}` and copy its Hugging Face cache here "
        f"(or point HF_HUB_CACHE at it; now {constants.HF_HUB_CACHE})")


def _newest_conversion(entry_dir):
    done = [d for d in entry_dir.glob("*") if (d / "model.safetensors").is_file() and not d.name.startswith(".")]
    return max(done, key=lambda d: d.stat().st_mtime) if done else None


def from_hub(repo_id, root, spec=None, progress=None):
    """A hub checkpoint: download (or find in the Hugging Face cache) and convert once. Returns the entry's path.

    progress: a bar factory (npspec.sources.progress) for the conversion; None shows nothing (huggingface_hub
    shows its own download bars, following its HF_HUB_DISABLE_PROGRESS_BARS).
    Raises CheckpointError: no network and nothing cached (saying what to run on a connected
    machine), no such repository, no model.safetensors in it, or a download failure.
    """
    # huggingface_hub's download code (and the HTTP stack under it) takes half a second to import:
    # only a hub name pays for it, not every start of the CLI
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError)

    spec = spec or repo_id
    entry_dir = root / "hub" / repo_id.replace("/", "--")
    try:
        snapshot = Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except LocalEntryNotFoundError as e:  # offline or unreachable, and not in the Hugging Face cache
        if (done := _newest_conversion(entry_dir)) is not None:
            return done  # converted earlier; the Hugging Face cache has since been cleared
        raise _unreachable(spec, repo_id, "is not in the local Hugging Face cache") from e
    except GatedRepoError as e:
        raise CheckpointError(f"{spec}: the hub repository {repo_id} is gated; accept its terms on "
                              f"huggingface.co/{repo_id} and log in with `hf auth login`") from e
    except RepositoryNotFoundError as e:
        raise CheckpointError(f"unknown model {spec!r}: the hub has no repository {repo_id} (a private one "
                              "needs `hf auth login`); check the name") from e
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise CheckpointError(f"could not download {repo_id} from the Hugging Face hub ({oneline(e)}); "
                              "check the connection and try again") from e
    weights = snapshot / "model.safetensors"
    if not weights.is_file():
        if _offline():
            raise _unreachable(spec, repo_id, f"has no model.safetensors in the local Hugging Face cache "
                                              f"(revision {snapshot.name[:12]})")
        raise CheckpointError(f"{spec}: the hub repository {repo_id} has no model.safetensors (npspec never "
                              "loads pickle files); pick a repository that has one")
    blob = weights.resolve()  # the hub cache names large blobs by their sha256
    sha = blob.name if blob.parent.name == "blobs" and re.fullmatch(r"[0-9a-f]{64}", blob.name) else None
    final = entry_dir / snapshot.name
    if not final.is_dir():
        check_hf(snapshot)
    return cached(root, final, lambda out: convert_hf(snapshot, out, source=f"hf://{repo_id}@{snapshot.name}",
                                                source_sha256=sha, progress=progress),
                  f"{repo_id} (revision {snapshot.name[:12]})")

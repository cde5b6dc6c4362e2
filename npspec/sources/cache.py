"""The conversion cache: Hugging Face checkpoints (hub or local) and `random:` models, converted once.

    $NPSPEC_CACHE (else $XDG_CACHE_HOME/npspec, else ~/.cache/npspec)
        hub/<org>--<name>/<commit>/          a hub checkpoint, by the hub commit it came from
        local/<dir name>-<fingerprint>/      a local checkpoint, by its path and its files' sizes and mtimes
        random/<shape>-seed<seed>-<config>/  a `random:` model (config: a hash of its shape)
        choices.json                         the kernel probe's records (npspec.sources.choices)
        .locks/                              one lock file per entry (and for choices.json)
Each entry is built in a hidden staging directory beside it and renamed into place, complete, under its lock
(npspec.sources.atomic.locked): a killed conversion leaves no half-written model, and two processes converting the
same model convert it once (the second waits, says so, gives up after LOCK_TIMEOUT). Downloads use huggingface_hub
(its cache, HF_HUB_OFFLINE; only config.json, model.safetensors, tokenizer.json). Notes go to the
"npspec.sources.cache" logger. Imports npspec.sources' files, huggingface, init, names, shipped; huggingface_hub.
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
    """Hold the entry's lock file `path`, saying so first if another holds it, waiting up to `timeout` s. Raises
    CheckpointError naming the lock file if it is still held then."""
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


def _entry_of(partial):  # `.NAME.<random>.partial` -> the entry NAME beside it
    return partial.parent / partial.name[1:-len(".partial")].rsplit(".", 1)[0]


def clean_stale(root):
    """Delete the staging directories (`.NAME.*.partial`) killed builds left in the cache `root`, each under
    its entry's lock taken without waiting (a live build's is left alone). Raises nothing."""
    root = Path(root)
    for partial in [*root.glob("*/.*.partial"), *root.glob("hub/*/.*.partial")]:
        try:
            with locked(lock_file(root, _entry_of(partial)), blocking=False) as free:
                if free:
                    shutil.rmtree(partial, ignore_errors=True)
        except OSError:
            return


def publish(staging, final):
    """Rename the complete `staging` to `final`, or keep another process's `final` and delete `staging`.
    Returns whether this call published it."""
    try:
        os.rename(staging, final)
        return True
    except OSError:
        if not (final / "model.safetensors").is_file():
            raise
        shutil.rmtree(staging, ignore_errors=True)
        return False


def lock_file(root, final):  # -> root/.locks/<final's parts under root, joined by -->.lock
    return Path(root) / ".locks" / f"{'--'.join(Path(final).relative_to(root).parts)}.lock"


def entry_lock(root, final, lock_timeout=LOCK_TIMEOUT):
    """The entry's lock as a context manager (taken on entering): what files.load_model holds while it
    rewrites an entry's format-1 file. Entering raises OSError or CheckpointError as `_lock`."""
    return _lock(lock_file(root, final), lock_timeout, f"{final} (rewriting it as format 2)")


def cached(root, final, build, what, lock_timeout=LOCK_TIMEOUT):
    """The cache entry `final` in `root`, first built by build(staging directory) if missing: stale staging
    directories deleted, then under its lock (waiting up to lock_timeout s), a note naming `what`, the entry published
    with the umask's mode. Raises CheckpointError (from build, for an unwritable cache, a lock still held); the cache
    is then left as it was."""
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
    """None if the Hugging Face directory `src` has its own tokenizer.json, else GPT-2's text."""
    return None if (Path(src) / "tokenizer.json").is_file() else gpt2_tokenizer_json()


def check_hf(src):
    """Check the Hugging Face directory `src` (huggingface.read_source) before the "converting" note. Raises
    CheckpointError."""
    read_source(src, fallback_tokenizer_json(src))


def convert_hf(src, out_dir, source, source_sha256=None, progress=None):
    """Convert the Hugging Face directory `src` into the staging `out_dir` (huggingface.convert_into). Raises
    CheckpointError."""
    return convert_into(src, out_dir, source=source, tokenizer_json=fallback_tokenizer_json(src),
                        source_sha256=source_sha256, progress=progress)


def from_local(src, root, progress=None):
    """The entry of a local Hugging Face checkpoint directory, converted on first use."""
    src = Path(src).resolve()
    stats = [[name, (src / name).stat().st_size, (src / name).stat().st_mtime_ns]
             for name in HUB_FILES if (src / name).is_file()]
    key = hashlib.sha256(json.dumps([str(src), stats]).encode()).hexdigest()[:16]
    final = root / "local" / f"{src.name}-{key}"
    if not final.is_dir():
        check_hf(src)  # config-level problems before the "converting" note
    return cached(root, final, lambda out: convert_hf(src, out, source=str(src), progress=progress), str(src))


def random_key(shape, seed):  # -> the entry name of random:<shape>; changes with the shape's config
    digest = hashlib.sha256(repr(SHAPES[shape]).encode()).hexdigest()[:8]
    return f"{shape}-seed{seed}-{digest}"


def from_random(shape, root, seed=RANDOM_SEED, progress=None):
    """The entry of `random:<shape>`: GPT-2's initialisation with `seed` (npspec.sources.init) written tensor by
    tensor as it is drawn (peak memory a few tensors), with GPT-2's tokenizer. Raises CheckpointError for an unknown
    shape."""
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
    """The entry of a hub checkpoint, downloaded (or found in the Hugging Face cache) and converted once. Raises
    CheckpointError with the fix: offline with nothing cached, no such or a gated repository, no model.safetensors,
    a failed download."""
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

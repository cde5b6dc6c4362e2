"""npspec's converted-model format: read it, write it atomically, say what is wrong with it (safetensors, never pickle).

A converted model is a directory of `model.safetensors` (float32 tensors with GPT-2's names without `transformer.`,
no LM head: it is tied to `wte`; header metadata, all strings: format_version, layout, n_vocab, n_ctx, n_embd,
n_head, n_layer, layer_norm_epsilon, eos_token_id, source, source_sha256) and `tokenizer.json` (Hugging Face
tokenizers). Format 2 (FORMAT_VERSION, layout LAYOUT) stores every tensor in the forward's memory layout, one
`readinto` each: a block matrix `w` `[d_in, d_out]` (model.tensors.BLOCK_MATRICES) is kept column-major, so the file
holds `w.T` `[d_out, d_in]` C-order; the rest row-major. Format 1 (no layout) stored block matrices row-major: it
loads with a relayout and is rewritten once as format 2 (load_model). A directory is written whole or not at all
(write_dir), each file atomically (npspec.sources.atomic). Notes go to the "npspec.sources.files" logger. Imports
npspec.sources' atomic, errors, progress; npspec.model; npspec.kernels.products; safetensors, tokenizers.
"""

import contextlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from tokenizers import Tokenizer

from .atomic import atomic_write, described, exchange, kind, locked, public_mode
from .errors import CheckpointError, capped, oneline
from ..model.gpt2 import GPT2Config
from ..kernels.layout import block_linears, column_major, fortran_copy
from ..model.model import Model
from ..kernels.registry import STATIC_DEFAULT
from .progress import bar
from ..model.tensors import check_tensors, flat_tensors, is_block_matrix, layer_count_problem, params_tree, tensor_shapes

log = logging.getLogger(__name__)

FORMAT_VERSION = "2"  # what save_converted writes
LAYOUT = "column-major-blocks"  # format 2's `layout`: block matrices stored transposed (module docstring)
READABLE_VERSIONS = ("1", "2")  # format 1 loads with a relayout and is rewritten as format 2
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"


def stored_shapes(config, version=FORMAT_VERSION):
    """{name: the shape a file of format `version` stores}: tensor_shapes, block matrices `[d_out, d_in]`
    in format 2."""
    return {name: tuple(reversed(shape)) if version != "1" and is_block_matrix(name) else shape
            for name, shape in tensor_shapes(config).items()}


def stored(name, a):  # [d_in, d_out] -> [d_out, d_in] for a block matrix, else the same shape; C-contiguous float32
    """The array whose C-order bytes format 2 holds for `name`: a block matrix's `w.T` (no copy when `w` is
    column-major), else `a`."""
    a = np.asarray(a, dtype=np.float32)
    return fortran_copy(a).T if is_block_matrix(name) else np.ascontiguousarray(a)


SAVED_FILES = {WEIGHTS_FILE, TOKENIZER_FILE}


def _leftover(name):  # what a killed atomic_write leaves inside a model directory
    return name.startswith(tuple(f".{f}." for f in SAVED_FILES)) and name.endswith(".tmp")


def out_dir_state(path):
    """What the output directory `path` holds: "missing", "empty", "npspec" (a converted model and a killed
    write's leftovers only) or "other". Raises nothing."""
    path = Path(path)
    if not os.path.lexists(path):
        return "missing"
    if not path.is_dir() or kind(path / WEIGHTS_FILE) not in ("missing", "file"):  # a FIFO would block the read
        return "other"
    try:
        names = {n for n in os.listdir(path) if not _leftover(n)}
    except OSError:
        return "other"
    if not names:
        return "empty"
    if not names <= SAVED_FILES or WEIGHTS_FILE not in names:
        return "other"
    try:
        with reading(path / WEIGHTS_FILE), safe_open(str(path / WEIGHTS_FILE), framework="numpy") as f:
            return "npspec" if (f.metadata() or {}).get("format_version") else "other"
    except CheckpointError:
        return "other"


def out_dir_problem(path, force):
    """Why converting into `path` would lose something (one line), or None: missing or empty may be
    written, an npspec model only with `force`, a symlink never (the rename would replace the link), nor anything else."""
    path = Path(path)
    if os.path.islink(path):
        return (f"OUT_DIR {path} is a symlink (to {os.readlink(path)}); npspec writes a real directory and never "
                "replaces a link: give the directory itself or a new path (nothing was written)")
    state = out_dir_state(path)
    if state == "missing":
        for parent in path.parents:
            if os.path.lexists(parent):
                if not parent.is_dir():
                    return f"cannot create {path}: {parent} is a file, not a directory; choose another OUT_DIR"
                return None
        return None
    if state == "other" and not path.is_dir():
        return f"OUT_DIR {path} is a file; give a directory (new or empty) to convert into"
    if state == "other":
        return (f"OUT_DIR {path} is not empty and is not (only) an npspec model; nothing was written: "
                "choose a new or empty directory")
    if state == "npspec" and not force:
        return f"OUT_DIR {path} already holds an npspec model; pass --force to replace it (nothing was written)"
    return None


def dir_lock(path):
    """The lock file `.NAME.lock` beside the model directory `path`: held by write_dir while it cleans up and
    renames, by rewrite_format_1 while it rewrites."""
    path = Path(path)
    return path.parent / f".{path.name}.lock"


def _lock_of(staging):  # a staging directory's own lock file, held while its run is alive
    return Path(f"{staging}.lock")


def _stale(parent, name):  # the staging (`.NAME.*.partial`) and set-aside (`.NAME.*.old`) directories of name
    return [parent / n for n in os.listdir(parent) if n.startswith(f".{name}.") and n.endswith((".partial", ".old"))]


def _clean_stale(parent, name, out):
    """Under the directory's lock: delete what killed runs left beside `out`, and put back a model a killed
    replacement had set aside."""
    for d in sorted(_stale(parent, name)):
        if d.suffix == ".old" and not os.path.lexists(out) and out_dir_state(d) == "npspec":
            os.rename(d, out)  # the replaced model, set aside when the run was killed: restore it
            continue
        with locked(_lock_of(d), blocking=False) as free:
            if free:
                shutil.rmtree(d, ignore_errors=True)
        if free:
            _lock_of(d).unlink(missing_ok=True)
    for n in os.listdir(parent):  # a staging lock whose directory is gone (its run was killed between the two)
        if n.startswith(f".{name}.") and n.endswith(".partial.lock") and not (parent / n[:-len(".lock")]).exists():
            with locked(parent / n, blocking=False) as free:
                pass
            if free:
                (parent / n).unlink(missing_ok=True)


def _publish(staging, out_dir, force):
    """Under the directory's lock: make the complete `staging` out_dir (a rename, or an exchange with what it
    replaces, then deleted)."""
    if os.path.islink(out_dir):  # made meanwhile: the rename would replace the link
        raise CheckpointError(out_dir_problem(out_dir, force))
    state = out_dir_state(out_dir)
    if state not in ("missing", "empty") and not (force and state == "npspec"):
        raise CheckpointError(
            f"another conversion into {out_dir} finished first; it was left as that run wrote it"
            + (" (pass --force to replace it)" if state == "npspec" else ""))
    if state == "missing":
        os.rename(staging, out_dir)
    else:
        exchange(staging, out_dir)


def write_dir(out_dir, write, force=False):
    """Make `out_dir` the directory write(staging) fills, whole or not at all: a staging directory beside it
    (umask's mode) renamed into place, or swapped with an npspec model there when `force` (atomic.exchange: a reader
    finds the old model or the new). Killed runs' leftovers are cleaned up by the next write under dir_lock. Raises
    CheckpointError (out_dir_problem, checked again at the rename) and OSError, out_dir then as it was; an interrupted
    write deletes its staging."""
    out_dir = Path(out_dir)
    if problem := out_dir_problem(out_dir, force):
        raise CheckpointError(problem)
    parent, name = out_dir.parent, out_dir.name
    parent.mkdir(parents=True, exist_ok=True)
    staging = None
    try:
        with contextlib.ExitStack() as hold:
            with locked(dir_lock(out_dir)):
                _clean_stale(parent, name, out_dir)
                if problem := out_dir_problem(out_dir, force):  # a model a killed replacement set aside may be back
                    raise CheckpointError(problem)
                staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=parent))
                hold.enter_context(locked(_lock_of(staging)))  # before the directory's lock is let go: never stale
            try:
                public_mode(staging)
                write(staging)
                with locked(dir_lock(out_dir)):
                    _publish(staging, out_dir, force)
                return out_dir
            finally:
                _discard(staging)
    finally:
        if staging is not None:  # released, its directory gone: a cleaner that took it meanwhile finds nothing
            _discard(staging)  # (made, but its lock could not be taken: never left behind)
            _lock_of(staging).unlink(missing_ok=True)


def _discard(staging):
    """Delete what is at `staging`, if anything: the directory, or a link that an exchange put there (never what the
    link points to)."""
    if os.path.islink(staging):
        os.unlink(staging)
    elif os.path.lexists(staging):
        shutil.rmtree(staging, ignore_errors=True)


def write_safetensors(path, shapes, array, metadata, done=None):
    """Write a float32 safetensors file at `path` one tensor at a time, array(name) called for each of
    `shapes` ({name: shape}, the file's order) as it is written (no second copy of the weights): 8 bytes
    little-endian header length, the JSON header (`__metadata__`: `metadata`), space-padded to 8, then the bytes.
    done: None or called with each tensor's bytes. Raises ValueError for an array not of its shape as C-contiguous
    float32 (use with atomic_write), OSError."""
    header, offset = {"__metadata__": dict(metadata)}, 0
    for name, shape in shapes.items():
        n = 4 * int(np.prod(shape, dtype=np.int64))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(len(text).to_bytes(8, "little") + text)
        for name, shape in shapes.items():
            a = array(name)
            if a.shape != tuple(shape) or a.dtype != np.dtype("<f4") or not a.flags.c_contiguous:
                raise ValueError(f"tensor {name}: got {a.dtype} {list(a.shape)} (C-contiguous: {a.flags.c_contiguous}), "
                                 f"expected C-contiguous little-endian float32 {list(shape)}")
            fh.write(memoryview(a).cast("B"))
            if done is not None:
                done(a.nbytes)


def converted_metadata(config, source, source_sha256):
    """The header metadata (all strings) of a format-2 file of `config`."""
    metadata = {
        "format_version": FORMAT_VERSION, "layout": LAYOUT, "n_vocab": config.n_vocab, "n_ctx": config.n_ctx,
        "n_embd": config.n_embd, "n_head": config.n_head, "n_layer": config.n_layer,
        "layer_norm_epsilon": config.layer_norm_epsilon, "eos_token_id": config.eos_token_id,
        "source": source, "source_sha256": source_sha256,
    }
    return {k: json.dumps(v) if not isinstance(v, str) else v for k, v in metadata.items()}


def in_order(pairs):
    """array(name) for write_safetensors over `(name, array)` pairs in the file's order. Raises CheckpointError
    for a pair out of order."""
    pairs = iter(pairs)

    def array(name):
        got, a = next(pairs, (None, None))
        if got != name:
            raise CheckpointError(f"cannot save: expected tensor {name} next, got {got}")
        return a

    return array


def write_weights(path, tensors, config, metadata, progress=None):
    """Write `tensors` ({name: float32 array} in the forward's shapes, any memory order, or `(name, array)`
    pairs in tensor_shapes order, streamed) as format 2 at `path`, each block matrix laid out as written. Raises
    OSError, CheckpointError for a streamed tensor out of order or misshaped."""
    shapes = stored_shapes(config)
    get = tensors.__getitem__ if isinstance(tensors, dict) else in_order(tensors)
    with bar(progress, f"writing {WEIGHTS_FILE}", 4 * sum(int(np.prod(s)) for s in shapes.values())) as b:
        try:
            write_safetensors(path, shapes, lambda name: stored(name, get(name)), metadata, b.update)
        except CheckpointError:  # a ValueError too: in_order's own message
            raise
        except ValueError as e:
            raise CheckpointError(f"cannot save: {oneline(e)}") from e


def save_converted(out_dir, tensors, config, source, source_sha256, tokenizer_json, progress=None):
    """Write a converted directory (format 2): `model.safetensors` then `tokenizer.json` (text
    `tokenizer_json`), each atomically. tensors: as write_weights, exactly tensor_shapes(config)'s (streamed pairs need
    never be in memory at once). Raises CheckpointError if they do not fit config, OSError."""
    problems = check_tensors(tensors, config) if isinstance(tensors, dict) else []
    if problems:
        raise CheckpointError("cannot save: " + capped(problems))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metadata = converted_metadata(config, source, source_sha256)
    atomic_write(out_dir / WEIGHTS_FILE, lambda tmp: write_weights(tmp, tensors, config, metadata, progress))
    atomic_write(out_dir / TOKENIZER_FILE, lambda tmp: Path(tmp).write_text(tokenizer_json, encoding="utf-8"))


def config_from_metadata(metadata, where, versions=READABLE_VERSIONS):
    """GPT2Config from a converted file's header metadata, its format_version one of `versions`.
    Raises CheckpointError, one line: not npspec's, an unknown version, bad fields."""
    version = (metadata or {}).get("format_version")
    if not metadata or version is None:
        raise CheckpointError(
            f"{where} is not an npspec-converted model (no format_version); "
            "convert it with: npspec convert SRC OUT_DIR")
    if version not in versions:
        raise CheckpointError(
            f"{where} has format_version {version!r}, which this npspec cannot read (it reads "
            f"{', '.join(map(repr, versions))}); reconvert it with npspec convert (or update npspec)")
    try:
        eos = json.loads(metadata["eos_token_id"])
        if eos is not None and (isinstance(eos, bool) or not isinstance(eos, int)):
            raise ValueError(f"eos_token_id must be an integer or null, got {eos!r}")
        return GPT2Config(
            n_vocab=int(metadata["n_vocab"]), n_ctx=int(metadata["n_ctx"]), n_embd=int(metadata["n_embd"]),
            n_head=int(metadata["n_head"]), n_layer=int(metadata["n_layer"]),
            layer_norm_epsilon=float(metadata["layer_norm_epsilon"]), eos_token_id=eos)
    except KeyError as e:
        raise CheckpointError(f"{where}: the model metadata has no {e.args[0]} (an npspec file holds "
                              "format_version, n_vocab, n_ctx, n_embd, n_head, n_layer, layer_norm_epsilon and "
                              "eos_token_id); reconvert it with python -m npspec.cli.convert") from None
    except RecursionError:  # eos_token_id's brackets nested deeper than Python's JSON parser follows
        raise CheckpointError(f"{where}: bad model metadata (eos_token_id nests its brackets too deep to parse; it "
                              "must be an integer or null); reconvert it with python -m npspec.cli.convert") from None
    except (ValueError, TypeError, OverflowError) as e:
        raise CheckpointError(f"{where}: bad model metadata ({oneline(e)}); "
                              "reconvert it with npspec convert") from e


def read_header(fh):
    """(data_start, JSON header) of an open safetensors file `fh` that safe_open accepted: 8 bytes
    little-endian length n, n bytes of JSON, then the data (data_offsets count from data_start)."""
    fh.seek(0)
    n = int.from_bytes(fh.read(8), "little")
    return 8 + n, json.loads(fh.read(n))


def read_tensor(fh, data_start, entry, dtype, where):
    """One tensor read with readinto into a new array of `dtype` and its shape. Raises CheckpointError for a
    byte count that does not fit the shape or a file that ends early."""
    a = np.empty(entry["shape"], dtype=dtype)
    begin, end = entry["data_offsets"]
    if end - begin != a.nbytes:  # safetensors checked it; the file may have been replaced since
        raise CheckpointError(f"{where} changed while being read; try again")
    fh.seek(data_start + begin)
    if fh.readinto(memoryview(a).cast("B")) != a.nbytes:
        raise CheckpointError(f"{where} is truncated")
    return a


def open_error(path):
    """The OSError that opening `path` for reading raises now, or None if it opens (without blocking on a FIFO; closed
    at once). safetensors and tokenizers report every failure to open a file in their own words: safetensors as
    FileNotFoundError "No such file or directory" (a file of mode 000 included), tokenizers as a bare Exception."""
    try:
        os.close(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)))
    except OSError as e:
        return e
    return None


def unreadable(path, e, fix=""):
    """The CheckpointError for the file `path` that could not be read (`e`: an OSError or MemoryError): "could not be
    read" with the OS's reason (open_error, for safetensors' FileNotFoundError), then `fix`; a permission denied has its
    own fix instead."""
    why = (open_error(path) or e) if isinstance(e, FileNotFoundError) else e
    if isinstance(why, PermissionError):
        return CheckpointError(f"{path} could not be read (permission denied); give the user running npspec read "
                               "permission on it (chmod a+r)")
    return CheckpointError(f"{path} could not be read ({type(why).__name__}: {oneline(why)})" + (f"; {fix}" if fix
                                                                                                  else ""))


def read_tokenizer(tok, fix):
    """The tokenizers.Tokenizer in the file `tok`. Raises CheckpointError, one line: a file that cannot be opened names
    the OS's reason (unreadable: e.g. permission denied), anything else is not a tokenizers file (ending with `fix`)."""
    try:
        return Tokenizer.from_file(str(tok))
    except Exception as e:  # tokenizers raises a bare Exception for a file it cannot open or parse
        if (why := open_error(tok)) is not None:
            raise unreadable(tok, why) from e
        raise CheckpointError(f"{tok} is not a valid tokenizers file ({oneline(e)}); {fix}") from e


@contextlib.contextmanager
def reading(path, fix=""):
    """Turn what safetensors (its Rust panics too), numpy or the OS raise while reading `path` into one
    CheckpointError line ("is not a readable safetensors file" / "could not be read" with the OS's reason, permission
    denied with its own fix; "; fix" appended)."""
    tail = f"; {fix}" if fix else ""
    try:
        yield
    except CheckpointError:
        raise
    except (OSError, MemoryError) as e:
        raise unreadable(path, e, fix) from e
    except (SafetensorError, ValueError, TypeError, KeyError, OverflowError) as e:
        raise CheckpointError(f"{path} is not a readable safetensors file ({oneline(e)}){tail}") from e
    except BaseException as e:
        if type(e).__name__ == "PanicException":
            raise CheckpointError(f"{path} is not a readable safetensors file ({oneline(e)}){tail}") from e
        raise


def read_weights(weights, progress=None):
    """(metadata, config, {name: float32 array}, problems) of a converted `model.safetensors`: safetensors
    checks the header, each tensor is read with readinto straight into the array the tree holds (format 2's block
    matrices as `[d_out, d_in]` C-order, transposed: no copy; no memory map, which would count the file twice).
    problems: one line each (an unknown layout, missing, misshaped or non-float32 tensors, NaN or inf); tensors are
    then empty."""
    with safe_open(str(weights), framework="numpy") as f:
        metadata = f.metadata() or {}
        config = config_from_metadata(metadata, weights)
        version = metadata["format_version"]
        if version != "1" and metadata.get("layout") != LAYOUT:
            return metadata, config, {}, [f"format {version} with layout {metadata.get('layout')!r}, which this "
                                          f"npspec does not know (it writes {LAYOUT!r})"]
        names = set(f.keys())
        if problem := layer_count_problem(config, names, "the metadata"):  # a lying n_layer could be 1e12
            return metadata, config, {}, [problem]
        problems = []
        shapes = stored_shapes(config, version)
        for name, shape in shapes.items():
            if name not in names:
                problems.append(f"missing tensor {name} {list(shape)}")
                continue
            info = f.get_slice(name)
            got, dtype = tuple(info.get_shape()), info.get_dtype()
            if got != shape:
                transposed = " (format 2 stores block matrices transposed, [out, in])" if version != "1" and \
                    is_block_matrix(name) else ""
                problems.append(f"tensor {name} has shape {list(got)}, expected {list(shape)}{transposed}")
            elif dtype != "F32":
                problems.append(f"tensor {name} is {dtype}, expected F32")
    if problems:
        return metadata, config, {}, problems
    tensors = {}
    total = 4 * sum(int(np.prod(shape)) for shape in shapes.values())
    with open(weights, "rb") as fh, bar(progress, f"loading {Path(weights).parent.name}", total) as b:
        data_start, header = read_header(fh)
        for name in shapes:
            a = read_tensor(fh, data_start, header[name], "<f4", f"{weights} (tensor {name})")
            if not finite(a):
                return metadata, config, {}, [f"tensor {name} holds NaN or inf (the model cannot produce "
                                              "probabilities)"]
            tensors[name] = a.T if version != "1" and is_block_matrix(name) else a
            b.update(a.nbytes)
    return metadata, config, tensors, []


def finite(a, chunk=1 << 20):
    """Whether every value of `a` is finite, checked `chunk` values at a time (no temporary of a's size)."""
    flat = a.reshape(-1)
    return all(np.isfinite(flat[i:i + chunk]).all() for i in range(0, flat.size, chunk))


def rewrite_format_1(path, params, config, metadata, lock=None):
    """Rewrite the format-1 `path/model.safetensors` as format 2 from the loaded column-major `params`,
    atomically, under `lock` (else dir_lock), unless another process did. Returns (the metadata now in the file, a
    one-line note); never raises for an unwritable directory (the note says so and how to stop the relayout)."""
    weights = Path(path) / WEIGHTS_FILE
    new = {**metadata, "format_version": FORMAT_VERSION, "layout": LAYOUT}
    try:
        with lock if lock is not None else locked(dir_lock(path)):
            with safe_open(str(weights), framework="numpy") as f:
                if (f.metadata() or {}).get("format_version") != "1":
                    return new, None  # another process rewrote it while this one loaded it
            atomic_write(weights, lambda tmp: write_weights(tmp, flat_tensors(params, config), config, new))
    except (OSError, SafetensorError, CheckpointError) as e:  # CheckpointError: the cache's lock stayed held
        return metadata, (f"{weights} is in npspec's old format 1 and could not be rewritten as format 2 "
                          f"({oneline(e)}): loaded with a relayout (slower); make {path} writable and load it "
                          "once, or reconvert it")
    return new, (f"{weights} was in npspec's old format 1: rewrote it once as format 2 "
                 "(stored in the forward's layout, so later loads need no relayout)")


def load_model(path, kernel=STATIC_DEFAULT, threads=1, progress=None, lock=None):
    """A Model of the converted directory `path` decoding with `kernel` at `threads`. Format 2: each tensor read
    once into its array (peak memory: the weights); format 1: then relaid out one matrix at a time and rewritten once
    as format 2 (rewrite_format_1 under `lock`, else dir_lock; a note says so). progress: None or a bar factory.
    Raises CheckpointError, one line with the fix: a missing directory or file, a file safetensors cannot read or
    whose header does not fit it, bad metadata, missing, misshaped or non-float32 tensors, a bad tokenizer.json."""
    path = Path(path)
    weights, tok = path / WEIGHTS_FILE, path / TOKENIZER_FILE
    if not path.exists():
        raise CheckpointError(f"model directory {path} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"{path} is a file; give the directory that holds {WEIGHTS_FILE} and {TOKENIZER_FILE}")
    for f in (weights, tok):
        if kind(f) not in ("missing", "file") and not f.is_file():
            raise CheckpointError(f"{f} is {described(f)}, not a regular file; put the model's {f.name} there")
        if not f.is_file():
            raise CheckpointError(f"{path} has no {f.name}; is it an npspec-converted model? "
                                  "Convert a Hugging Face checkpoint with: npspec convert SRC OUT_DIR")
    fix = "reconvert it with npspec convert"
    with reading(weights, fix):
        metadata, config, tensors, problems = read_weights(weights, progress)
    if problems:
        raise CheckpointError(f"{weights}: " + capped(problems) + f"; {fix}")
    tokenizer = read_tokenizer(tok, fix)
    if tokenizer.get_vocab_size() > config.n_vocab:
        raise CheckpointError(f"{tok} has {tokenizer.get_vocab_size()} ids but the model's n_vocab is {config.n_vocab}: "
                              "it is not this model's tokenizer; put the model's own tokenizer.json there")
    params = params_tree(tensors, config)
    del tensors  # so each row-major matrix is freed as soon as its column-major copy exists (peak: one matrix)
    if metadata["format_version"] == "1":
        with bar(progress, f"column-major {path.name}", sum(lin["w"].nbytes for lin in block_linears(params))) as b:
            column_major(params, b.update)  # what Model would do; here with a bar (Model's is then a no-op)
        metadata, said = rewrite_format_1(path, params, config, metadata, lock)
        if said is not None:
            log.info(said)
    return Model(config, params, tokenizer, path, kernel, threads, metadata)

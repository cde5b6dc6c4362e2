"""Compiling the tiles with numba, once per process, panel width and njit (functools.lru_cache holds the builds):
16-column panels by blocks.py's loop nest (256-bit register blocks), any other even width by tiles.py's; `host_panel`
picks the width for the host's vectors; int codes go to qtiles.py's two nests alike. numba's disk cache keeps the
nests' builds for later processes, or it compiles in memory, saying so through logging. Imports numpy,
npspec.kernels.compiled.{blocks, tiles, qtiles, intrinsics}; numba only when a build runs (0.5 to 2 s to import).
"""

import functools
import hashlib
import importlib.util
import inspect
import logging
import time
import types
from typing import Callable, NamedTuple

import numpy as np

from . import blocks, intrinsics, qtiles as qtiles_module, tiles as tiles_module
from .qtiles import block_qtiles, qblocks_product, qpanels_product, qpanels_runs, qtiles
from .tiles import PANEL, panels_product, panels_runs, tiles

log = logging.getLogger(__name__)

NAME = "compiled-panels"
NOTE_SECONDS = 0.5  # compiling longer than this is told
CACHED = (PANEL, blocks.PANEL)  # the panel widths whose builds numba keeps on disk
LAYERS = ("omp", "tbb", "workqueue")  # numba's threading layers, in the order tried (notes/kernels.md: why OpenMP)
COMPILED_IN = (intrinsics, tiles_module, blocks, qtiles_module)  # the modules whose code and constants a build holds


class KernelUnavailable(ValueError):
    """A kernel cannot be built here: its extra is missing, or installed and broken (a numba that does not import)."""


class Built(NamedTuple):
    function: Callable  # numba's dispatcher (or the plain function, with a stand-in njit)
    on_disk: bool  # numba caches it on disk


def available(find_spec=None):  # find_spec: importlib.util.find_spec (tests pretend numba is missing) -> bool
    """True if numba can be imported (the `fast` extra is installed); nothing is imported to find out."""
    try:
        return (find_spec or importlib.util.find_spec)("numba") is not None
    except ValueError:  # sys.modules["numba"] is None: imports of numba are blocked
        return False


def host_panel(features=None):  # features: {LLVM feature name: bool}, the host's if None -> PANEL or blocks.PANEL
    """The panel width whose loop nest fits the vectors numba compiles for: PANEL (tiles.py, sized for AVX-512's 32
    registers of 512 bits) where the CPU has AVX-512, else blocks.PANEL (register blocks of 256-bit vectors). Both
    give the same bits; the width decides speed only. features: LLVM's map (llvmlite.binding.get_host_cpu_features)."""
    if features is None:
        from llvmlite import binding  # numba's compiler; installed with numba

        features = binding.get_host_cpu_features()
    return PANEL if features.get("avx512f") else blocks.PANEL


def nest(panel):  # -> (tiles {name: function}, product, runs) of the loop nest for `panel`-column panels
    if panel == blocks.PANEL:
        return blocks.tiles(), blocks.blocks_product, blocks.blocks_runs
    return tiles(panel), panels_product, panels_runs


def compiled_product(njit=None, panel=PANEL):  # -> panels_product(x, panels, y, p0, p1), compiled
    """njit: numba.njit, or a stand-in (the tiles then run as plain Python over intrinsics.names(None)).
    Raises KernelUnavailable (one line, with the fix) without a numba that imports, ValueError for a panel that is not
    a positive even int."""
    if isinstance(panel, bool) or not isinstance(panel, (int, np.integer)) or panel < 2 or panel % 2:
        raise ValueError(f"a panel of compiled-panels has a positive even number of columns (tile8 halves it), "
                         f"got {panel!r}")
    return product_build(panel, njit).function


@functools.lru_cache(maxsize=None)
def product_build(panel, njit=None):  # -> Built: panels_product over `panel`-column panels
    numba = None if njit is not None else import_numba()
    njit = numba.njit if numba is not None else njit
    disk = panel in CACHED
    start = time.perf_counter()  # after numba's import: what is told is compiling (or loading the cache)
    built = jit_product(njit, intrinsics.names(numba), panel, disk)
    x = np.zeros((1, 2), dtype=np.float32)
    built.function(x, np.zeros((1, 2, panel), dtype=np.float32), np.zeros((1, 1), dtype=np.float32), 0, 1)
    announce(time.perf_counter() - start, built, disk)
    return built


def import_numba():
    try:
        import numba
    except ImportError as e:
        raise KernelUnavailable(import_problem(e, available())) from None
    return numba


def import_problem(error, installed):  # ImportError, bool -> str: numba missing, or installed and broken
    other = "or pick a NumPy kernel with --target-kernel / --draft-kernel"
    if not installed:
        return f"kernel {NAME} needs numba: pip install 'npspec[fast]' ({other})"
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return (f"kernel {NAME}: numba is installed but does not import ({first}); reinstall it with pip install "
            f"--force-reinstall 'npspec[fast]' ({other})")


def announce(seconds, built, disk=True, what="", first=True, kernel=NAME):  # logs a slow build, or a memory-only one
    """what: the loop built, after "compiled" ("" the product, "its threaded loop"); first: the process's first build
    of the kernel, the one that says no disk could hold it (the later builds then say nothing of it); kernel: the
    name the note gives."""
    if disk and not built.on_disk:
        if first:
            log.info(f"kernel {kernel}: no writable cache location for numba, so it compiled in memory ({seconds:.1f} s, "
                     "again in every process); set NUMBA_CACHE_DIR to a writable directory to compile once")
    elif seconds > NOTE_SECONDS and not getattr(getattr(built.function, "stats", None), "cache_hits", 0):
        once = ("once: numba caches it on disk" if built.on_disk
                else "for this process: only the host's panels are cached")
        log.info(f"kernel {kernel}: compiled {what + ' ' if what else ''}in {seconds:.1f} s ({once})")


def jit_product(njit, names, panel, disk=True):  # -> Built: the tiles, then the product calling them
    """On disk unless `disk` is False or no cache location is writable (numba's RuntimeError at decoration)."""
    for cache in (True, False) if disk else (False,):
        try:
            jit = njit(nogil=True, cache=cache, boundscheck=False)
            made, product, _ = nest(panel)
            helpers = {name: jit(with_globals(f, names, f"{name}_{panel}")) for name, f in made.items()}
            tiled = jit(with_globals(panels_product, {**helpers, "PANEL": panel}, f"panels_product_{panel}"))
            if product is panels_product:
                return Built(tiled, cache)
            grouped = with_globals(product, {**helpers, "panels_product": tiled}, f"{product.__name__}_{panel}")
            return Built(jit(grouped), cache)  # the register blocks: one row's groups of panels, then the tiles
        except RuntimeError:  # numba: "cannot cache function ...: no locator available" (nowhere writable)
            if not cache:
                raise


def compiled_runs(layers=LAYERS, panel=PANEL):  # -> (runs(x, panels, y, cuts, threads), numba's most threads)
    """panels_runs on `threads` of numba's threads. layers: numba's threading layers to try, in order (one alone
    must load or numba raises); numba's setting for the process, so the first build's order holds."""
    return runs_build(tuple(layers), panel)


def threading_layers(layers):  # -> numba, told which threading layers to try (once a process: its first call's)
    numba = import_numba()
    numba.config.THREADING_LAYER_PRIORITY = list(layers) + [n for n in LAYERS if n not in layers]
    if len(layers) == 1 and numba.config.THREADING_LAYER == "default":
        numba.config.THREADING_LAYER = layers[0]  # one layer asked for (the bench's --layer): that one or an error
    return numba


@functools.lru_cache(maxsize=None)
def runs_build(layers, panel):  # -> (runs, numba.config.NUMBA_NUM_THREADS)
    product = product_build(panel)
    numba = threading_layers(layers)
    start = time.perf_counter()
    _, one, runs_of = nest(panel)
    names = {"prange": numba.prange, one.__name__: product.function}
    jitted = numba.njit(parallel=True, nogil=True, cache=product.on_disk)(
        with_globals(runs_of, names, f"{runs_of.__name__}_{panel}"))
    x, cuts = np.zeros((1, 2), dtype=np.float32), np.array([0, 1], dtype=np.int64)
    jitted(x, np.zeros((1, 2, panel), dtype=np.float32), np.zeros((1, 1), dtype=np.float32), cuts)
    announce(time.perf_counter() - start, Built(jitted, product.on_disk), panel in CACHED, "its threaded loop", False)

    def runs(x, panels, y, cuts, threads):  # numba's thread count is the calling thread's own setting
        numba.set_num_threads(threads)
        jitted(x, panels, y, cuts)
    return runs, numba.config.NUMBA_NUM_THREADS


def compiled_qproduct(nibbles=False, njit=None, panel=PANEL, blocks=False):  # -> product(x, codes, scales, y, p0, p1)
    """"compiled-quant"'s loop over int8 codes, or (nibbles) two 4-bit codes a byte: qtiles.qpanels_product, or
    (blocks) qtiles.qblocks_product, the register blocks for 256-bit vectors; njit as compiled_product. Raises
    KernelUnavailable as compiled_product."""
    return qproduct_build(bool(nibbles), panel, bool(blocks), njit).function


def qnest(nibbles, panel, blocks):  # -> (tiles {name: function}, product, kind: the builds' name) of a codes nest
    kind = ("i4" if nibbles else "i8") + ("b" if blocks else "")
    if blocks:
        return block_qtiles(panel, nibbles), qblocks_product, kind
    return qtiles(panel, nibbles), qpanels_product, kind


@functools.lru_cache(maxsize=None)
def qproduct_build(nibbles, panel, blocks=False, njit=None):  # -> Built: the product over `panel`-column code panels
    numba = None if njit is not None else import_numba()
    njit = numba.njit if numba is not None else njit
    made, product, kind = qnest(nibbles, panel, blocks)
    disk = panel in CACHED
    start = time.perf_counter()
    for cache in (True, False) if disk else (False,):
        try:
            jit = njit(nogil=True, cache=cache, boundscheck=False)
            helpers = {name: jit(with_globals(f, intrinsics.names(numba), f"{name}_{kind}_{panel}"))
                       for name, f in made.items()}
            tiled = with_globals(product, {**helpers, "PANEL": panel}, f"{product.__name__}_{kind}_{panel}")
            built = Built(jit(tiled), cache)
            break
        except RuntimeError:  # no cache location (jit_product)
            if not cache:
                raise
    rows = 1 if nibbles else 2
    built.function(np.zeros((1, 2), dtype=np.float32), np.zeros((1, rows, panel), dtype=np.int8),
                   np.zeros((1, 1, panel), dtype=np.float32), np.zeros((1, 1), dtype=np.float32), 0, 1)
    loop = f"its {'4-bit' if nibbles else 'int8'} {'register blocks' if blocks else 'tiles'}"
    announce(time.perf_counter() - start, built, disk, loop, False, "compiled-quant")  # after its floats' build
    return built


def compiled_qruns(nibbles=False, layers=LAYERS, panel=PANEL, blocks=False):  # -> (runs, numba's most threads)
    """qpanels_runs over compiled_qproduct's product on `threads` of numba's threads, as compiled_runs:
    runs(x, codes, scales, y, cuts, threads)."""
    return qruns_build(bool(nibbles), tuple(layers), panel, bool(blocks))


@functools.lru_cache(maxsize=None)
def qruns_build(nibbles, layers, panel, blocks=False):  # -> (runs, numba.config.NUMBA_NUM_THREADS)
    product = qproduct_build(nibbles, panel, blocks)
    numba = threading_layers(layers)  # (not runs_build: its float nest at this panel width is not this kernel's)
    most = numba.config.NUMBA_NUM_THREADS
    kind = qnest(nibbles, panel, blocks)[2]
    names = {"prange": numba.prange, "qpanels_product": product.function}
    jitted = numba.njit(parallel=True, nogil=True, cache=product.on_disk)(
        with_globals(qpanels_runs, names, f"qpanels_runs_{kind}_{panel}"))
    rows = 1 if nibbles else 2
    jitted(np.zeros((1, 2), dtype=np.float32), np.zeros((1, rows, panel), dtype=np.int8),
           np.zeros((1, 1, panel), dtype=np.float32), np.zeros((1, 1), dtype=np.float32),
           np.array([0, 1], dtype=np.int64))

    def runs(x, codes, scales, y, cuts, threads):
        numba.set_num_threads(threads)
        jitted(x, codes, scales, y, cuts)
    return runs, most


def with_globals(f, names, name=None):  # -> a copy of function f whose globals also hold `names`
    """name: the copy's __qualname__ (then sources_digest()), which numba's symbols and disk cache are named by: one
    per panel width, so a build loaded from the disk cache never links to another width's copy compiled in the same
    process, and one per version of COMPILED_IN's sources."""
    g = types.FunctionType(f.__code__, {**f.__globals__, **names}, f.__name__, f.__defaults__, f.__closure__)
    g.__qualname__ = f"{name or f.__qualname__}_{sources_digest()}"
    return g


@functools.lru_cache(maxsize=None)
def sources_digest(modules=COMPILED_IN, source=inspect.getsource):  # -> 12 hex digits
    """A digest of the modules' source text. numba's disk cache checks only the file that defines a function (a
    tile's), not the intrinsics' code generation or the constants a tile takes from another module, which a build
    holds too: named by this digest, a build is compiled anew when any of them changes, never loaded stale.
    source: module -> its text (tests give a stand-in); a module whose source cannot be read (an install without .py
    files) adds its name only, and its edits then go unseen, as before the digest."""
    digest = hashlib.sha256()
    for module in modules:
        try:
            text = source(module)
        except (OSError, TypeError):  # inspect: no source file, or a built-in module
            text = module.__name__
        digest.update(text.encode())
    return digest.hexdigest()[:12]

"""Building the compiled kernel (npspec.kernels.compiled.build, .tiles, .blocks, .qtiles, .intrinsics): the tiles
generated from one body, the register blocks (over float32 panels and over int codes), the compiler hints, the panel width chosen for the host's vectors, numba's caches, the
notes it logs, the threading layers and a numba that is missing or broken.

The plain-Python tiles (a stand-in njit, no numba needed) are held to the documented chain of fused multiply-adds for
every row count, as the compiled ones are in tests/test_compiled.py and tests/test_compiled_quant.py.
"""

import logging
import re

import numpy as np
import pytest

from npspec.kernels import compiled
from npspec.kernels.compiled import blocks, build, intrinsics, qtiles, tiles
from npspec.kernels.registry import REGISTRY
from npspec.sources.quantize import dequantize_tensor, parse_scheme, quantize_tensor

from conftest import run_python
from test_compiled import chain, matrix, needs_numba


class FakeNjit:
    """numba.njit's shape: njit(**options)(function) -> a callable; `cache=True` raises numba's "no locator" error
    when `writable` is False, as numba does where no cache directory can be written. A new one is a new build (the
    builds are cached per njit)."""

    def __init__(self, writable):
        self.writable, self.options = writable, []

    def __call__(self, **options):
        self.options.append(options)
        if options.get("cache") and not self.writable:
            raise RuntimeError("cannot cache function 'tile4': no locator available for file 'tiles.py'")
        return lambda f: f


def notes(caplog):  # the compiled kernel's logged notes
    return [r.getMessage() for r in caplog.records if r.name == build.__name__]


def test_every_tile_is_one_body_specialised_by_its_row_count():
    made = tiles.tiles()
    assert list(made) == [f"tile{rows}" for rows in tiles.PARTS] and set(tiles.TAIL) - {0} <= set(tiles.PARTS)
    assert len({f.__code__ for f in made.values()}) == 1  # one definition, four closures
    assert {f.__name__: [c.cell_contents for c in f.__closure__] for f in made.values()} == {
        "tile8": [2, 8, 32], "tile6": [1, 6, 64], "tile4": [1, 4, 64], "tile1": [1, 1, 64]}  # parts, rows, width


def test_the_register_blocks_are_one_body_per_tile_and_fit_sixteen_vector_registers():
    made = blocks.tiles()
    assert list(made) == [f"tile{rows}" for rows in blocks.ROW_BLOCKS] + ["group1"]
    assert set(tiles.TAIL) - {0} <= set(blocks.ROW_BLOCKS)
    assert len({made[f"tile{rows}"].__code__ for rows in blocks.ROW_BLOCKS}) == 1
    assert {f"tile{rows}": [c.cell_contents for c in made[f"tile{rows}"].__closure__] for rows in blocks.ROW_BLOCKS} \
        == {"tile8": [8, 4], "tile6": [6, 6], "tile4": [4, 4], "tile1": [1, 1]}  # rows, rows of a block
    vectors = blocks.PANEL // blocks.LANES
    sums = [size * vectors for size in blocks.ROW_BLOCKS.values()] + [blocks.GROUP * vectors]
    assert max(sums) <= 12 and blocks.LANES * 32 == 256  # 16 registers: the sums, the weights and one broadcast


def test_the_panel_width_follows_the_vectors_of_the_host():
    assert build.host_panel({"avx512f": True, "avx2": True}) == tiles.PANEL == 64
    assert build.host_panel({"avx512f": False, "avx2": True}) == blocks.PANEL == 16
    assert build.host_panel({"sse2": True}) == blocks.PANEL


@needs_numba
def test_the_registry_builds_compiled_panels_at_the_real_hosts_panel_width():  # llvmlite comes with numba
    assert build.host_panel() in (tiles.PANEL, blocks.PANEL)
    assert REGISTRY["compiled-panels"].build(1).panel == build.host_panel()
    assert REGISTRY["compiled-quant"].build(1).floats.panel == build.host_panel()


@pytest.mark.parametrize("panel", [tiles.PANEL, 4, blocks.PANEL])
def test_the_plain_python_tiles_add_each_element_in_the_documented_order_for_every_row_count(caplog, panel):
    """The tiles run as plain Python over intrinsics.names(None) (numpy_fma), for M = 1..17 (every tile, padded or
    not, after 0, 1 or 2 tiles of 8), two panels and a partial third: bit for bit the chain."""
    product = compiled.compiled_product(njit=FakeNjit(writable=True), panel=panel)
    d_out = 2 * panel + 3
    w, x = matrix(3, d_out, seed=6), matrix(17, 3, seed=7, order="C")
    want = chain(x, w)
    for m in range(1, 18):
        y = np.full((m, d_out), np.nan, np.float32)
        product(x[:m], compiled.pack(w, panel), y, 0, 3)
        assert np.array_equal(y, want[:m]), f"M={m}"


def test_the_plain_python_register_blocks_take_one_row_four_panels_at_a_time_within_a_run():
    """One row over 11 panels, the last partial, in runs [0, 5) and [5, 11): a group of four and one single panel,
    then one group and two singles (the partial last panel never in a group); and the tiles of 2..9 rows."""
    product = compiled.compiled_product(njit=FakeNjit(writable=True), panel=blocks.PANEL)
    d_out = 10 * blocks.PANEL + 5
    w, x = matrix(5, d_out, seed=8), matrix(9, 5, seed=9, order="C")
    want, panels = chain(x, w), compiled.pack(w, blocks.PANEL)
    for m in range(1, 10):
        y = np.full((m, d_out), np.nan, np.float32)
        product(x[:m], panels, y, 0, 5)
        product(x[:m], panels, y, 5, 11)
        assert np.array_equal(y, want[:m]), f"M={m}"


@needs_numba
def test_the_tiles_ask_llvm_for_wide_vectors_and_the_cpu_for_the_rows_ahead():
    """The two hints reach the compiled code: each tile, compiled on its own (in memory: numba shows no code it loaded
    from its disk cache), carries LLVM's prefer-vector-width attribute at VECTOR_BITS and calls llvm.prefetch."""
    import numba
    names = intrinsics.names(numba)
    panels = compiled.pack(matrix(70, 2 * compiled.PANEL))
    for name, tile in tiles.tiles().items():
        rows = int(name[4:])
        jitted = numba.njit(nogil=True, boundscheck=False)(build.with_globals(tile, names))
        x, y = matrix(rows, 70, seed=2, order="C"), np.empty((rows, compiled.PANEL), np.float32)
        jitted(x, panels, 1, y)
        assert np.array_equal(y, chain(x, panels[1])), name
        code = "".join(jitted.inspect_llvm().values())
        assert f'"prefer-vector-width"="{intrinsics.VECTOR_BITS}"' in code and "@llvm.prefetch" in code, name


@needs_numba
def test_the_register_blocks_are_vectors_of_eight_fused_multiply_adds_with_the_rows_ahead_asked_for():
    """Each tile's block, compiled on its own (in memory), calls llvm.fma on 8-float vectors and llvm.prefetch, and
    gives the chain's bits over panels whose count is no multiple of the group."""
    import numba
    names = intrinsics.names(numba)
    w = matrix(70, 6 * blocks.PANEL)
    panels = compiled.pack(w, blocks.PANEL)
    for name, tile in blocks.tiles().items():
        rows, width = (1, blocks.GROUP * blocks.PANEL) if name == "group1" else (int(name[4:]), blocks.PANEL)
        jitted = numba.njit(nogil=True, boundscheck=False)(build.with_globals(tile, names))
        x, y = matrix(rows, 70, seed=2, order="C"), np.empty((rows, width), np.float32)
        jitted(x, panels, 1, y)
        assert np.array_equal(y, chain(x, w[:, blocks.PANEL : blocks.PANEL + width])), name
        code = "".join(jitted.inspect_llvm().values())
        assert "@llvm.fma.v8f32" in code and "@llvm.prefetch" in code, name


def code_panels(d_in, d_out, scheme, seed=10):  # -> (QuantPanels, the dequantized float32 matrix)
    q = quantize_tensor(matrix(d_in, d_out, seed=seed), parse_scheme(scheme), 0)
    return compiled.QuantPanels.from_codes(q.codes, q.scales), dequantize_tensor(q, parse_scheme(scheme), 0)


def test_the_register_blocks_over_codes_are_one_body_per_row_count_and_fit_sixteen_vector_registers():
    for nibbles in (False, True):
        made = qtiles.block_qtiles(compiled.PANEL, nibbles)
        assert list(made) == [f"qblock{rows}" for rows in range(1, qtiles.BLOCK_ROWS + 1)]
        assert len({f.__code__ for f in made.values()}) == 1
        for rows, width in qtiles.BLOCK_WIDTHS[nibbles].items():
            tile = made[f"qblock{rows}"]
            constants = dict(zip(tile.__code__.co_freevars, (c.cell_contents for c in tile.__closure__)))
            assert constants == {"rows": rows, "width": width, "packed": int(nibbles), "panel": compiled.PANEL}
            assert compiled.PANEL % width == 0 and rows * width // 8 <= 8  # the sums: half the 16 registers at most
    with pytest.raises(ValueError, match="multiple of 8 columns, got 12"):
        qtiles.block_qtiles(12)


@pytest.mark.parametrize("scheme", ["int8-g4", "int4-g4", "int8-ch", "int4-ch"])
def test_the_plain_python_register_blocks_over_codes_add_each_element_in_the_documented_order(scheme):
    """qblocks_product as plain Python over intrinsics.names(None) (numpy_qblock), for M = 1..9 (blocks of 4 rows
    and the last 1 to 3), two code panels and a partial third, in two runs: bit for bit the chain on the dequantized
    matrix, 4-bit codes two a byte (their group even) or int8."""
    q, w = code_panels(8, 2 * compiled.PANEL + 3, scheme)
    assert q.nibbles == scheme.startswith("int4")
    product = build.compiled_qproduct(q.nibbles, njit=FakeNjit(writable=True), blocks=True)
    x = matrix(9, 8, seed=11, order="C")
    want = chain(x, w)
    for m in range(1, 10):
        y = np.full((m, w.shape[1]), np.nan, np.float32)
        product(x[:m], q.codes, q.scales, y, 0, 1)
        product(x[:m], q.codes, q.scales, y, 1, 3)
        assert np.array_equal(y, want[:m]), f"M={m}"


@needs_numba
def test_the_register_blocks_over_codes_decode_in_vector_lanes_once_for_all_rows():
    """Each block tile, compiled on its own (in memory), converts codes in 8-lane vectors (sitofp of an <8 x i..>; the
    4-bit codes split by a shift and a mask), calls llvm.fma.v8f32 and llvm.prefetch, and gives the chain's bits."""
    import numba
    names = intrinsics.names(numba)
    for scheme in ("int8-g4", "int4-g4"):
        q, w = code_panels(16, 2 * compiled.PANEL, scheme)
        for name, tile in qtiles.block_qtiles(compiled.PANEL, q.nibbles).items():
            rows = int(name[6:])
            jitted = numba.njit(nogil=True, boundscheck=False)(build.with_globals(tile, names))
            x, y = matrix(rows, 16, seed=2, order="C"), np.empty((rows, compiled.PANEL), np.float32)
            jitted(x, q.codes[1], q.scales[1], y)
            assert np.array_equal(y, chain(x, w[:, compiled.PANEL :])), (scheme, name)
            code = "".join(jitted.inspect_llvm().values())
            assert "sitofp <8 x i" in code and "@llvm.fma.v8f32" in code and "@llvm.prefetch" in code, name
            assert ("ashr <8 x i32>" in code) == q.nibbles, name


def test_without_numba_the_kernel_says_how_to_install_it():
    assert compiled.available(lambda name: None) is False
    assert REGISTRY["compiled-panels"].extra == "fast" and REGISTRY["compiled-panels"].invariant


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_a_broken_numba_is_named_broken_with_its_error_not_missing(tmp_path):
    # a numba that is installed but fails to import (built for another numpy): a stand-in package on PYTHONPATH
    fake = tmp_path / "numba"
    fake.mkdir()
    (fake / "__init__.py").write_text('raise ImportError("Numba needs NumPy 2.3 or less. Got NumPy 9.0.\\nmore")\n')
    r = run_python("-m", "npspec.generate", "--target-kernel", "compiled-panels", "--max-new-tokens", "2",
                   env={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 1 and r.stdout == ""
    line, = r.stderr.strip().splitlines()
    assert "kernel compiled-panels: numba is installed but does not import (Numba needs NumPy 2.3 or less. Got NumPy " \
           "9.0.); reinstall it with pip install --force-reinstall 'npspec[fast]'" in line
    # left to the probe, the kernel drops out of the candidates, saying why: measured, or chosen unmeasured (off)
    for probe in ("cached", "off"):
        r = run_python("-m", "npspec.generate", "--max-new-tokens", "2", "--kernel-probe", probe, "ROMEO:",
                       env={"PYTHONPATH": str(tmp_path), "NPSPEC_CACHE": str(tmp_path / f"cache-{probe}")})
        assert r.returncode == 0 and r.stdout.startswith("ROMEO:"), r.stderr
        assert "numba is installed but does not import" in r.stderr and "Traceback" not in r.stderr
        assert ("the probe goes on without it" if probe == "cached" else "decodes with one of") in r.stderr
    missing = build.import_problem(ImportError("x"), False)
    assert missing.startswith("kernel compiled-panels needs numba: pip install")
    assert "does not import (ImportError)" in build.import_problem(ImportError(""), True)


def test_a_read_only_cache_compiles_in_memory_and_says_so(caplog):
    caplog.set_level(logging.INFO, logger="npspec")
    njit = FakeNjit(writable=False)
    product = compiled.compiled_product(njit=njit)
    assert [o["cache"] for o in njit.options] == [True, False] and all(o["nogil"] for o in njit.options)
    said = notes(caplog)
    assert len(said) == 1 and "no writable cache location for numba" in said[0] and "\n" not in said[0]
    x, w = matrix(2, 70, seed=1, order="C"), matrix(70, 3)
    y = np.empty((2, 3), np.float32)
    product(x, compiled.pack(w), y, 0, 1)
    assert np.allclose(y, x @ w, atol=1e-4)
    assert compiled.compiled_product(njit=njit) is product and len(notes(caplog)) == 1  # built once
    build.announce(2.0, build.Built(product, False), True, "its threaded loop", first=False)
    assert len(notes(caplog)) == 1  # the later builds of a process that compiles in memory say nothing more


def test_a_change_to_any_module_a_build_holds_names_a_new_build_so_numbas_cache_is_never_read_stale():
    """numba's disk cache checks only the file defining a function (qtiles.py for a code tile); the intrinsics' code
    generation and the constants a tile takes from tiles.py are compiled in but not checked. Every build's name
    carries a digest of all four modules' sources."""
    assert {m.__name__.rsplit(".", 1)[1] for m in build.COMPILED_IN} == {"intrinsics", "tiles", "blocks", "qtiles"}
    texts = {m: f"source of {m.__name__}" for m in build.COMPILED_IN}
    first = build.sources_digest(build.COMPILED_IN, texts.get)
    assert re.fullmatch(r"[0-9a-f]{12}", first) and build.sources_digest(build.COMPILED_IN, texts.get) == first
    for module in build.COMPILED_IN:
        changed = {**texts, module: texts[module] + " # one more comment"}
        assert build.sources_digest(build.COMPILED_IN, changed.get) != first, module.__name__
    def unreadable(module):
        raise OSError("could not get source code")
    assert re.fullmatch(r"[0-9a-f]{12}", build.sources_digest(build.COMPILED_IN, unreadable))  # no crash, no digest
    named = build.with_globals(qtiles.qblocks_product, {}, "qblocks_product_i4b_16")
    assert named.__qualname__ == f"qblocks_product_i4b_16_{build.sources_digest()}"


def test_a_quick_build_is_not_told_a_slow_one_is_and_no_fastmath_is_asked_for(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="npspec")
    njit = FakeNjit(writable=True)
    compiled.compiled_product(njit=njit)
    assert notes(caplog) == [] and all("fastmath" not in o and o["cache"] for o in njit.options)
    monkeypatch.setattr(build, "NOTE_SECONDS", -1.0)
    compiled.compiled_product(njit=FakeNjit(writable=True))
    said, = notes(caplog)
    assert re.fullmatch(r"kernel compiled-panels: compiled in \d+\.\d s \(once: numba caches it on disk\)", said)
    build.announce(3.0, build.Built(lambda: None, True), True, "its threaded loop", first=False)
    assert notes(caplog)[-1] == ("kernel compiled-panels: compiled its threaded loop in 3.0 s (once: numba caches it "
                                 "on disk)")
    build.qproduct_build(True, compiled.PANEL, True, FakeNjit(writable=True))  # compiled-quant's codes loop
    assert notes(caplog)[-1].startswith("kernel compiled-quant: compiled its 4-bit register blocks in ")


def test_a_panel_width_other_than_the_two_nests_is_compiled_in_memory_only(caplog):
    """numba's disk cache does not tell the widths apart (PANEL is a global panels_product reads), so only PANEL's
    build and the register blocks' (their own functions) are cached; another width (the bench's) compiles for this
    process, silently, and computes the same products."""
    caplog.set_level(logging.INFO, logger="npspec")
    njit = FakeNjit(writable=True)
    compiled.compiled_product(njit=njit, panel=blocks.PANEL)
    assert njit.options and all(o["cache"] for o in njit.options)
    njit = FakeNjit(writable=True)
    product = compiled.compiled_product(njit=njit, panel=4)
    assert [o["cache"] for o in njit.options] == [False] and notes(caplog) == []
    x, w = matrix(3, 9, seed=1, order="C"), matrix(9, 10)
    y = np.empty((3, 10), np.float32)
    product(x, compiled.pack(w, panel=4), y, 0, 3)
    assert np.array_equal(y, chain(x, w))


def test_an_odd_panel_width_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^a panel of compiled-panels has a positive even number of columns .* got 5$"):
        compiled.compiled_product(njit=FakeNjit(writable=True), panel=5)


@pytest.mark.slow  # long (>10 s): CI's second step
@needs_numba
def test_the_panel_width_does_not_change_a_bit():
    w, x = matrix(1280, 1283), matrix(6, 1280, seed=2, order="C")
    assert w.nbytes >= compiled.SPLIT_BYTES  # so that 3 threads really cut it into runs
    want = compiled.CompiledPanels(1)(x, w)
    for panel in (32, 96, blocks.PANEL):
        for threads in (1, 3):
            assert np.array_equal(compiled.CompiledPanels(threads, panel=panel)(x, w), want), (panel, threads)


@needs_numba
def test_compiled_quants_threaded_loop_builds_no_float_nest_at_its_codes_panel_width(monkeypatch):
    """It called runs_build(layers, 64) for numba's threading layer, which compiled compiled-panels' 64-column float
    nest too on a 256-bit host (8 s and 16 cache files at a first run, a note that read as a second compile)."""
    def no_float_nest(layers, panel):
        raise AssertionError(f"built compiled-panels' float nest at panel {panel}")
    monkeypatch.setattr(build, "runs_build", no_float_nest)
    runs, most = build.qruns_build.__wrapped__(True, compiled.LAYERS, compiled.PANEL, True)
    q, w = code_panels(16, 2 * compiled.PANEL, "int4-g4")
    x, y = matrix(2, 16, seed=3, order="C"), np.empty((2, 2 * compiled.PANEL), np.float32)
    runs(x, q.codes, q.scales, y, np.array([0, 1, 2], dtype=np.int64), min(2, most))
    assert np.array_equal(y, chain(x, w))


@needs_numba
def test_numba_is_told_to_try_openmp_first_and_more_threads_than_it_has_share_its_threads(monkeypatch):
    """numba's layers in LAYERS' order (OpenMP first), and a thread count past numba's NUMBA_NUM_THREADS cut into that
    many runs, run on numba's threads, with the same bits."""
    import numba
    monkeypatch.setattr(numba.config, "THREADING_LAYER_PRIORITY", ["tbb", "omp", "workqueue"])
    build.runs_build.cache_clear()  # so that this build sets the layers (loaded from numba's disk cache if there)
    kernel = compiled.CompiledPanels(numba.config.NUMBA_NUM_THREADS + 5)
    assert numba.config.THREADING_LAYER_PRIORITY == list(compiled.LAYERS) and compiled.LAYERS[0] == "omp"
    assert kernel.most_threads == numba.config.NUMBA_NUM_THREADS
    w, x = matrix(1280, 1283), matrix(5, 1280, seed=3, order="C")
    assert w.nbytes >= compiled.SPLIT_BYTES and np.array_equal(kernel(x, w), compiled.CompiledPanels(1)(x, w))

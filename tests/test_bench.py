"""bench/: the shared command line and its output rules, each measuring command's timing loops, and the --quick run of
every command (slow). The report is test_bench_report.py's, the committed runs test_bench_results.py's, the
controlled-acceptance drafters and --compare test_bench_controlled.py's."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from bench import common, models, primitives, speedup, verify_cost
from bench.common import RESULTS
from npspec.decode.evaluate import predicted_speedup

from conftest import run_python, tiny_model
from test_progress import BAR_MARKS, ON_A_TERMINAL


def pair(n_ctx=40):
    return tiny_model(seed=3, n_layer=2, n_ctx=n_ctx), tiny_model(seed=4, role="draft", n_layer=1, n_ctx=n_ctx)


def test_speedup_row_pools_the_runs_and_predicts_with_the_library_model():
    """One row builder serves the shipped and the controlled rows: pooled counts, npspec.decode.evaluate's speedup model."""
    target, draft = pair()
    prompts = [[1, 2, 3], [4, 5]]
    ar = speedup.median_run(speedup.runner(target, None, prompts, 8, 0), repeats=1)
    spec = speedup.paired_runs(speedup.runner(target, draft, prompts, 8, 2), lambda: (3 * ar[0], None), repeats=1,
                               pause=0)
    t, c = {1: 1.0, 2: 1.2, 3: 1.5}, 0.25
    speeds = {"gemm-blocks": ar[0], "gemv-rows": 2 * ar[0], "minimal": ar[0] / 2}
    row = speedup.speedup_row(("t", "d"), None, 2, 1, ar, spec, t, c, speeds)
    stats = [g.stats for g in spec[1]]
    assert row["fastest_ar"] == "gemv-rows" and row["fastest_ar_tok_s"] == 2 * ar[0]
    # the speedup divides by the plain decoding run beside the row's runs (here 3x the target's own), not the block's
    assert row["paired_ar_tok_s"] == 3 * ar[0] and row["speedup"] == spec[0] / (3 * ar[0])
    assert row["speedup_vs_target_ar"] == spec[0] / ar[0]
    assert row["identical"] is True  # greedy speculative == greedy AR on every prompt
    assert row["alpha"] == sum(s.accepted for s in stats) / sum(s.accepted + s.rejected for s in stats)
    assert row["predicted_speedup"] == predicted_speedup(row["alpha"], 2, c, 1.5)
    assert row["acceptance"] == "real" and row["a"] == ""
    controlled = speedup.speedup_row(("t", "d"), 0.7, 2, 1, ar, spec, t, c, speeds)
    assert controlled["predicted_speedup"] == predicted_speedup(0.7, 2, c, 1.5)  # alpha = the set acceptance a


def test_row_major_copy_computes_the_same_forward_through_gpt2():
    """verify_cost's row-major layout: a copy of the tree with C-order matrices; the Model keeps column-major ones."""
    model = tiny_model(n_embd=32, n_vocab=97).with_kernel("gemv-rows")
    params = models.row_major(model.params)
    w, w0 = params["h"][0]["mlp"]["c_fc"]["w"], model.params["h"][0]["mlp"]["c_fc"]["w"]
    assert w.flags.c_contiguous and w0.flags.f_contiguous and not np.shares_memory(w, w0)
    assert params["wte"] is model.params["wte"]  # everything else is shared
    ids = np.array([5, 6, 7])
    logits = verify_cost.kernel_forward(params, model.config, "gemv-rows", 1)(ids, model.new_cache())
    np.testing.assert_allclose(logits, model.forward(ids, model.new_cache()), rtol=1e-5, atol=1e-5)
    assert logits.dtype == np.float32


def test_command_line_parses_the_shared_options(tmp_path, capsys):
    run = common.command_line("bench.example", "One line.\n\nMore.", ["--out", str(tmp_path / "o"), "--threads", "1,2"])
    assert run.threads == [1, 2] and run.out.is_dir() and not run.args.quick
    assert run.meta["command"].startswith("python -m bench.example --out") and "numpy" in run.meta
    quick = common.command_line("bench.example", "doc", ["--quick", "--out", str(tmp_path / "q")], threads=("2", "3"))
    assert quick.threads == [3]  # the --quick default
    for bad in (["--threads", "0"], ["--threads", "x"]):
        with pytest.raises(SystemExit):
            common.command_line("bench.example", "doc", ["--out", str(tmp_path), *bad])
    with pytest.raises(SystemExit):  # a command measuring one thread count refuses two
        common.command_line("bench.example", "doc", ["--out", str(tmp_path), "--threads", "1,2"], many=False)
    capsys.readouterr()
    assert common.finish(run, [common.Table("t", [{"a": 1, "b": 2.5}], "Title", "A note.")]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {run.out / 't.md'}"  # the last line names what was written
    rows, meta = common.read_table(run.out / "t.csv")
    assert rows == [{"a": "1", "b": "2.5"}] and meta["command"] == run.meta["command"]


def test_quick_never_writes_into_committed_results():
    r = run_python("-m", "bench.verify_cost", "--quick", "--out", RESULTS / "quick")
    assert r.returncode != 0 and "never writes" in r.stderr
    assert not (RESULTS / "quick").exists()


@pytest.mark.slow  # long (>10 s with its fixture): CI's second step
def test_verify_cost_smoke(tmp_path):
    """A very small in-process run: the files exist and the numbers are sane (no timing asserted)."""
    assert verify_cost.main(["--quick", "--out", str(tmp_path), "--models", "shipped:target", "--max-m", "3",
                             "--repeats", "1", "--kernels", "gemv-rows,gemv-panels,gemm"]) == 0
    rows, meta = common.read_table(tmp_path / "verify_cost.csv")
    assert {"numpy", "blas", "blas_version", "machine", "date", "command"} <= set(meta)
    assert float(meta["read_bandwidth_GBps_1_threads"]) > 0
    # row-major: gemv-rows, gemm; column-major: the three kernels asked for; M = 1..3
    assert len(rows) == 5 * 3
    assert {(r["layout"], r["kernel"]) for r in rows} == {
        ("row-major", "gemv-rows"), ("row-major", "gemm"), ("column-major", "gemv-rows"),
        ("column-major", "gemv-panels"), ("column-major", "gemm")}
    for r in rows:
        assert float(r["seconds"]) > 0 and (r["M"] != "1" or float(r["v"]) == 1.0)
        assert float(r["roofline_v"]) >= 1.0 - 1e-9
        assert r["invariant"] == str(r["kernel"] != "gemm")
    assert (tmp_path / "verify_cost.md").read_text().startswith("# Verify cost")
    # the roofline reads at the best rate measured: no kernel above 1.0 of it, and the fastest at 1.0 unless the
    # probe read faster (the shipped model sits in cache, so its forwards outrun the probe's DRAM rate)
    summary, _ = common.read_table(tmp_path / "verify_cost_summary.csv")
    fractions = [float(r["of_roofline"]) for r in summary]
    assert max(fractions) <= 1 + 1e-9
    fastest = min(summary, key=lambda r: float(r["t1_ms"]))
    assert float(fastest["read_GBps"]) >= float(meta["read_bandwidth_GBps_1_threads"]) - 0.05


def test_ar_speeds_decode_with_every_kernel_in_turn_within_each_pass(monkeypatch):
    """Plain decodings in passes: a warm-up pass, then each pass decodes once with every kernel and the minimal
    decoder, in turn, a pause before each; the speeds are each decoder's median over the timed passes, and the
    target's own kernel's Generations come back with them."""
    order, pauses = [], []

    class Target:
        kernel, threads = "k2", 2

        def with_kernel(self, kernel, threads):
            assert threads == 2
            return kernel

    class Minimal:
        def __init__(self, target):
            pass

        def generate(self, prompt, n_new):
            order.append("minimal")
            return [0] * n_new, 0.5 * len(order)

    def runner(model, draft, prompts, new_tokens, gamma):
        assert draft is None and gamma == 0
        return lambda: order.append(model) or [f"{model} pass {len(pauses) // 3}"]
    monkeypatch.setattr(speedup, "AR_KERNELS", ("k1", "k2"))
    monkeypatch.setattr(speedup, "runner", runner)
    monkeypatch.setattr(speedup, "MinimalDecoder", Minimal)
    monkeypatch.setattr(speedup, "pooled", lambda gens: SimpleNamespace(tokens_per_s=len(order)))
    monkeypatch.setattr(speedup.time, "sleep", pauses.append)
    decoders = speedup.plain_decoders(Target(), [[1, 2]], 4, threads=2)
    assert order == []  # nothing decodes until ar_speeds runs them
    speeds, own = speedup.ar_speeds(decoders, "k2", repeats=3, pause=0.125)
    assert order == ["k1", "k2", "minimal"] * 4 and pauses == [0.125] * 12
    # speeds: len(order) when each decoding ended, passes 1-3 (k1: 4, 7, 10; k2: 5, 8, 11); minimal: 4 tokens in
    # 0.5 * len(order) s (6, 9, 12: 4/3, 8/9, 2/3)
    assert speeds == {"k1": 7, "k2": 8, "minimal": 4 / 4.5} and own == ["k2 pass 3"]


def test_paired_runs_follow_each_speculative_run_with_a_plain_one_and_take_the_median_ratio(monkeypatch):
    """A row's speculative runs alternate with plain decodings (a pause before each), after one speculative warm-up;
    the speedup is the median of the pairs' ratios, not the ratio of the medians."""
    order, pauses = [], []
    spec_speeds, plain_speeds = iter([99, 10, 30, 20]), iter([5, 20, 16])  # 99: the warm-up, not timed

    def spec():
        order.append("spec")
        return next(spec_speeds)
    monkeypatch.setattr(speedup, "pooled", lambda speed: SimpleNamespace(tokens_per_s=speed))
    monkeypatch.setattr(speedup.time, "sleep", pauses.append)
    speed, gens, plain, ratio = speedup.paired_runs(spec, lambda: order.append("plain") or (next(plain_speeds), None),
                                                    repeats=3, pause=0.25)
    assert order == ["spec"] + ["spec", "plain"] * 3 and pauses == [0.25] * 6
    # pairs (10, 5), (30, 20), (20, 16): ratios 2, 1.5, 1.25, median 1.5; the medians' ratio would be 20 / 16
    assert (speed, gens, plain, ratio) == (20, 20, 16, 1.5)


class SweptCache:  # the cache the time_sweep tests' fake model hands out: rolled back to its 4-token context
    def rollback(self, n):
        assert n == 4


class SweptModel:
    """A fake model for time_sweep(s): a 4-token context, prefilled on one BLAS thread, and no forward of its own."""

    config = SimpleNamespace(n_vocab=50)

    def new_cache(self):
        return SweptCache()

    def prefill(self, ids, cache, threads=None):
        assert len(ids) == 4 and threads == 1  # on one BLAS thread: none left spinning into the timings


def test_time_sweeps_time_every_forward_in_turn_within_each_pass_after_a_pause(monkeypatch):
    """Two forwards on a clock that slows down by half after every forward: each pass times forward "a" over every m,
    then "b", after a pause before each, so both see the drift of one pass: "b" (twice as slow as "a") comes out
    2 x 1.5^2 times slower, where sweeping "a" through every pass before "b" would have added the drift of 8."""
    clock, calls, rate, pauses = [0.0], [], [1.0], []


    def forward(key, cost):
        def run(ids, cache):
            calls.append((key, len(ids)))
            clock[0] += cost * len(ids) * rate[0]
            rate[0] *= 1.5
        return run
    monkeypatch.setattr(verify_cost.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(verify_cost.time, "sleep", pauses.append)
    swept = verify_cost.time_sweeps(SweptModel(), [1, 2], repeats=3, context=4,
                                    forwards={"a": forward("a", 1), "b": forward("b", 2)}, pause=0.25)
    assert calls == [("a", 1), ("a", 2), ("b", 1), ("b", 2)] * 4 and pauses == [0.25] * 8
    (ta, va), (tb, vb) = swept["a"], swept["b"]
    assert va == vb == {1: 1.0, 2: 3.0}  # t(2) / t(1) within a pass: 2 rows, one drift step later
    assert tb[1] / ta[1] == 2 * 1.5 ** 2  # b's pass part starts two forwards after a's
    assert verify_cost.time_sweep(SweptModel(), [1], 1, 4, forward("c", 1))[0][1] > 0 and len(pauses) == 8  # one: no pause


def test_time_sweep_times_every_m_in_turn_and_divides_within_a_pass(monkeypatch):
    """A fake model whose forward over m tokens takes m units of a clock that slows down by half after every forward:
    within one pass of time_sweep every m is timed once, in turn, so each pass's t(m) / t(1) sees only the drift of
    the forwards between them (run one m after another, t(3) would come a whole sweep later). The order of calls is
    the sweep's: m = 1, 2, 3, then again."""
    clock, calls, rate = [0.0], [], [1.0]

    class Fake(SweptModel):
        def forward(self, ids, cache):
            calls.append(len(ids))
            clock[0] += len(ids) * rate[0]
            rate[0] *= 1.5  # the machine slows down as the sweep goes on

    monkeypatch.setattr(verify_cost.time, "perf_counter", lambda: clock[0])
    seconds, v = verify_cost.time_sweep(Fake(), [1, 2, 3], repeats=3, context=4)
    assert calls == [1, 2, 3] * 4  # a warm-up pass, then three timed ones
    # in each pass t(m) = m * 1.5^(3p + m - 1): t(2) / t(1) = 3, t(3) / t(1) = 6.75 whatever the pass
    assert v == {1: 1.0, 2: 3.0, 3: 6.75}
    assert seconds[1] == 1.5 ** 6  # the median pass (the second timed one, p = 2)


def test_best_read_rate_takes_the_faster_reading():
    assert common.best_read_rate(10e9, 1e9, 0.2) == 10e9  # the forward read 5 GB/s: the probe's rate
    assert common.best_read_rate(10e9, 4e9, 0.2) == 20e9  # the forward read 20 GB/s: its own rate


def test_verify_cost_refuses_an_unknown_kernel(tmp_path):
    with pytest.raises(SystemExit):
        verify_cost.main(["--quick", "--out", str(tmp_path), "--kernels", "panels"])  # an old strategy name


QUICK = [("bench.verify_cost", ["verify_cost.csv", "verify_cost_summary.md"]),
         ("bench.speedup", ["speedup.csv", "speedup.md", "speedup_ar.csv"]),
         ("bench.sweep", ["sweep_gamma.csv", "sweep_position.csv", "sweep_temperature.md"]),
         ("bench.memory", ["memory.csv", "memory.md"]),
         ("bench.load", ["load.csv", "load.md"]),
         ("bench.profile", ["profile.md"]),
         ("bench.threads", ["threads.csv", "threads.md"]),
         ("bench.drafters", ["drafters_controlled.csv", "drafters_shipped.csv", "ngram_cost.csv"]),
         ("bench.trees", ["trees_controlled.csv", "trees_shipped.csv"]),
         ("bench.gap", ["gap_node.csv", "gap_tree.csv", "lossiness.csv"]),
         ("bench.quantized", ["quantized_beta.csv", "quantized_position.csv", "quantized_alpha.csv", "quantized.png"]),
         ("bench.qspeed", ["quantized_speed.csv", "quantized_speed_profile.csv", "quantized_speed_panels.md"]),
         ("bench.compare", ["compare.json"]),
         ("bench.primitives", ["primitives_rows.csv", "primitives_threads.md", "primitives_gil.csv"])]


@pytest.mark.slow
@pytest.mark.parametrize("module, files", QUICK)
def test_quick_mode_runs_end_to_end(tmp_path, module, files):
    r = run_python("-m", module, "--quick", "--out", tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1].startswith(f"wrote {tmp_path}")
    for name in files:
        assert (tmp_path / name).is_file(), name
    if files[0].endswith(".json"):  # the lead command: what npspec generate --compare --json printed
        record = json.loads((tmp_path / files[0]).read_text())
        assert record["command"].startswith("npspec generate") and "--simulate-acceptance" in record["command"]
        assert record["result"]["compare"]["same_ids"] is True and record["machine"]["numpy"] == np.__version__
        return
    if files[0].endswith(".md"):  # the profile: the kernel, which calls BLAS, is listed
        assert "products.py" in (tmp_path / files[0]).read_text()  # npspec/kernels/products.py
        return
    rows, meta = common.read_table(tmp_path / files[0])
    assert rows and meta["numpy"] == np.__version__
    if module in ("bench.speedup", "bench.drafters", "bench.trees"):
        assert all(row["identical"] == "True" for row in rows)  # greedy speculative == greedy AR, every row


@pytest.mark.slow
def test_quick_mode_defaults_to_a_temporary_folder():
    r = run_python("-m", "bench.sweep", "--quick")
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout.strip().splitlines()[-1]
    assert str(RESULTS) not in out and "npspec-bench-" in out


BENCH_ROWS = ON_A_TERMINAL.replace("from npspec.cli.generate import main\n", """from bench.common import log, steps
def main(argv):
    for i in steps(range(3), "bench rows"):
        log(f"row {i}")
    return 0
""")


def test_bench_rows_show_a_bar_on_a_terminal_and_none_when_piped(tmp_path):
    r = run_python("-c", BENCH_ROWS, text=False)
    terminal = r.stdout.decode("utf-8", "replace")
    assert r.returncode == 0 and "bench rows" in terminal and "%|" in terminal, terminal
    assert all(f"row {i}" in terminal for i in range(3))  # the log lines print above the bar
    piped = run_python("-c", "from bench.common import log, steps\nfor i in steps(range(3), 'bench rows'):\n"
                             "    log(f'row {i}')\n")
    assert piped.returncode == 0 and piped.stderr == "row 0\nrow 1\nrow 2\n", piped.stderr
    assert not any(mark in piped.stderr + piped.stdout for mark in BAR_MARKS)
    quiet = run_python("-c", BENCH_ROWS, text=False, env={"NPSPEC_QUIET": "1"})
    assert not any(mark in quiet.stdout.decode("utf-8", "replace") for mark in BAR_MARKS)


def test_primitives_smoke(tmp_path):
    """A tiny in-process run: the three tables, the rows asked for and over_gemv 1 for the GEMV itself (no timing asserted)."""
    assert primitives.main(["--out", str(tmp_path), "--shape", "tiny", "--layers", "2", "--repeats", "1",
                            "--threads", "2"]) == 0
    rows, meta = common.read_table(tmp_path / "primitives_rows.csv")
    assert meta["shape"] == "tiny" and [int(r["rows"]) for r in rows] == [1, *primitives.ROWS]
    assert float(rows[0]["over_gemv"]) == 1.0 and all(float(r["ms"]) > 0 for r in rows)
    threads, _ = common.read_table(tmp_path / "primitives_threads.csv")
    assert len(threads) == 3 and float(threads[-1]["over_blas"]) == 1.0
    gil, _ = common.read_table(tmp_path / "primitives_gil.csv")
    assert [int(r["output_elements"]) for r in gil] == list(primitives.GIL_OUTPUTS)


def test_column_ranges_cover_every_column_once():
    for d_out, n in [(768, 2), (50257, 2), (5, 3), (1280, 1)]:
        cuts = primitives.column_ranges(d_out, n)
        assert cuts[0][0] == 0 and cuts[-1][1] == d_out and all(b == c for (_, b), (c, _) in zip(cuts, cuts[1:]))

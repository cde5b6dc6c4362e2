"""bench/: the shared command line and its output rules, the report's reading of old and new result names, and the
--quick run of every command (slow). The controlled-acceptance drafters and --compare are in test_bench_controlled.py."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from bench import common, models, primitives, quantized, speedup, verify_cost
from bench.common import RESULTS
from bench.report import (END, README, ROOT, START, drafter_targets, newest, provenance, rewrite, section, shown, source,
                          speedup_model_check, verify_curves)
from npspec.decode.evaluate import expected_acceptance, predicted_speedup, validation_loss

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


def test_report_reads_old_and_new_result_names_alike(tmp_path):
    """Results written before the kernels were named (strategy rows/panels, layouts C/panel) report like new ones."""
    meta = {"date": "2026-01-01 00:00 UTC", "machine": "m", "load_average_1min_at_start": "0.5"}
    names = {("C", "rows"): ("row-major", "gemv-rows"), ("C", "gemm"): ("row-major", "gemm"),
             ("panel", "panels"): ("column-major", "gemv-panels"),
             ("panel", "panels-gemm"): ("column-major", "gemm-panels")}
    old_rows, new_rows = [], []
    for i, ((layout, strategy), (new_layout, kernel)) in enumerate(names.items()):
        figures = {"model": "random:gpt2", "threads": 1, "t1_ms": 10 + i, "v5": 1.5 + i, "roofline_v5": 1.0}
        old_rows.append({"layout": layout, "strategy": strategy, **figures})
        new_rows.append({"layout": new_layout, "kernel": kernel, **figures})
    old, new = tmp_path / "old", tmp_path / "new"
    for folder, rows in ((old, old_rows), (new, new_rows)):
        folder.mkdir()
        common.write_table(folder, "verify_cost_summary", rows, meta, "Verify cost summary")
    assert section(old).replace(shown(old), shown(new)) == section(new)  # each names its own folder
    # columns: gemv-panels, gemv-rows (row-major), gemm (row-major); gemm-panels is not reported
    assert "| gpt2 | 12.00 | 10.00 | 11.00 | 3.50 | 1.50 | 2.50 | 1.00 |" in section(new)


def test_speedup_model_check_applies_the_library_model_to_each_row(tmp_path):
    """Each row's own alpha, gamma, c and v go through npspec.decode.evaluate.predicted_speedup; cost_only uses the row's
    measured tokens per round. Pinned on two hand-made rows whose answers are known."""
    rows = [{"target": "t", "draft": "d", "acceptance": "real", "a": "", "gamma": 1, "alpha": 0.5,
             "tokens_per_round": 1.5, "speedup": 0.9, "c": 0.5, "v": 1.0},  # 1.5 / (1 * 0.5 + 1) = 1
            {"target": "t", "draft": "d", "acceptance": "controlled", "a": 0.7, "gamma": 4, "alpha": 1.0,
             "tokens_per_round": 4.0, "speedup": 2.0, "c": 0.25, "v": 1.5}]  # 5 / 2.5 = 2; measured 4 / 2.5
    common.write_table(tmp_path, "speedup", rows, {"date": "d"}, "t")
    one, two = speedup_model_check(tmp_path)
    assert (one["model"], one["cost_only"], one["measured"]) == (1.0, 1.0, 0.9)
    assert (two["model"], two["cost_only"], two["gamma"], two["a"]) == (2.0, 1.6, 4, "0.7")
    assert one["measured_vs_fastest"] is None and one["model_vs_fastest"] is None  # the file names no fastest


def test_speedup_model_check_compares_the_model_with_the_speedup_over_the_targets_own_plain_decoding(tmp_path):
    """The model's c and v are over the target's own one-token forward: it is compared with speedup_vs_target_ar,
    and scaled by ar / fastest before it is set beside the speedup over the fastest plain decoding."""
    rows = [{"target": "t", "draft": "d", "acceptance": "real", "a": "", "gamma": 1, "alpha": 0.5,
             "tokens_per_round": 1.5, "c": 0.5, "v": 1.0, "ar_tok_s": 8.0, "fastest_ar_tok_s": 10.0,
             "spec_tok_s": 9.0, "speedup": 0.9, "speedup_vs_target_ar": 1.125}]  # model 1.5 / 1.5 = 1
    common.write_table(tmp_path, "speedup", rows, {"date": "d"}, "t")
    (one,) = speedup_model_check(tmp_path)
    assert (one["model"], one["measured"], one["measured_vs_fastest"], one["model_vs_fastest"]) == (1.0, 1.125, 0.9, 0.8)


def test_committed_speedups_against_the_model():
    """The worked example of notes/derivation.md (claim 5), on the current committed run (RESULTS).

    Like with like: the model (c and v over the target's one-token forward) against the speedup over the target's
    own plain decoding. The model is right to within the noise of its isolated timings, not to 5%: measured / model
    lies between 0.8 and 1.35 for the shipped pair and between 0.8 and 1.6 for gpt2-large / distilgpt2, above 1 as
    often as below. The shipped pair beats the target's own plain decoding at gamma 1 to 3 and loses to the fastest
    plain decoding at every gamma."""
    rows = speedup_model_check(RESULTS)
    shipped = [r for r in rows if r["target"] == "shipped target"]
    large = [r for r in rows if r["target"] == "random:gpt2-large" and r["draft"] == "random:distilgpt2"]
    assert [r["gamma"] for r in shipped] == [1, 2, 3, 4, 8] and len(large) == 15
    for chosen, high in ((shipped, 1.35), (large, 1.6)):
        ratio = [r["measured"] / r["model"] for r in chosen]
        assert all(0.8 < x < high for x in ratio), ratio
        assert min(ratio) < 1 < max(ratio)  # the model errs both ways: noise, not a bias of the algebra
    assert all(r["measured"] > 1 for r in shipped if r["gamma"] <= 3)
    assert all(r["measured_vs_fastest"] < 1 for r in shipped)


def test_committed_verify_costs_by_kernel():
    """Claim 5's mechanism in the current committed curves (RESULTS; gpt2-large, 1 thread): the roofline says v = 1
    at every M measured (bandwidth bound); OpenBLAS' GEMM jumps to about 3 at M = 2; one GEMV per row grows about
    linearly; the panel kernels stay well below it at M = 5. The shipped target is far from its roofline at every
    kernel."""
    curves, meta = verify_curves("random:gpt2-large", 1, RESULTS)
    assert curves["roofline"] == [1.0] * len(curves["roofline"]) and len(curves["roofline"]) >= 9
    assert meta["read_bandwidth_GBps_1_threads"] and meta["gemm_peak_GFLOPs_1_threads"]
    gemm, rows, panels, blocks = (curves[k] for k in (("row-major", "gemm"), ("row-major", "gemv-rows"),
                                                     ("column-major", "gemv-panels"), ("column-major", "gemm-blocks")))
    assert gemm[1] > 2.5 and max(gemm) < 4  # M = 2 already costs about 3 one-row products, then flat
    assert 1.6 < rows[1] < 2.3 and rows[4] > 3  # each row streams the matrix again
    assert max(panels[4], blocks[4]) < 2.5 < rows[4]
    shipped, _ = verify_curves("shipped:target", 2, RESULTS)
    assert shipped["roofline"][4] == 1.0 and min(v[4] for k, v in shipped.items() if k != "roofline") > 1.3


def test_report_reads_the_newest_run_and_falls_back_to_the_earlier_one_saying_so(tmp_path):
    (tmp_path / "earlier").mkdir()
    for path in (tmp_path / "speedup.csv", tmp_path / "earlier" / "speedup.csv", tmp_path / "earlier" / "load.csv"):
        path.write_text("a\n1\n")
    assert newest(tmp_path, "speedup.csv") == tmp_path / "speedup.csv"  # the newest run wins
    assert newest(tmp_path, "load.csv") == tmp_path / "earlier" / "load.csv"
    assert newest(tmp_path, "memory.csv") is None
    assert shown(tmp_path / "earlier" / "load.md") == "bench/results/earlier/load.md"
    assert provenance(tmp_path / "speedup.csv") == ""
    assert provenance(tmp_path / "earlier" / "load.csv") == " (from the earlier run: `bench/results/earlier/load.csv`)"


def test_report_rewrites_only_between_markers():
    text = f"intro\n{START}\nold\n{END}\noutro\n"
    assert rewrite(text, "new") == f"intro\n{START}\nnew\n{END}\noutro\n"
    with pytest.raises(ValueError, match="markers"):
        rewrite("no markers here", "new")


def test_readme_performance_section_is_generated_from_committed_results():
    """README quotes only figures bench/ wrote: its section must equal what bench.report generates from the one
    run's folder the section names."""
    text = README.read_text(encoding="utf-8")
    folder = source(text)
    assert folder.is_dir() and folder.is_relative_to(RESULTS), folder
    assert rewrite(text, section(folder)) == text, "README.md is stale: run python -m bench.report"


def test_report_names_the_folder_it_read_and_reads_it_again(tmp_path):
    """The section says which folder it came from, repository-relative, and `source` finds that folder in it; a
    section that names none is bench/results/'s (the sections written before they named their folder)."""
    run = RESULTS / "issue24" / "intel3" / "run_all"  # a whole run_all.sh run, committed
    body = section(run)
    assert "`python -m bench.report --results bench/results/issue24/intel3/run_all`" in body
    assert "`bench/results/issue24/intel3/run_all/compare.json`" in body  # each file by its own path
    assert source(f"{START}\n{body}\n{END}") == run and source("no folder named") == RESULTS
    assert shown(ROOT / "README.md") == "README.md"
    r = run_python("-m", "bench.report", "--check", "--results", tmp_path / "missing")
    assert r.returncode == 2 and "no such folder" in r.stderr, r.stderr


QUICK = [("bench.verify_cost", ["verify_cost.csv", "verify_cost_summary.md"]),
         ("bench.speedup", ["speedup.csv", "speedup.md", "speedup_ar.csv"]),
         ("bench.sweep", ["sweep_gamma.csv", "sweep_position.csv", "sweep_temperature.md"]),
         ("bench.memory", ["memory.csv", "memory.md"]),
         ("bench.load", ["load.csv", "load.md"]),
         ("bench.profile", ["profile.md"]),
         ("bench.threads", ["threads.csv", "threads.md"]),
         ("bench.drafters", ["drafters_controlled.csv", "drafters_shipped.csv", "ngram_cost.csv"]),
         ("bench.trees", ["trees_controlled.csv", "trees_shipped.csv"]),
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
        assert "kernels.py" in (tmp_path / files[0]).read_text()
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


def test_drafter_targets_are_judged_from_the_rows():
    row = dict(target="random:gpt2-large", schedule="constant", a="0.7")
    controlled = [dict(row, strategy="ngram", gamma="2", speedup="1.4", tok_s="14"),
                  dict(row, strategy="ngram", gamma="4", speedup="1.6", tok_s="16"),
                  dict(row, strategy="ngram", gamma="4", schedule="heuristic", speedup="1.5", tok_s="15.5")]
    cost = [{"n_ctx": "256", "lookup_share": "0.01"}, {"n_ctx": "1024", "lookup_share": ""}]
    (s1, ok1, m1), (s2, ok2, m2), (s3, ok3, m3) = drafter_targets(controlled, cost)
    assert ok1 and "1.60x at gamma 4" in m1 and ok2 and "0.97" in m2 and ok3 and "256" in s3
    controlled[2]["tok_s"] = "15"  # 15 / 16 < 0.95
    assert not drafter_targets(controlled, cost)[1][1]


def test_readme_introduction_says_when_it_pays_with_committed_figures():
    """README tells a newcomer first when speculative decoding pays on a CPU, quoting only figures bench/ committed
    (bench/results/: the newest run, speedups over the fastest plain decoding), and the command
    it gives is one npspec generate accepts."""
    readme = README.read_text(encoding="utf-8")
    intro = readme[:readme.index("## Quick start")]
    assert "pays only when the target streams its weights" in intro and "fits in the CPU's" in intro
    run = source(readme)  # the run README's Performance section quotes
    assert f"`{shown(run / 'speedup.md')}`" in intro
    rows, _ = common.read_table(run / "speedup.csv")

    def speedup_of(target, draft, a, gamma):
        [row] = [r for r in rows if (r["target"], r["draft"], r["a"], r["gamma"]) == (target, draft, a, gamma)]
        assert float(row["fastest_ar_tok_s"]) >= float(row["ar_tok_s"])  # over the fastest plain decoding
        return f"{float(row['speedup']):.2f}x"

    for figure in (speedup_of("random:gpt2-large", "random:distilgpt2", "0.7", "3"),
                   speedup_of("random:gpt2-large", "random:distilgpt2", "0.9", "4"),
                   speedup_of("random:gpt2-medium", "random:distilgpt2", "0.7", "3"),
                   speedup_of("shipped target", "shipped draft", "", "3")):
        assert figure in intro, figure
    compare = json.loads((run / "compare.json").read_text())["result"]["compare"]
    assert f"{compare['speedup']:.2f}x" in intro
    [command] = [line for line in intro.splitlines() if line.startswith("npspec generate")]
    assert "--simulate-acceptance" in command and "--compare" in command
    options = run_python("-m", "npspec.generate", "--help").stdout
    assert all(word in options for word in command.split() if word.startswith("--"))


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

"""bench/ (issue 5): the controlled-acceptance harness, the output rules, and the --quick runs."""

import math
import subprocess
import sys

import numpy as np
import pytest

from bench.common import RESULTS
from bench.controlled import ControlledDraft
from npspec.speculative import speculative_generate

from conftest import ROOT, tiny_model


def pair(n_ctx=40):
    return tiny_model(seed=3, n_layer=2, n_ctx=n_ctx), tiny_model(seed=4, n_layer=1, n_ctx=n_ctx)


def controlled_run(target, draft, prompt, n_new, a, gamma, seed):
    greedy = speculative_generate(target, None, prompt, n_new, gamma=0, temperature=0).ids
    steered = ControlledDraft(draft, list(prompt) + greedy, a, np.random.default_rng(seed))
    gen = speculative_generate(target, steered, prompt, n_new, gamma=gamma, temperature=0)
    assert gen.ids == greedy  # the loop is unchanged: greedy output stays token-identical
    return gen.stats, steered


@pytest.mark.parametrize("gamma", [1, 4])
def test_controlled_acceptance_one_accepts_every_draft(gamma):
    target, draft = pair()
    s, steered = controlled_run(target, draft, [1, 2, 3], 30, a=1.0, gamma=gamma, seed=0)
    assert s.rejected == 0 and s.accepted == s.drafted > 0 and s.alpha == 1.0
    assert steered.correct == steered.proposals  # every steered row got the greedy token


@pytest.mark.parametrize("gamma", [1, 4])
def test_controlled_acceptance_zero_accepts_none(gamma):
    target, draft = pair()
    s, steered = controlled_run(target, draft, [1, 2, 3], 30, a=0.0, gamma=gamma, seed=0)
    # one draft tested and rejected per round, but the last: its gamma is clamped to remaining - 1 = 0
    assert s.accepted == 0 and s.rounds == 30 and s.rejected == 29 and s.drafted >= 29
    assert steered.correct == 0


def test_controlled_acceptance_steers_the_real_draft_forward():
    target, draft = pair()
    steered = ControlledDraft(draft, [1, 2, 3, 4, 5, 6], 1.0, np.random.default_rng(0))
    cache = steered.new_cache()
    logits = steered.forward(np.array([1, 2, 3]), cache)
    assert cache.length == 3  # the draft's own cache advanced: its forward really ran
    assert logits.shape == (3, draft.config.n_vocab) and logits.dtype == np.float32
    assert list(np.argmax(logits, axis=-1)) == [2, 3, 4]  # row j predicts position j + 1
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        ControlledDraft(draft, [1], 1.5, np.random.default_rng(0))


@pytest.mark.slow
@pytest.mark.parametrize("a", [0.3, 0.6, 0.9])
def test_controlled_acceptance_matches_a_within_sampling_error(a):
    """Each tested draft is accepted with probability a, independently.

    Test: the number accepted among the n tested drafts, pooled over 4 runs, against
    Binomial(n, a) with the normal approximation: |accepted - n a| <= 3.29 sqrt(n a (1 - a)),
    a two-sided false-alarm rate of 0.1% per a (0.3% for the three). Which drafts get tested
    depends only on earlier outcomes (a stopping rule), so the count is still a sum of
    independent Bernoulli(a) outcomes. Fixed seeds: the result is reproducible.
    """
    target, draft = pair(n_ctx=400)
    accepted = tested = 0
    for seed in range(4):
        s, _ = controlled_run(target, draft, [seed + 1, 7], 380, a=a, gamma=4, seed=seed)
        accepted, tested = accepted + s.accepted, tested + s.accepted + s.rejected
    assert tested > 500
    assert abs(accepted - tested * a) <= 3.29 * math.sqrt(tested * a * (1 - a)), (accepted, tested)


def run(module, *args):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=900)


def test_quick_never_writes_into_committed_results():
    r = run("bench.verify_cost", "--quick", "--out", str(RESULTS / "quick"))
    assert r.returncode != 0 and "never writes" in r.stderr
    assert not (RESULTS / "quick").exists()


def test_verify_cost_smoke(tmp_path):
    """A very small in-process run: the files exist and the numbers are sane (no timing asserted)."""
    pytest.importorskip("threadpoolctl", reason="needs the bench extra: pip install -e '.[bench]'")
    from bench import common, verify_cost

    assert verify_cost.main(["--quick", "--out", str(tmp_path), "--models", "shipped:target", "--max-m", "3",
                             "--repeats", "1", "--strategies", "rows,panels,gemm"]) == 0
    rows, meta = common.read_table(tmp_path / "verify_cost.csv")
    assert {"numpy", "blas", "blas_version", "machine", "date"} <= set(meta)
    assert float(meta["read_bandwidth_GBps_1_threads"]) > 0
    # C layout: rows, gemm; panel layout: rows, panels, gemm; M = 1..3
    assert len(rows) == 5 * 3
    assert {(r["layout"], r["strategy"]) for r in rows} == {("C", "rows"), ("C", "gemm"), ("panel", "rows"),
                                                            ("panel", "panels"), ("panel", "gemm")}
    for r in rows:
        assert float(r["seconds"]) > 0 and (r["M"] != "1" or float(r["v"]) == 1.0)
        assert float(r["roofline_v"]) >= 1.0 - 1e-9
    assert (tmp_path / "verify_cost.md").read_text().startswith("# Verify cost")


def test_report_rewrites_only_between_markers(tmp_path):
    from bench.report import END, START, rewrite

    text = f"intro\n{START}\nold\n{END}\noutro\n"
    assert rewrite(text, "new") == f"intro\n{START}\nnew\n{END}\noutro\n"
    with pytest.raises(ValueError, match="markers"):
        rewrite("no markers here", "new")


def test_readme_performance_section_is_generated_from_committed_results():
    """README quotes only figures bench/ wrote: its section must equal what bench.report generates."""
    from bench.report import README, rewrite, section

    text = README.read_text(encoding="utf-8")
    assert rewrite(text, section()) == text, "README.md is stale: run python -m bench.report"


QUICK = [("bench.verify_cost", ["verify_cost.csv", "verify_cost_summary.md"]),
         ("bench.speedup", ["speedup.csv", "speedup.md", "speedup_ar.csv"]),
         ("bench.sweep", ["sweep_gamma.csv", "sweep_position.csv", "sweep_temperature.md"]),
         ("bench.memory", ["memory.csv", "memory.md"]),
         ("bench.profile", ["profile.md"]),
         ("bench.threads", ["threads.csv", "threads.md"])]


@pytest.mark.slow
@pytest.mark.parametrize("module, files", QUICK)
def test_quick_mode_runs_end_to_end(tmp_path, module, files):
    pytest.importorskip("threadpoolctl", reason="needs the bench extra: pip install -e '.[bench]'")
    from bench import common

    r = run(module, "--quick", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    for name in files:
        assert (tmp_path / name).is_file(), name
    if files[0].endswith(".md"):
        assert "linear_panels" in (tmp_path / files[0]).read_text()  # the BLAS-calling function is listed
        return
    rows, meta = common.read_table(tmp_path / files[0])
    assert rows and meta["numpy"] == np.__version__
    if module == "bench.speedup":
        assert all(row["identical"] == "True" for row in rows)  # greedy speculative == greedy AR, every row


@pytest.mark.slow
def test_quick_mode_defaults_to_a_temporary_folder():
    pytest.importorskip("threadpoolctl", reason="needs the bench extra: pip install -e '.[bench]'")
    r = run("bench.sweep", "--quick")
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout.strip().splitlines()[-1]
    assert str(RESULTS) not in out and "npspec-bench-" in out


def test_generate_compare_prints_both_speeds_and_the_ratio():
    r = run("npspec.generate", "--compare", "--temperature", "0", "--max-new-tokens", "12")
    assert r.returncode == 0, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("compare: speculative") and "plain" in line and "speedup" in line
    assert line.endswith("same output")  # greedy: speculative output == plain output
    spec, plain, ratio = (float(w.rstrip("x,")) for w in line.split() if w[0].isdigit())
    assert abs(ratio - spec / plain) < 0.01 * ratio + 0.006  # the printed ratio is the printed speeds' ratio
    r = run("npspec.generate", "--compare", "--json", "--max-new-tokens", "6")
    import json
    c = json.loads(r.stdout)["compare"]
    assert c["same_ids"] is None and c["speedup"] == c["speculative_tokens_per_s"] / c["plain_tokens_per_s"]

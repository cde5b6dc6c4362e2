"""bench/verification.py: the ratio estimator's interval and its paired difference (exact, on hand-made runs), and the
command end to end on the shipped pair (rows, greedy identity of block and token and of both tree rules, the paired
tables agreeing with the per-rule ones); the exact-match tables' per-position expectations (Expectations, exact on
hand-made rows), paired intervals on Stats, and the committed run (bench/results/exact-match-epyc) agreeing with
itself and its command. No timing is asserted."""

import math
from dataclasses import astuple

import numpy as np
import pytest

from bench import common, verification
from bench.common import RESULTS
from npspec.decode import RULES, Stats, accept
from npspec.decode.rules import exact_match_accept

from conftest import run_python


def test_ratio_is_the_pooled_ratio_with_the_ratio_estimators_error():
    # runs (num, den) = (1, 1), (2, 1), (3, 2): r = 6 / 4; residuals -0.5, 0.5, 0; mean den 4 / 3
    r, se = verification.ratio([1, 2, 3], [1, 1, 2])
    assert r == 1.5
    assert math.isclose(se, math.sqrt(0.5 / 6) / (4 / 3), rel_tol=1e-15)
    x = np.array([3.0, 1.0, 4.0, 1.0, 5.0])  # den all 1: the mean and its usual standard error
    r, se = verification.ratio(x, np.ones(5))
    assert r == x.mean() and math.isclose(se, x.std(ddof=1) / math.sqrt(5), rel_tol=1e-12)
    assert math.isnan(verification.ratio([2], [1])[1])  # one run: no interval
    with pytest.raises(ValueError, match="positive total"):
        verification.ratio([1, 2], [0, 0])


def test_paired_difference_cancels_what_both_runs_share():
    num, den = np.array([3.0, 5.0, 4.0, 9.0]), np.array([2.0, 3.0, 2.0, 4.0])
    assert verification.paired_difference(num, den, num, den) == (0.0, 0.0)
    # b = a + 0.5 per unit of den on every run: the ratio moves by exactly 0.5 and the run-to-run spread cancels
    diff, se = verification.paired_difference(num, den, num + 0.5 * den, den)
    assert math.isclose(diff, 0.5, rel_tol=1e-15) and se < 1e-12
    # independent-looking runs: the paired se is the one of the per-run linearised differences
    b_num, b_den = np.array([4.0, 4.0, 6.0, 8.0]), np.array([2.0, 2.0, 3.0, 4.0])
    diff, se = verification.paired_difference(num, den, b_num, b_den)
    r_a, r_b = num.sum() / den.sum(), b_num.sum() / b_den.sum()
    z = (b_num - r_b * b_den) / b_den.mean() - (num - r_a * den) / den.mean()
    assert diff == r_b - r_a and math.isclose(se, math.sqrt((z ** 2).sum() / 12), rel_tol=1e-12)


def test_paired_pools_each_arms_stats_and_pairs_them_run_by_run():
    # mean_acceptance_length = (accepted + drafts) / drafts; three runs of each arm, run i of a paired with run i of b
    a = [Stats(accepted=a_, rounds=d) for a_, d in ((3, 2), (5, 4), (1, 2))]
    b = [Stats(accepted=b_, rounds=d) for b_, d in ((1, 2), (2, 4), (0, 2))]
    got = verification.paired(a, b, ("mean_acceptance_length",))
    assert set(got) == {"mean_acceptance_length_diff", "mean_acceptance_length_diff_ci95"}  # no tok_s: no gain
    num_a, num_b, den = np.array([5.0, 9.0, 3.0]), np.array([3.0, 6.0, 2.0]), np.array([2.0, 4.0, 2.0])
    r_a, r_b = 17 / 8, 11 / 8
    z = (num_b - r_b * den) / (8 / 3) - (num_a - r_a * den) / (8 / 3)
    assert math.isclose(got["mean_acceptance_length_diff"], r_b - r_a, rel_tol=1e-15)
    assert math.isclose(got["mean_acceptance_length_diff_ci95"], verification.Z95 * math.sqrt((z ** 2).sum() / 6),
                        rel_tol=1e-12)
    assert math.isclose(verification.figures(b, ("mean_acceptance_length",))["mean_acceptance_length"], r_b)


def test_expectations_add_what_each_rule_tested_and_leave_its_result_alone():
    p = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])  # target rows after 0, 1, 2 drafts
    q = np.array([[0.5, 0.25, 0.25], [0.0, 0.5, 0.5]])  # draft rows
    d = np.array([0, 2])
    u = np.array([0.3, 0.9])  # token: p / q = 1 at both drafts, both kept
    saved = dict(RULES)
    with verification.Expectations(("token", "exact-match")) as e:
        assert RULES["token"].chain is not accept and RULES["block"] is saved["block"]
        assert RULES["token"].chain(d, p, q, u, 0.5) == accept(d, p, q, u, 0.5)  # 2 kept: both positions tested
        assert RULES["exact-match"].chain(d, p, q, np.array([0.3, 0.1]), 0.5) == \
            exact_match_accept(d, p, q, np.array([0.3, 0.1]), 0.5)  # the target samples 0 then 0 != 2: both tested
        assert RULES["exact-match"].chain(d, p, q, np.array([0.9, 0.1]), 0.5)[0] == 0  # sample 1 != 0: only d_0 tested
        RULES["token"].chain(d[:0], p[:1], q[:0], u[:0], 0.5)  # no proposal: nothing tested, no draft counted
        sums = e.take()
        assert e.take()["token"] == verification.Sums()  # take resets
    assert RULES == saved  # the registry is restored
    pq, mins = [0.25 + 0.125, 0.0 + 0.15 + 0.25], [0.5 + 0.25, 0.0 + 0.3 + 0.5]  # per position
    assert astuple(sums["token"]) == pytest.approx((sum(pq), sum(mins), 2, 1), rel=1e-15)
    assert astuple(sums["exact-match"]) == pytest.approx((2 * pq[0] + pq[1], 2 * mins[0] + mins[1], 3, 2), rel=1e-15)
    with pytest.raises(RuntimeError), verification.Expectations(("block",)):
        raise RuntimeError
    assert RULES == saved


def test_expected_is_one_plus_the_rules_chances_per_draft_round():
    sums = [verification.Sums(pq=0.5, mins=1.5, tested=3, drafts=2), verification.Sums(pq=1.0, mins=2.0, tested=4,
                                                                                       drafts=3)]
    stats = [Stats(accepted=a, rounds=d) for a, d in ((1, 2), (2, 3))]
    got = verification.expected(stats, sums, "exact-match")
    assert math.isclose(got["sum_pq"], 1.5 / 7) and math.isclose(got["sum_min"], 3.5 / 7)
    assert math.isclose(got["expected_mean_acceptance_length"], 1 + 1.5 / 5)
    assert math.isclose(got["expected_minus_measured"], 1.5 / 5 - 3 / 5)
    token = verification.expected(stats, sums, "token")
    assert math.isclose(token["expected_mean_acceptance_length"], 1 + 3.5 / 5)
    assert "expected_mean_acceptance_length" not in verification.expected(stats, sums, "block")  # no such estimate


def check_exact_match_tables(out, gammas, runs):
    rows, meta = common.read_table(out / "verification_exact_match.csv")
    assert [(float(r["temperature"]), int(r["gamma"]), r["verify"]) for r in rows] == \
        [(t, g, v) for t in (0.0, *verification.TEMPERATURES) for g in gammas for v in verification.STRICT]
    assert "--tables exact-match" in meta["command"] and "tok_s" not in rows[0] and "paper" not in meta
    assert all(r["identical"] == "True" for r in rows if float(r["temperature"]) == 0)
    sampled = [r for r in rows if float(r["temperature"])]
    assert all(int(r["runs"]) == runs and r["tests_seen"] == "True" for r in sampled)
    for r in sampled:
        assert 0 <= float(r["sum_pq"]) <= float(r["sum_min"]) <= 1  # p q <= min(p, q) at every x
        assert (r["expected_mean_acceptance_length"] == "") == (r["verify"] == "block")
    pairs, _ = common.read_table(out / "verification_exact_match_paired.csv")
    assert [(float(p["temperature"]), int(p["gamma"]), p["pair"]) for p in pairs] == \
        [(t, g, f"exact-match - {v}") for t in verification.TEMPERATURES for g in gammas for v in ("token", "block")]
    by_key = {(r["temperature"], r["gamma"], r["verify"]): r for r in rows}
    for p in pairs:
        other, strict = (by_key[(p["temperature"], p["gamma"], v)] for v in (p["pair"].split(" - ")[1], "exact-match"))
        keys = [(f, f) for f in verification.ACCEPTANCE] + [("expected_mean_acceptance_length",) * 2] * \
            (other["verify"] == "token")
        for diff, figure in keys:
            assert math.isclose(float(p[f"{diff}_diff"]), float(strict[figure]) - float(other[figure]), rel_tol=1e-9,
                                abs_tol=1e-12), (p, figure)
        assert float(p["mean_acceptance_length_diff_ci95"]) >= 0 and int(p["runs"]) == runs
    return rows, pairs, meta


def test_the_exact_match_tables_on_the_shipped_pair(tmp_path):
    out = tmp_path / "em"
    assert verification.main(["--quick", "--out", str(out), "--tables", "exact-match", "--gammas", "2,3",
                              "--new-tokens", "12"]) == 0
    check_exact_match_tables(out, (2, 3), 2)


def test_the_committed_exact_match_run_agrees_with_itself_and_its_command():
    out = RESULTS / "exact-match-epyc"
    rows, pairs, meta = check_exact_match_tables(out, verification.GAMMAS, 48)
    assert meta["command"].split()[:5] == ["python", "-m", "bench.verification", "--tables", "exact-match"]
    assert meta["runs"].startswith("16 validation prompts of 16 ids x 3 seeds, 64 new tokens each")
    assert "blas" in meta and "numpy" in meta and meta["machine"]
    for r in rows:  # the martingale: each rule's own expectation lies within its paired interval of the measure
        if r["expected_minus_measured"]:
            assert abs(float(r["expected_minus_measured"])) <= 2 * float(r["expected_minus_measured_ci95"]), r


def check_tables(out, gammas):
    rows, meta = common.read_table(out / "verification_chain.csv")
    temperatures = (0.0, *verification.TEMPERATURES)
    assert [(float(r["temperature"]), int(r["gamma"]), r["verify"]) for r in rows] == \
        [(t, g, v) for t in temperatures for g in gammas for v in verification.RULES]
    assert meta["command"].startswith("python -m bench.verification") and "load_average_1min_at_start" in meta
    for r in rows:
        assert float(r["mean_acceptance_length"]) >= 1 and 0 <= float(r["alpha"]) <= 1
        assert float(r["mean_acceptance_length_ci95"]) >= 0 and float(r["rule_us"]) > 0
        assert float(r["top_p"]) == 1.0
    greedy = [r for r in rows if float(r["temperature"]) == 0]
    assert greedy and all(r["identical"] == "True" for r in greedy)  # block's ids == token's == plain greedy's
    for token, block in zip(greedy[::2], greedy[1::2]):  # at temperature 0 both rules keep the same drafts
        for key in ("new_tokens", "rounds", "mean_acceptance_length", "alpha", "tokens_per_round"):
            assert token[key] == block[key], key
    pairs, _ = common.read_table(out / "verification_chain_paired.csv")
    assert [(float(p["temperature"]), int(p["gamma"])) for p in pairs] == \
        [(t, g) for t in verification.TEMPERATURES for g in gammas]
    by_key = {(r["temperature"], r["gamma"], r["verify"]): r for r in rows}
    for p in pairs:  # the paired difference is the difference of the two rows' pooled figures
        token, block = (by_key[(p["temperature"], p["gamma"], v)] for v in ("token", "block"))
        for figure in ("mean_acceptance_length", "alpha", "tokens_per_round"):
            assert math.isclose(float(p[f"{figure}_diff"]), float(block[figure]) - float(token[figure]),
                                rel_tol=1e-9, abs_tol=1e-12)
        assert float(p["mean_acceptance_length_diff_ci95"]) >= 0 and p["paper_tok_s_gain"]
    assert "5-8%" in (out / "verification_chain_paired.md").read_text()


def check_tree_tables(out, trees):
    rows, _ = common.read_table(out / "verification_tree.csv")
    assert [(float(r["temperature"]), r["tree"], r["verify"], r["children"]) for r in rows] == \
        [(t, ",".join(map(str, b)), v, c) for t in (0.0, *verification.TEMPERATURES) for b in trees
         for v, c in (("token", "i.i.d."), ("rsd", "without replacement"))]
    greedy = [r for r in rows if float(r["temperature"]) == 0]
    assert all(r["identical"] == "True" for r in greedy)  # both tree rules are plain greedy decoding at 0
    for iid, rsd in zip(greedy[::2], greedy[1::2]):
        assert (iid["rounds"], iid["mean_acceptance_length"]) == (rsd["rounds"], rsd["mean_acceptance_length"])
    pairs, _ = common.read_table(out / "verification_tree_paired.csv")
    by_key = {(r["temperature"], r["tree"], r["verify"]): r for r in rows}
    assert len(pairs) == len(verification.TEMPERATURES) * len(trees)
    for p in pairs:
        iid, rsd = (by_key[(p["temperature"], p["tree"], v)] for v in ("token", "rsd"))
        assert math.isclose(float(p["mean_acceptance_length_diff"]),
                            float(rsd["mean_acceptance_length"]) - float(iid["mean_acceptance_length"]),
                            rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_the_command_measures_both_rules_on_the_shipped_pair(tmp_path, capsys):
    out = tmp_path / "v"
    assert verification.main(["--quick", "--out", str(out), "--gammas", "2,3", "--new-tokens", "12", "--trees",
                              "2;1,1"]) == 0
    names = ("verification_chain", "verification_chain_paired", "verification_tree", "verification_tree_paired")
    assert capsys.readouterr().out.strip() == "wrote " + ", ".join(str(out / f"{name}.md") for name in names)
    check_tables(out, (2, 3))
    check_tree_tables(out, ((2,), (1, 1)))
    only = tmp_path / "only"
    assert verification.main(["--quick", "--out", str(only), "--tables", "tree", "--trees", "2", "--new-tokens",
                              "6"]) == 0
    assert sorted(p.name for p in only.glob("*.csv")) == ["verification_tree.csv", "verification_tree_paired.csv"]


@pytest.mark.slow
def test_quick_mode_runs_end_to_end(tmp_path):
    r = run_python("-m", "bench.verification", "--quick", "--out", tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1].startswith(f"wrote {tmp_path}")
    check_tables(tmp_path, (2, 4))
    check_tree_tables(tmp_path, ((2, 1),))


def test_bad_sizes_are_usage_errors(tmp_path, capsys):
    for bad, message in ((["--prompts", "0"], "integer >= 1"), (["--gammas", "2,x"], "integer >= 1"),
                         (["--new-tokens", "-3"], "integer >= 1"), (["--trees", "2;0"], "integer >= 1"),
                         (["--tables", "block"], "invalid choice")):
        with pytest.raises(SystemExit) as e:
            verification.main(["--quick", "--out", str(tmp_path), *bad])
        assert e.value.code == 2 and message in capsys.readouterr().err
    r = run_python("-m", "bench.verification", "--quick", "--out", RESULTS / "quick")
    assert r.returncode != 0 and "never writes" in r.stderr and not (RESULTS / "quick").exists()

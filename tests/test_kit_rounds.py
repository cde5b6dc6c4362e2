"""The round-level kit (npspec.testing.rounds) on samplers written without npspec: a correct one passes, and
each classic bug that the one-draft interface cannot express (the bonus from the draft, a top-50 warp reporting
the unwarped q, rows off by one) fails with a finding that names it; on GPT-2's 50,257 ids, rows that differ by
position, logits with ties and -inf."""

import numpy as np
import pytest

from npspec import testing as kit
from npspec.decode.drafters import ModelDrafter
from npspec.decode.sampling import warp


# ---- a round written from the paper alone, in plain NumPy (no npspec), and its classic bugs

def my_warp(logits, temperature, top_k, top_p):  # [n, V] -> [n, V] float64
    x = np.asarray(logits, dtype=np.float64)
    if temperature == 0:
        out = np.zeros_like(x)
        out[np.arange(len(x)), x.argmax(axis=1)] = 1.0
        return out
    x = (x - x.max(axis=1, keepdims=True)) / temperature
    if top_k:
        kth = -np.sort(-x, axis=1)[:, top_k - 1:top_k]
        x = np.where(x < kth, -np.inf, x)
    probs = np.exp(x)
    probs /= probs.sum(axis=1, keepdims=True)
    if top_p < 1:
        for row in probs:
            order = np.argsort(row, kind="stable")
            cut = np.cumsum(row[order]) <= 1 - top_p
            cut[-1] = False
            row[order[cut]] = 0.0
        probs /= probs.sum(axis=1, keepdims=True)
    return probs


def draw(row, u):  # inverse CDF
    cdf = np.cumsum(row)
    return int(np.searchsorted(cdf, u * cdf[-1], side="right"))


def make_round(bug=None):
    def round_fn(draft_logits, target_logits, u, warping):
        g = len(draft_logits) - 1
        q, p = my_warp(draft_logits, **warping), my_warp(target_logits, **warping)
        q_test = my_warp(draft_logits, 1.0, 0, 1.0) if bug == "q-unwarped" else q  # BUG: sampled from q, tests raw q
        p_test = np.concatenate([p[1:], p[-1:]]) if bug == "rows-off-by-one" else p  # BUG: d_i against p_(i+1)
        last = (lambda row, v: int(row.argmax())) if bug == "argmax-everywhere" else draw  # BUG: greedy at any T
        drafts = [int(q[i].argmax()) if bug and bug.startswith("argmax") else draw(q[i], u[i]) for i in range(g)]
        for i, d in enumerate(drafts):
            ratio = p_test[i, d] / q_test[i, d]
            if not (u[g + i] <= ratio if bug == "non-strict" else u[g + i] < ratio):
                r = np.maximum(p[i] - q_test[i], 0)
                return drafts, i, last(r / r.sum() if r.sum() > 0 else p[i], u[2 * g])
        bonus = q[g] if bug == "bonus-from-draft" else p[g]  # BUG: the bonus from the draft's next row
        return drafts, g, last(bonus, u[2 * g])
    return round_fn


def test_a_correct_round_written_without_npspec_passes():
    report = kit.check_round(make_round(), trials=9)
    assert report.ok, str(report)
    assert report.trials >= 50 and report.skipped <= 2 and "matches the reference" in str(report)


def test_npspecs_own_round_passes():
    report = kit.check_round(kit.npspec_round(), trials=6)
    assert report.ok, str(report)


@pytest.mark.parametrize("bug, named", [
    ("bonus-from-draft", "bonus-from-draft: the bonus token drawn from the draft's row q_gamma"),
    ("q-unwarped", "q-unwarped: the drafts drawn from the warped q, but the test"),
    ("rows-off-by-one", "rows-off-by-one: draft i tested against the target's row p_(i+1)"),
    ("non-strict", "non-strict-test"),
    ("argmax-draft", "argmax-draft: the drafts are the draft row's argmax"),  # "no classic bug explains it" before
    ("argmax-everywhere", "argmax-everywhere: every id is its row's argmax"),
])
def test_each_classic_round_bug_fails_with_a_message_naming_it(bug, named):
    report = kit.check_round(make_round(bug), trials=9)
    assert not report.ok
    assert any(f"on every trial it returns what a round with {named}" in f.problem for f in report.findings), \
        str(report)


def test_the_top_50_warp_bug_is_found_on_the_gpt2_vocabulary():
    """The bug the one-draft kit missed: top-50 cuts nothing on 8 ids, but half the mass of 50,257."""
    case = [c for c in kit.ROUND_CASES if c[0] == "gpt2-vocab-top-k-50"]
    assert case and case[0][1] == kit.GPT2_VOCAB
    report = kit.check_round(make_round("q-unwarped"), cases=case, trials=9)
    assert not report.ok and any("q-unwarped" in f.problem for f in report.findings), str(report)


def test_the_rows_are_realistic_and_top_k_and_top_p_really_cut():
    draft, target = kit.round_rows(kit.GPT2_VOCAB, 3, seed=0)
    assert draft.shape == target.shape == (4, kit.GPT2_VOCAB)
    for rows in (draft, target):
        assert np.isneginf(rows).any(axis=1).all() and np.isfinite(rows.max(axis=1)).all()  # -inf, never all
        for row in rows:
            top = np.sort(row[np.isfinite(row)])[::-1]
            assert len(np.unique(top)) < len(top) // 4  # the grid makes ties, many of them
        plain = warp(rows)
        for args in (dict(top_k=50), dict(top_k=100), dict(top_p=0.9)):
            cut = warp(rows, **args)
            kept = (cut > 0).sum(axis=1)
            assert (kept < 0.2 * kit.GPT2_VOCAB).all()
            assert (np.where(cut == 0, plain, 0).sum(axis=1) > 0.099).all()  # the cut removes real mass
            if "top_k" in args:
                assert (kept > args["top_k"]).any()  # ties at the k-th value, kept
    assert not np.array_equal(target[0], target[1])  # rows differ by position
    p, q = warp(target), warp(draft)
    beta = np.minimum(p, q).sum(axis=1)
    assert ((0.2 < beta) & (beta < 0.95)).all()  # drafts are kept and rejected
    assert (p[np.arange(4), np.argsort(draft, axis=1)[:, -2]] == 0).all()  # p = 0 where q is large


def test_a_round_returning_garbage_or_raising_is_one_finding_per_kind():
    def raises(draft_logits, target_logits, u, warping):
        raise RuntimeError("boom")

    report = kit.check_round(raises, cases=kit.ROUND_CASES[-1:], trials=6)
    assert not report.ok and "raised RuntimeError: boom" in str(report) and len(report.findings) == 1
    assert report.findings[0].problem.startswith("6 of 6 trials differ")
    report = kit.check_round(lambda *a: (1, 2), cases=kit.ROUND_CASES[-1:], trials=3)
    assert "not (drafts, accepted, token)" in str(report)


def test_the_round_laws_are_exact_and_sum_to_one():
    for name, gamma, qrows, prows, warping in kit.STATISTICAL_ROUNDS:
        with np.errstate(divide="ignore"):
            Q, P = warp(np.log(np.array(qrows)), **warping), warp(np.log(np.array(prows)), **warping)
        laws = kit.round_laws(Q, P, gamma)
        for key, law in laws.items():
            assert abs(law.sum() - 1) < 1e-12, (name, key)
        # theorem: the round's first token is p_0 (kept draft from min(p, q), or from the residual at n = 0)
        first = laws["round"][:len(P[0])] + laws["accepted"][1:].sum() * laws["kept 0"]
        np.testing.assert_allclose(first, P[0], atol=1e-12)
        assert not np.allclose(P[0], P[1])  # rows differ by position


@pytest.mark.slow
@pytest.mark.statistical
@pytest.mark.parametrize("bug", [None, "bonus-from-draft", "rows-off-by-one"])
def test_the_round_statistics_pass_a_correct_round_and_catch_the_bonus_and_misalignment(bug):
    """Chi-square at a total false-alarm rate of 1e-6 (round_statistics); the bugs are off by a TV of 0.1 or more."""
    findings, tests = kit.round_statistics(make_round(bug), n_samples=20000, alpha=1e-6)
    assert len(tests) == sum(2 * g + 2 for _, g, *_ in kit.STATISTICAL_ROUNDS)
    assert (not findings) == (bug is None), findings


# ---- npspec's own drafter objects through the kit, under the warps a run uses

@pytest.mark.parametrize("warp_args", [dict(temperature=1.0, top_k=2), dict(temperature=1.0, top_p=0.6),
                                       dict(temperature=0.7)], ids=["top_k2", "top_p0.6", "t0.7"])
@pytest.mark.parametrize("p_min", [0.0, 0.5])
def test_model_drafter_objects_are_lossless_under_every_warp(warp_args, p_min):
    """ModelDrafter on a table draft, its q warped as the run warps it, with and without confidence stopping:
    the kit's exact check passes (it fails a drafter that reports the unwarped q, or one whose length rule
    withholds the draft it has just drawn: bench/mutants.py plants both)."""
    draft = kit.TableModel.from_table(kit.random_table(3, seed=7), 3)
    report = kit.check_drafter(lambda p: kit.object_drafter(lambda: ModelDrafter(draft, p_min=p_min), warp_args),
                               gammas=(1, 2), eos_values=(None,), schedules=("constant",))
    assert report.ok, str(report)

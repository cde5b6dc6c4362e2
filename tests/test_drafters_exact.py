"""Every drafting strategy keeps the output exactly target-distributed, by enumeration (Fractions):
n-gram lookup on sequences with repeats, confidence stopping at thresholds that bind, the heuristic
gamma schedule across rounds; the kit's drafter check catching the classic mistakes; and the real
loop replaying the enumerated paths, so the enumeration describes the code that runs.
"""

from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest

from npspec import testing as kit
from npspec.decode import Proposal, speculative_generate
from npspec.decode.drafters import ModelDrafter, NgramDrafter
from npspec.decode.sampling import sample, warp

from test_loop_replay import accept_edge, cell_edge

TRUNCATIONS = [{}, {"top_k": 2}, {"top_p": Fraction(2, 3)}]
TRUNCATION_IDS = ["none", "top_k2", "top_p2/3"]
PROMPT = (0, 1)


def targets(n_vocab, truncation, seeds=(0, 1, 2)):
    """Random Fraction tables (a different row per context), truncated as the run's warping would."""
    return [(lambda base: lambda s: kit.truncate(base(s), **truncation))(kit.random_table(n_vocab, seed=s))
            for s in seeds]


def proposal_lengths(p, drafter, gamma, max_new_tokens, eos=None, schedule="constant"):
    """The set of proposal outcomes seen on the enumerated paths: (drafts that decided the round, accepted)."""
    return {(len(r.drafted), r.accepted) for path in kit.drafter_paths(p, drafter, PROMPT, gamma, max_new_tokens, eos,
                                                                       schedule=schedule) for r in path.rounds}


# ---- the strategies, exactly

@pytest.mark.parametrize("n_vocab", [3, 4])
@pytest.mark.parametrize("truncation", TRUNCATIONS, ids=TRUNCATION_IDS)
@pytest.mark.parametrize("sizes", [(1, 2), (2, 3)])
def test_ngram_lookup_keeps_the_target_law_exactly(n_vocab, truncation, sizes):
    """Prompt lookup with one-hot q, both schedules, gamma 1..4, with an EOS it copies and an n_ctx cut."""
    for eos in (None, n_vocab - 1):
        report = kit.check_drafter(lambda p: kit.ngram_drafter(n_vocab, *sizes, eos=eos), n_vocab=n_vocab,
                                   targets=targets(n_vocab, truncation), gammas=(1, 2, 4), eos_values=(eos,),
                                   n_ctx_values=(None, len(PROMPT) + 3))
        assert report.ok, str(report)


def test_the_ngram_enumeration_meets_matches_rejections_and_no_match():
    """The cases above are not vacuous: on the untruncated targets lookups propose, get kept and get rejected."""
    seen = set().union(*(proposal_lengths(p, kit.ngram_drafter(3, 1, 2), 3, 4) for p in targets(3, {})))
    assert 0 in {d for d, _ in seen} and any(a < d for d, a in seen) and any(a == d > 0 for d, a in seen)


@pytest.mark.parametrize("truncation", TRUNCATIONS, ids=TRUNCATION_IDS)
@pytest.mark.parametrize("p_min", [Fraction(1, 2), Fraction(2, 3)])
def test_confidence_stopping_keeps_the_target_law_exactly(truncation, p_min):
    """A draft table with confidence stopping at thresholds that bind (some rounds stop early, some do not)."""
    draft = targets(3, truncation, seeds=(11,))[0]
    report = kit.check_drafter(lambda p: kit.confident_drafter(draft, p_min), targets=targets(3, truncation),
                               gammas=(2, 3))
    assert report.ok, str(report)
    if not truncation:  # the thresholds bind: the drafter stops after a draft, and also drafts on
        asked = []
        description = kit.confident_drafter(draft, p_min)

        def recorded(seq, drafted):
            step = description(seq, drafted)
            asked.append((len(drafted), step is None))
            return step
        for p in targets(3, {}):
            kit.drafter_distribution(p, recorded, PROMPT, 3, 4)
        assert any(n > 0 and stop for n, stop in asked) and any(n > 0 and not stop for n, stop in asked)


def test_heuristic_schedule_keeps_the_target_law_across_rounds():
    """transformers' heuristic moves gamma after each round (1 -> 3 -> 2 ...): the law of 6 tokens is still the target's."""
    draft = kit.random_table(3, seed=7)
    report = kit.check_drafter(lambda p: kit.table_drafter(draft), gammas=(1, 2), max_new_tokens=6,
                               eos_values=(None,), schedules=("heuristic",))
    assert report.ok, str(report)
    paths = list(kit.drafter_paths(kit.random_table(3, seed=0), kit.table_drafter(kit.random_table(3, seed=0)), PROMPT,
                                   1, 6, schedule="heuristic"))
    assert any([r.gamma for r in path.rounds][:2] == [1, 3] for path in paths)  # the schedule did move


# ---- the kit catches the classic mistakes

def ngram_tested_with_other_q(n_vocab):
    """WRONG: proposes the lookup's id deterministically but hands the test a uniform q."""
    lookup = kit.ngram_drafter(n_vocab, 1, 2)

    def drafter(seq, drafted):
        step = lookup(seq, drafted)
        return None if step is None else (step[0], [Fraction(1, n_vocab)] * n_vocab)
    return drafter


def withholds_what_the_target_dislikes(p, q):
    """WRONG: draws d from q, but proposes it only if the target gives it at least q(d) (a confidence rule peeking at p)."""
    def drafter(seq, drafted):
        prow, qrow = p(seq + drafted), q(seq + drafted)
        return [qx if px >= qx else 0 for px, qx in zip(prow, qrow)], qrow
    return drafter


def stops_where_the_target_would_reject(p, q):
    """WRONG: draws d and its own uniform, and stops drafting where the test would reject d: proposes x w.p. min(p, q)(x)."""
    def drafter(seq, drafted):
        prow, qrow = p(seq + drafted), q(seq + drafted)
        return [min(px, qx) for px, qx in zip(prow, qrow)], qrow
    return drafter


def stops_where_the_target_is_unsure(p, q):
    """RIGHT, though it reads p: whether to draft the next position depends only on the context (p's row there)."""
    def drafter(seq, drafted):
        if max(p(seq + drafted)) < Fraction(1, 2):
            return None
        row = q(seq + drafted)
        return row, row
    return drafter


@pytest.mark.parametrize("wrong", ["other q", "withholds", "stops before a rejection"])
def test_the_kit_catches_wrong_drafters(wrong):
    draft = kit.random_table(3, seed=7)
    make = {"other q": lambda p: ngram_tested_with_other_q(3),
            "withholds": lambda p: withholds_what_the_target_dislikes(p, draft),
            "stops before a rejection": lambda p: stops_where_the_target_would_reject(p, draft)}[wrong]
    report = kit.check_drafter(make)
    assert not report.ok
    assert "FAILS" in str(report) and "<-- differs" in str(report)


def test_the_kit_passes_a_stopping_rule_that_reads_only_the_context():
    """The line is the acceptance test, not the target: a length rule using the target's row at the current
    context (not the test's outcome) is lossless, and the kit says so."""
    draft = kit.random_table(3, seed=7)
    report = kit.check_drafter(lambda p: stops_where_the_target_is_unsure(p, draft))
    assert report.ok, str(report)
    assert {0, 1} <= {d for d, _ in proposal_lengths(kit.random_table(3, seed=0),
                                                     stops_where_the_target_is_unsure(kit.random_table(3, seed=0),
                                                                                      draft), 2, 4)}


# ---- the kit on drafter objects, as anyone's would be checked

def table_draft(q, n_vocab=3):
    return kit.TableModel.from_table(q, n_vocab)


@pytest.mark.parametrize("name", ["ngram", "model", "model p_min"])
def test_the_kit_checks_drafter_objects(name):
    q = kit.random_table(3, seed=7)
    make = {"ngram": lambda: NgramDrafter(3, None, 1, 2),
            "model": lambda: ModelDrafter(table_draft(q)),
            "model p_min": lambda: ModelDrafter(table_draft(q), p_min=0.5)}[name]
    report = kit.check_drafter(lambda p: kit.object_drafter(make), gammas=(1, 2), eos_values=(None,),
                               schedules=("constant",))
    assert report.ok, str(report)


class ReportsTheFullRow(ModelDrafter):
    """WRONG: samples from the top-2 row but reports the untruncated softmax as q."""

    def propose(self, seq, gamma, u, sampling):
        ctx, d, q = list(seq), [], []
        for i in range(gamma):
            logits = self.model.forward(np.asarray(ctx[self.cache.length:]), self.cache)[-1]
            d.append(sample(replace(sampling, top_k=2).warp(logits), u[i]))
            q.append(sampling.warp(logits))
            ctx.append(d[-1])
        return Proposal.chain(d, np.array(q))


class NgramWithUniformQ(NgramDrafter):
    """WRONG: the lookup's ids with a uniform q."""

    def propose(self, seq, gamma, u, sampling):
        d = super().propose(seq, gamma, u, sampling).ids
        return Proposal.chain(d, np.full((len(d), self.n_vocab), 1 / self.n_vocab))


@pytest.mark.parametrize("wrong", ["full row for top-k", "ngram uniform q"])
def test_the_kit_catches_drafter_objects_whose_q_is_not_what_they_sampled(wrong):
    q = kit.random_table(3, seed=7)
    make = {"full row for top-k": lambda: ReportsTheFullRow(table_draft(q)),
            "ngram uniform q": lambda: NgramWithUniformQ(3, None, 1, 2)}[wrong]
    report = kit.check_drafter(lambda p: kit.object_drafter(make), gammas=(2,), eos_values=(None,),
                               schedules=("constant",))
    assert not report.ok and "DrafterError" in report.error and "not what it sampled from" in report.error


# ---- the real loop follows the enumerated paths

def drive(rounds, p, q_row, prompt, upper):
    """Uniforms that drive the loop down `rounds` (kit.Round, with each round's g), every decision on its edge:
    g for the drafter (cell edges in the row each draft came from), g for the tests, 1 for the final sample."""
    seq, values, sizes = tuple(prompt), [], []
    for r in rounds:
        g, n, drafted, token = r.gamma, r.accepted, r.drafted, r.token
        ctx = [seq + tuple(drafted[:i]) for i in range(len(drafted) + 1)]
        rejected = token is not None and n < len(drafted)
        drafts = [cell_edge(q_row(seq, drafted[:i]), x, upper) for i, x in enumerate(drafted)]
        tests = [accept_edge(p(ctx[i]), q_row(seq, drafted[:i]), drafted[i], kept=i < n) for i in range(n + rejected)]
        final = 0.5
        if token is not None:
            rows = kit.npspec_rule(p(ctx[n]), q_row(seq, drafted[:n]), drafted[n])[1] if rejected else p(ctx[n])
            final = cell_edge(np.asarray(rows, dtype=np.float64), token, upper)
        values += drafts + [0.5] * (g - len(drafts)) + tests + [0.5] * (g - len(tests)) + [final]
        sizes.append(2 * g + 1)
        seq += tuple(drafted[:n]) + ((token,) if token is not None else ())
    return values, sizes


@pytest.mark.parametrize("strategy, schedule", [("ngram", "constant"), ("ngram", "heuristic"),
                                                ("p_min", "constant"), ("model", "heuristic")])
def test_every_enumerated_path_replays_through_the_real_loop(strategy, schedule):
    """Same ids, same rounds (g, drafts, accepted, token), 2g + 1 uniforms per round in the documented order."""
    n_vocab, eos, gamma, max_new_tokens = 3, 2, 2, 4
    target = kit.TableModel.from_table(kit.random_table(n_vocab, seed=1), n_vocab, eos_token_id=eos)
    draft = kit.TableModel.from_table(kit.random_table(n_vocab, seed=7), n_vocab, eos_token_id=eos)
    p, q = kit.model_table(target), kit.model_table(draft)  # float64 rows exactly as the loop sees them
    if strategy == "ngram":
        description, make = kit.ngram_drafter(n_vocab, 1, 2, eos=eos), lambda: NgramDrafter(n_vocab, eos, 1, 2)
    else:
        p_min = 0.5 if strategy == "p_min" else 0.0
        description = kit.confident_drafter(q, p_min) if p_min else kit.table_drafter(q)
        make = lambda: ModelDrafter(draft, p_min=p_min)  # noqa: E731

    def q_row(seq, drafted):
        return np.asarray(description(seq, tuple(drafted))[1], dtype=np.float64)

    paths = list(kit.drafter_paths(p, description, PROMPT, gamma, max_new_tokens, eos, rule=kit.npspec_rule,
                                   schedule=schedule))
    assert any(r.accepted < len(r.drafted) for path in paths for r in path.rounds)  # rejections happen
    for path in paths:
        for upper in (False, True):
            values, sizes = drive(path.rounds, p, q_row, PROMPT, upper)
            rng = kit.ScriptedRng(values)
            gen = speculative_generate(target, make(), list(PROMPT), max_new_tokens, gamma=gamma, temperature=1.0,
                                       rng=rng, trace=True, gamma_schedule=schedule)
            assert tuple(gen.ids) == path.ids
            assert rng.sizes == sizes and not rng.values
            assert [(tuple(rec["drafted"][:len(r.drafted)]), rec["accepted"], rec["token"], rec["gamma"])
                    for rec, r in zip(gen.trace, path.rounds)] == [(r.drafted, r.accepted, r.token, r.gamma)
                                                                  for r in path.rounds]

"""The drafters and the round around them: n-gram lookup (its index against a plain scan, its tie and
EOS rules), confidence stopping, the gamma schedules, the statistics in vLLM's terms, the uniform-draw
order of variable-length rounds, bad drafters and bad values, and greedy identity for every strategy.
"""

import itertools
import json

import numpy as np
import pytest

from npspec import testing as kit
from npspec.decode import Proposal, SamplingParams, next_gamma, speculative_generate
from npspec.decode.drafters import ModelDrafter, NgramDrafter, ngram_scan
from npspec.sources import random_model

from conftest import run_python, tiny_model
from test_cli import GENERATE, assert_one_clean_line, offline_env

# ---- n-gram lookup


@pytest.mark.parametrize("sizes", [(1, 1), (1, 2), (1, 4), (2, 3)])
@pytest.mark.parametrize("eos", [None, 2])
def test_the_ngram_index_proposes_what_a_plain_scan_finds(sizes, eos):
    """Every sequence over 3 ids up to length 7, grown one id at a time (as the loop grows it), gamma 1..4."""
    for seq in itertools.product(range(3), repeat=7):
        drafter = NgramDrafter(3, eos, *sizes)
        drafter.start(list(seq[:1]))
        for length in range(1, 8):
            for gamma in (1, 4):
                assert drafter.lookup(list(seq[:length]), gamma) == ngram_scan(seq[:length], gamma, *sizes, eos)


def test_ngram_rules_most_recent_match_longest_n_eos_and_end_of_sequence():
    d = NgramDrafter(10, eos_token_id=9, ngram_min=1, ngram_max=2)
    d.start([5])
    assert d.lookup([5, 1, 5, 2, 5], 2) == [2, 5]  # the MOST RECENT 5 was followed by 2 (the first by 1)
    d.start([5])
    assert d.lookup([3, 5, 1, 4, 5, 2, 3, 5], 2) == [1, 4]  # n = 2 ("3 5") wins over the later n = 1 match
    d.start([7])
    assert d.lookup([7, 3, 9, 4, 7, 3], 4) == [9]  # cut after the EOS it copies
    d.start([1])
    assert d.lookup([1, 2, 1], 5) == [2, 1]  # never past the end of the sequence
    d.start([1])
    assert d.lookup([1, 2, 3], 5) == []  # no match: no proposal


def test_ngram_proposals_are_deterministic_chains_with_one_hot_rows_and_ignore_the_uniforms():
    d = NgramDrafter(4, None, 1, 2)
    d.start([0])
    proposal = d.propose([0, 1, 2, 0], 3, np.array([0.9, 0.1, 0.5]), SamplingParams(0.7, 2, 1.0))
    assert proposal.ids == [1, 2, 0] and proposal.parents == [-1, 0, 1] and proposal.q is None  # deterministic
    q = proposal.q_rows(4)
    assert q.dtype == np.float64 and (q == np.eye(4)[[1, 2, 0]]).all()
    assert d.propose([0, 1, 2, 0], 3, np.zeros(3), SamplingParams(0)) == Proposal([1, 2, 0], [-1, 0, 1])


def test_ngram_rollback_forgets_the_indexed_ids():
    d = NgramDrafter(5, None, 1, 2)
    d.start([1])
    assert d.lookup([1, 2, 3, 1], 2) == [2, 3]
    d.rollback(2)
    assert d.ids == [1, 2] and d.lookup([1, 4, 1], 2) == ngram_scan([1, 4, 1], 2, 1, 2) == [4, 1]


@pytest.mark.parametrize("sizes, message", [((0, 2), "ngram_min"), ((1, 0), "ngram_max"), ((3, 2), "larger than"),
                                            ((1.0, 2), "ngram_min"), ((True, 2), "ngram_min")])
def test_bad_ngram_sizes_are_refused(sizes, message):
    with pytest.raises(ValueError, match=message):
        NgramDrafter(5, None, *sizes)


# ---- confidence stopping


def rows_model(rows, eos=None):
    """A TableModel whose next-token probabilities are rows[len(seq) - 1] (clamped to the last row)."""
    rows = [np.asarray(r, dtype=np.float64) for r in rows]

    def table(seq):
        return rows[min(len(seq) - 1, len(rows) - 1)]
    return kit.TableModel.from_table(table, len(rows[0]), eos_token_id=eos)


@pytest.mark.parametrize("p_min", [-0.1, 1.5, float("nan"), "0.5", True])
def test_bad_p_min_is_refused(p_min):
    with pytest.raises(ValueError, match="p_min"):
        ModelDrafter(rows_model([[1, 0]]), p_min=p_min)


@pytest.mark.parametrize("temperature", [1.0, 0])
def test_confidence_stopping_proposes_the_unsure_token_then_stops(temperature):
    """The row after one id has top 0.4 (< p_min 0.5): d_1 is proposed and drafting stops; later rows are sure."""
    draft = rows_model([[0.4, 0.3, 0.3], [0.9, 0.05, 0.05]])
    drafter = ModelDrafter(draft, p_min=0.5)
    drafter.start([0])
    sampling = SamplingParams(temperature)
    assert drafter.propose([0], 4, np.full(4, 0.1), sampling).ids == [0]  # the row after [0] has top 0.4
    drafter.rollback(1)  # what the round's roll back does: the cache holds the ids but the last
    ids = drafter.propose([0, 0], 4, np.full(4, 0.1), sampling).ids
    assert ids == [0, 0, 0, 0]  # rows after [0, 0, ...] are sure: no stop up to gamma
    drafter = ModelDrafter(draft, p_min=0.0)
    drafter.start([0])
    assert drafter.propose([0], 4, np.full(4, 0.1), sampling).ids == [0, 0, 0, 0]


def test_a_draft_model_not_rolled_back_is_refused(pair):
    """The round rolls the draft back (round.roll_back); a drafter asked to propose with a cache past seq says so."""
    _, draft = pair
    drafter = ModelDrafter(draft)
    drafter.start([1, 2, 3])
    drafter.propose([1, 2, 3], 3, np.full(3, 0.5), SamplingParams(0))
    with pytest.raises(ValueError, match="roll it back to len"):
        drafter.propose([1, 2], 3, np.full(3, 0.5), SamplingParams(0))


# ---- the schedule, the statistics and the draw order


def test_next_gamma_constant_and_heuristic():
    assert [next_gamma("constant", 4, n) for n in (0, 2, 4)] == [4, 4, 4]
    assert next_gamma("heuristic", 4, 4) == 6 and next_gamma("heuristic", 4, 3) == 3
    assert next_gamma("heuristic", 1, 0) == 1  # never below 1


@pytest.fixture(scope="module")
def pair():
    return tiny_model(seed=3, n_layer=2), tiny_model(seed=4, n_layer=1, role="draft")


def strategies(target, draft):
    """(name, drafter factory, schedule) for every strategy npspec has."""
    n = target.config.n_vocab
    return [("model", lambda: ModelDrafter(draft), "constant"),
            ("model heuristic", lambda: ModelDrafter(draft), "heuristic"),
            ("model p_min", lambda: ModelDrafter(draft, p_min=0.5), "constant"),
            ("ngram", lambda: NgramDrafter(n, target.config.eos_token_id), "constant"),
            ("ngram heuristic", lambda: NgramDrafter(n, target.config.eos_token_id), "heuristic")]


@pytest.mark.parametrize("index", range(5))
def test_variable_length_rounds_draw_the_documented_uniforms_and_count_in_vllms_terms(pair, index):
    """2g + 1 uniforms per round whatever is proposed; stats agree with the trace; vLLM's metrics by their definitions."""
    target, draft = pair
    name, make, schedule = strategies(target, draft)[index]
    rng = kit.ScriptedRng(np.random.default_rng(1).random(4000))
    gen = speculative_generate(target, make(), [1, 2, 1, 2], 40, gamma=3, rng=rng, trace=True, gamma_schedule=schedule)
    s, trace = gen.stats, gen.trace
    assert rng.sizes == [2 * rec["gamma"] + 1 for rec in trace]
    assert all(rec["proposed"] <= rec["gamma"] for rec in trace)
    gammas = [rec["gamma"] for rec in trace]
    if schedule == "heuristic":  # each round's g follows next_gamma from the round before (until the budget cuts it)
        for before, rec, g in zip(trace, trace[1:], gammas[1:]):
            assert g == min(next_gamma("heuristic", before["gamma"], before["accepted"]), 40 - 1) or g < before["gamma"]
    assert s.proposal_lengths == [sum(rec["proposed"] == k for rec in trace) for k in range(len(s.proposal_lengths))]
    assert s.num_drafts + s.rounds_without_proposal == s.rounds == len(trace)
    assert s.num_draft_tokens == sum(rec["proposed"] for rec in trace)
    assert s.num_accepted_tokens == s.accepted == sum(rec["accepted"] for rec in trace)
    if s.num_drafts:
        assert s.mean_acceptance_length == 1 + s.accepted / s.num_drafts
        assert s.acceptance_rate_by_position == [a / s.num_drafts for a in s.accepted_by_position]
    if s.rounds_without_proposal == 0 and s.stop_reason == "max_new_tokens":
        assert s.mean_acceptance_length == pytest.approx(s.tokens_per_round, abs=1 / s.rounds)
    again = speculative_generate(target, make(), [1, 2, 1, 2], 40, gamma=3, rng=kit.ScriptedRng(
        np.random.default_rng(1).random(4000)), trace=True, gamma_schedule=schedule)
    untimed = [[{k: v for k, v in rec.items() if not k.startswith("seconds")} for rec in run.trace] for run in (gen, again)]
    assert again.ids == gen.ids and untimed[0] == untimed[1]  # reproducible from the uniforms alone


def test_ngram_rounds_without_a_match_are_plain_target_steps(pair):
    target, _ = pair
    gen = speculative_generate(target, NgramDrafter(target.config.n_vocab, None, 3, 3), [1, 2, 3], 5, gamma=4,
                               temperature=0, trace=True)
    first = gen.trace[0]
    assert first["proposed"] == 0 and first["drafted"] == [] and first["accepted"] == 0
    assert gen.stats.draft_forwards == 0 and gen.stats.rounds_without_proposal >= 1


class Greedy(NgramDrafter):
    """A drafter that breaks the contract in the ways check_proposal reports."""

    def __init__(self, n_vocab, proposal, q):
        super().__init__(n_vocab)
        self.proposal, self.q = proposal, q

    def propose(self, seq, gamma, u, sampling):
        if isinstance(self.proposal, Proposal):
            return self.proposal
        return Proposal.chain(self.proposal, self.q)


@pytest.mark.parametrize("proposal, q, message", [
    ([1, 1, 1, 1, 1], None, "at most 2 ids"),
    ([99], None, "at most 2 ids"),
    ([1], np.ones((1, 4)) / 4, "q has shape"),
    ([1], np.zeros((1, 5)), "probability 0"),
    ([1], np.ones((2, 5)) / 5, "q has shape"),
    (Proposal([1, 2], [-1, -1]), None, "a chain's are"),
    (Proposal([1], [-1], None, [2, 3], [0]), None, "extra nodes")])
def test_a_drafter_that_breaks_the_contract_gets_a_clear_error(pair, proposal, q, message):
    target, _ = pair
    bad = Greedy(target.config.n_vocab, proposal, q)
    with pytest.raises(ValueError, match=message):
        speculative_generate(target, bad, [1, 2], 5, gamma=2, temperature=1.0)


def test_a_draft_with_another_vocabulary_is_refused_for_any_drafter(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_generate(target, NgramDrafter(target.config.n_vocab + 1), [1], 4, gamma=2)


def test_bad_schedule_is_refused(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="gamma_schedule.*constant, heuristic"):
        speculative_generate(target, draft, [1], 4, gamma=2, gamma_schedule="dynamic")


# ---- greedy: every strategy gives plain greedy's ids, bit for bit


def assert_greedy_identity(target, make, schedule, prompts, max_new_tokens, gammas=range(1, 9)):
    for prompt in prompts:
        plain = speculative_generate(target, None, prompt, max_new_tokens, gamma=0, temperature=0)
        for gamma in gammas:
            spec = speculative_generate(target, make(), prompt, max_new_tokens, gamma=gamma, temperature=0,
                                        gamma_schedule=schedule)
            assert spec.ids == plain.ids, (prompt, gamma, schedule)
            assert spec.stats.target_forwards <= plain.stats.target_forwards


@pytest.mark.parametrize("index", range(5))
def test_greedy_identity_of_every_strategy_on_a_tiny_pair(pair, index):
    target, draft = pair
    _, make, schedule = strategies(target, draft)[index]
    assert_greedy_identity(target, make, schedule, [[1, 2, 3], [5, 6, 5, 6, 5]], 25)


@pytest.mark.parametrize("index", range(5))
def test_greedy_identity_of_every_strategy_on_the_shipped_pair(shipped, val_ids, index):
    target, draft = shipped
    _, make, schedule = strategies(target, draft)[index]
    assert_greedy_identity(target, make, schedule, [list(val_ids[:16]), list(val_ids[500:532])], 32)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["constant", "heuristic"])
def test_greedy_identity_of_ngram_on_random_gpt2(schedule):
    """GPT-2's shapes with random weights: n-gram lookup at gamma 1..8 returns plain greedy's ids."""
    target = random_model("gpt2")
    gen = speculative_generate(target, NgramDrafter(target.config.n_vocab, target.config.eos_token_id), [464, 1893],
                               24, gamma=4, temperature=0)
    assert gen.stats.num_drafts > 0  # random GPT-2 repeats itself: lookups find matches
    assert_greedy_identity(target, lambda: NgramDrafter(target.config.n_vocab, target.config.eos_token_id), schedule,
                           [[464, 1893]], 24)


# ---- the command line


def cli_ids(*args, env=None):
    r = run_python(*GENERATE, "--json", "--temperature", "0", "--max-new-tokens", "48", *args, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("args", [("--draft", "ngram")] + [  # the other three: whole commands, CI's second step
    pytest.param(args, marks=pytest.mark.slow) for args in (("--draft", "ngram", "--gamma-schedule", "heuristic"),
                                                            ("--gamma-schedule", "heuristic"), ("--draft-p-min", "0.5"))])
def test_every_strategy_on_the_command_line_returns_plain_greedys_ids(args):
    """The done-when of the drafters: on the shipped target, greedy ids equal --gamma 0's."""
    plain = cli_ids("--gamma", "0", "ROMEO:")
    out = cli_ids(*args, "ROMEO:")
    assert out["ids"] == plain["ids"] and out["stats"]["num_drafts"] > 0
    assert out["stats"]["num_draft_tokens"] >= out["stats"]["num_accepted_tokens"] == out["stats"]["accepted"]


@pytest.mark.slow
def test_ngram_on_random_gpt2_on_the_command_line_returns_plain_greedys_ids(tmp_path):
    env = offline_env(tmp_path)
    plain = cli_ids("--target", "random:gpt2", "--gamma", "0", "Hello", env=env)
    out = cli_ids("--target", "random:gpt2", "--draft", "ngram", "Hello", env=env)
    assert out["ids"] == plain["ids"]


@pytest.mark.parametrize("args, message", [
    (["--draft", "ngram", "--gamma", "0"], "--draft ngram needs --gamma >= 1"),
    (["--ngram-min", "2"], "apply to --draft ngram only"),
    (["--draft", "ngram", "--ngram-min", "0"], "ngram_min (--ngram-min) must be an integer >= 1, got 0"),
    (["--draft", "ngram", "--ngram-min", "3", "--ngram-max", "2"], "give --ngram-min <= --ngram-max"),
    (["--draft", "ngram", "--draft-p-min", "0.5"], "--draft-p-min applies to a draft model"),
    (["--draft-p-min", "1.5"], "must be a probability in [0, 1], got 1.5"),
    (["--draft-p-min", "nan"], "must be a probability in [0, 1], got nan"),
])
def test_bad_drafting_options_get_one_clean_line_before_any_output(args, message):
    r = run_python(*GENERATE, "--max-new-tokens", "4", *args, "x")
    assert_one_clean_line(r, message)
    assert r.stdout == ""


def test_an_unknown_schedule_is_refused_by_the_parser():
    r = run_python(*GENERATE, "--gamma-schedule", "dynamic", "x")
    assert r.returncode == 2 and "invalid choice: 'dynamic'" in r.stderr and r.stdout == ""

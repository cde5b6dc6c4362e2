"""The drafter protocol (npspec.decode.types) carries what the next drafters need, shown with test doubles (no real
head): the target's last hidden state per verified row (EAGLE, Medusa) and non-candidate rows scored in the verify
forward (lookahead / Jacobi decoding). Also: Stats.merge pools runs, the acceptance rule is a registry the API and
the CLI read, and a drafter without a model joins the command line by one registration (COMMANDS).
"""

import io
import json
from dataclasses import replace

import numpy as np
import pytest

from npspec import testing as kit
from npspec.cli import generate
from npspec.decode import RULES, BaseDrafter, Drafter, Proposal, Rule, Stats, accept, speculative_generate
from npspec.decode import drafters as drafters_module
from npspec.decode.drafters import Command, NgramDrafter, TreeDrafter
from npspec.decode.evaluate import acceptance
from npspec.model.gpt2 import tree_paths

N_VOCAB = 6


def table(seq):
    """The target's logits after seq: a clear favourite (sum of the ids mod N_VOCAB), the rest spread."""
    row = np.log(np.full(N_VOCAB, 0.04))
    row[sum(seq) % N_VOCAB] = np.log(0.6)
    row[(sum(seq) + 1) % N_VOCAB] = np.log(0.2)
    return row


def hidden_of(path):  # the stand-in "last hidden state" after the ids `path`: [3] float32
    return np.array([len(path), path[-1], sum(path) % 7], dtype=np.float32)


class HiddenTable(kit.TableModel):
    """A TableModel that also returns a hidden state per row (HiddenForwarder): hidden_of(the row's context)."""

    def forward_hidden(self, ids, cache):
        before = list(cache.ids)
        logits = self.forward(ids, cache)
        return logits, np.stack([hidden_of(before + list(map(int, ids[:i + 1]))) for i in range(len(ids))])

    def forward_tree_hidden(self, ids, parents, cache):
        before = list(cache.ids)
        logits = self.forward_tree(ids, parents, cache)
        return logits, np.stack([hidden_of(before + [int(ids[r]) for r in path]) for path in tree_paths(parents)])


class HeadDrafter(BaseDrafter):
    """An EAGLE-like double: reads the target's hidden states in update() and drafts from them (a fixed rule standing
    in for a head: propose hidden[1] + 1, hidden[1] + 2, ... of the row after the kept path)."""

    reads_hidden = True
    source = "head"

    def __init__(self):
        self.n_vocab, self.seen, self.last = N_VOCAB, [], None

    def propose(self, seq, gamma, u, sampling):
        start = seq[-1] if self.last is None else int(self.last[1])
        return Proposal.chain([(start + 1 + i) % N_VOCAB for i in range(gamma)])

    def update(self, outcome):
        self.seen.append(outcome)
        self.last = outcome.hidden[len(outcome.path)]  # the row that sampled the round's last token


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_drafter_that_reads_hidden_states_gets_the_last_hidden_state_of_every_verified_row(temperature):
    target, drafter = HiddenTable(table, N_VOCAB, 40), HeadDrafter()
    gen = speculative_generate(target, drafter, [1, 2], 12, gamma=3, temperature=temperature, rng=5, trace=True)
    seq = [1, 2]
    assert len(drafter.seen) == len(gen.trace) > 1
    for outcome, record in zip(drafter.seen, gen.trace):
        nodes = [seq[-1]] + outcome.proposal.ids
        assert outcome.hidden.shape == (len(nodes), 3) and outcome.logits.shape == (len(nodes), N_VOCAB)
        for i in range(len(nodes)):  # row i: after seq and the chain's first i drafts
            context = seq + outcome.proposal.ids[:i]
            assert (outcome.hidden[i] == hidden_of(context)).all()
            assert (outcome.logits[i] == np.float32(table(tuple(context)))).all()
        assert outcome.emitted == record["drafted"][:record["accepted"]] + [record["token"]]
        seq += outcome.emitted
    assert gen.stats.accepted > 0  # the head's proposals were kept sometimes: it read the states it was given


def test_a_drafter_that_reads_hidden_states_needs_a_target_that_returns_them():
    with pytest.raises(ValueError, match="reads the target's hidden states, which the target table does not return"):
        speculative_generate(kit.TableModel(table, N_VOCAB, 40), HeadDrafter(), [1], 4, gamma=2)


class LookaheadDrafter(NgramDrafter):
    """A lookahead-like double: n-gram candidates plus non-candidate nodes (a two-node branch after the last id,
    and one after the first candidate) whose target rows it reads in update(), as lookahead decoding grows its
    n-gram pool from the lookahead branch."""

    def __init__(self, extras=True):
        super().__init__(N_VOCAB, None, 1, 2)
        self.extras, self.seen = extras, []

    def propose(self, seq, gamma, u, sampling):
        proposal = super().propose(seq, gamma, u, sampling)
        if not self.extras:
            return proposal
        k = len(proposal.ids)
        extra = [(seq[-1] + 2) % N_VOCAB, (seq[-1] + 3) % N_VOCAB] + ([(seq[-1] + 4) % N_VOCAB] if k else [])
        return replace(proposal, extra_ids=extra, extra_parents=[-1, k] + ([0] if k else []))

    def update(self, outcome):
        self.seen.append(outcome)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_non_candidate_rows_are_scored_in_the_verify_forward_and_never_accepted(temperature):
    """The extra nodes' rows are the target's after their paths; the output, the counts and the uniforms are those of
    the same drafter without them (they are scored, not tested), and the cache keeps only the accepted path."""
    prompt = [1, 2, 3, 1, 2]
    runs = {}
    for extras in (True, False):
        target, drafter, rng = kit.TableModel(table, N_VOCAB, 40), LookaheadDrafter(extras), kit.ScriptedRng(
            np.random.default_rng(3).random(400))
        runs[extras] = speculative_generate(target, drafter, prompt, 14, gamma=3, temperature=temperature, rng=rng,
                                            trace=True), drafter, rng.sizes
    (gen, drafter, sizes), (plain, _, plain_sizes) = runs[True], runs[False]
    assert gen.ids == plain.ids and gen.stats.as_dict()["accepted"] == plain.stats.accepted and sizes == plain_sizes
    seq, scored = list(prompt), 0
    for outcome in drafter.seen:
        ids = outcome.proposal.ids + outcome.proposal.extra_ids
        parents = outcome.proposal.parents + outcome.proposal.extra_parents
        rows = [-1] + [p + 1 if p >= 0 else 0 for p in parents]
        paths = tree_paths(rows)
        for j in range(len(outcome.proposal.ids), len(ids)):  # the extra nodes' rows
            context = seq + [([seq[-1]] + ids)[r] for r in paths[1 + j]][1:]
            assert (outcome.logits[1 + j] == np.float32(table(tuple(context)))).all()
            scored += 1
        assert all(i < len(outcome.proposal.ids) for i in outcome.path)  # only candidates are kept
        seq += outcome.emitted
    assert scored > len(drafter.seen)


def test_malformed_extra_nodes_are_refused():
    class Bad(LookaheadDrafter):
        def propose(self, seq, gamma, u, sampling):
            return replace(super().propose(seq, gamma, u, sampling), extra_parents=[5, 9, 9])
    with pytest.raises(ValueError, match="extra nodes .* have parents"):
        speculative_generate(kit.TableModel(table, N_VOCAB, 40), Bad(), [1, 2, 1], 6, gamma=2)


def test_every_drafter_double_is_a_drafter_and_a_model_is_not():
    assert isinstance(HeadDrafter(), Drafter) and isinstance(LookaheadDrafter(), Drafter)
    assert not isinstance(kit.TableModel(table, N_VOCAB), Drafter)
    with pytest.raises(TypeError, match=r"draft must be a Model, a drafter \(npspec.decode.drafters\) or None"):
        speculative_generate(kit.TableModel(table, N_VOCAB), object(), [1], 4, gamma=2)


# ---- stats pool with merge

def test_pooled_stats_sum_every_count_and_list_so_vllms_metrics_are_right(shipped):
    target, draft = shipped
    prompts = [target.tokenizer.encode(t).ids for t in ("ROMEO:", "JULIET:\nO", "KING")]
    gens = [speculative_generate(target, draft, p, 10, gamma=3, temperature=0) for p in prompts]
    pooled = Stats.pooled(g.stats for g in gens)
    for key in ("new_tokens", "rounds", "drafted", "accepted", "rejected", "target_forwards", "draft_forwards"):
        assert getattr(pooled, key) == sum(getattr(g.stats, key) for g in gens), key
    assert pooled.num_drafts == sum(g.stats.num_drafts for g in gens) > 0
    assert pooled.num_draft_tokens == sum(g.stats.num_draft_tokens for g in gens)
    assert pooled.mean_acceptance_length == 1 + pooled.accepted / pooled.num_drafts
    assert pooled.stop_reason == "max_new_tokens"
    summed = acceptance(target, draft, prompts, gamma=3, max_new_tokens=10)
    assert summed.proposal_lengths == pooled.proposal_lengths and summed.num_drafts == pooled.num_drafts
    assert summed.stop_reason == "mixed"
    assert Stats(stop_reason="eos").merge(Stats(stop_reason="context")).stop_reason == "mixed"


# ---- the acceptance rule is a registry

def test_the_verify_rule_is_chosen_by_name_from_one_registry():
    target = kit.TableModel(table, N_VOCAB, 40)
    assert list(RULES) == list(generate.build_parser()._option_string_actions["--verify"].choices)
    a = speculative_generate(target, target, [1, 2], 8, gamma=2, rng=1, verify="token")
    assert a.ids == speculative_generate(target, target, [1, 2], 8, gamma=2, rng=1).ids
    with pytest.raises(ValueError, match=r"verify \(--verify\) must be one of token"):
        speculative_generate(target, target, [1, 2], 8, gamma=2, verify="typical")


# ---- a drafter without a model joins the command line by one registration

class Echo(BaseDrafter):
    """Proposes the last id `repeat` times (deterministic)."""

    source = "echo"

    def __init__(self, n_vocab, repeat):
        self.n_vocab, self.repeat = n_vocab, repeat

    def propose(self, seq, gamma, u, sampling):
        return Proposal.chain([seq[-1]] * min(gamma, self.repeat))


def test_a_registered_drafter_runs_from_the_command_line_with_its_options(monkeypatch):
    def check(echo_repeat=None):  # its options' values by name, never the CLI's namespace
        if echo_repeat is not None and echo_repeat < 1:
            raise ValueError("--echo-repeat must be >= 1")
    echo = Command("echo", "repeat the last id", "its proposals are certain",
                   (("--echo-repeat", dict(type=int, default=None, help="ids to propose")),), check,
                   lambda target, echo_repeat=None: Echo(target.config.n_vocab, echo_repeat or 2))
    monkeypatch.setitem(drafters_module.COMMANDS, "echo", echo)

    def cli(*argv):
        out, err = io.StringIO(), io.StringIO()
        generate.run(generate.build_parser().parse_args([*argv, "--json", "--quiet"]), out=out, err=err)
        return json.loads(out.getvalue())
    got = cli("--draft", "echo", "--echo-repeat", "3", "--temperature", "0", "--max-new-tokens", "12")
    plain = cli("--gamma", "0", "--temperature", "0", "--max-new-tokens", "12")
    assert got["ids"] == plain["ids"] and got["stats"]["num_draft_tokens"] > 0
    assert max(len(got["stats"]["proposal_lengths"]) - 1, 0) <= 3
    for argv, message in ((["--draft", "echo", "--echo-repeat", "0"], "--echo-repeat must be >= 1"),
                          (["--echo-repeat", "2"], "--echo-repeat apply to --draft echo only"),
                          (["--draft", "echo", "--draft-p-min", "0.5"], "not to --draft echo")):
        with pytest.raises(ValueError, match=message):
            cli(*argv)


def test_a_registered_rule_is_the_one_the_round_calls_and_a_chain_rule_refuses_trees(monkeypatch):
    calls = []

    def spy(d, p, q, u_tests, u_final):
        calls.append(len(d))
        return accept(d, p, q, u_tests, u_final)
    monkeypatch.setitem(RULES, "spy", Rule("spy", spy))  # the registry the API and the CLI read
    target = kit.TableModel(table, N_VOCAB, 40)
    got = speculative_generate(target, target, [1, 2], 10, gamma=3, rng=4, verify="spy", trace=True)
    assert got.ids == speculative_generate(target, target, [1, 2], 10, gamma=3, rng=4).ids
    assert calls == [rec["proposed"] for rec in got.trace]  # every sampled round, through the registry
    with pytest.raises(ValueError, match=r"the spy rule \(--verify spy\) verifies chains only"):
        speculative_generate(target, TreeDrafter(target, (2,)), [1, 2], 10, gamma=3, verify="spy")


def test_block_verification_is_registered_and_greedy_with_it_is_plain_greedy():
    """--verify block --temperature 0 emits plain greedy decoding's ids (the rows are one-hot); sampled, it runs
    through npspec.decode.rules.block_accept (its law: tests/test_block_verify.py); it refuses trees."""
    assert RULES["block"].chain.__module__ == "npspec.decode.rules.block" and RULES["block"].tree is None

    def cli(*argv):
        out = io.StringIO()
        generate.run(generate.build_parser().parse_args([*argv, "--json", "--quiet", "--max-new-tokens", "24"]),
                     out=out, err=io.StringIO())
        return json.loads(out.getvalue())
    block = cli("--verify", "block", "--temperature", "0")
    assert block["ids"] == cli("--gamma", "0", "--temperature", "0")["ids"] and block["stats"]["accepted"] > 0
    sampled = cli("--verify", "block", "--seed", "2")
    assert len(sampled["ids"]) == 24 and sampled["stats"]["accepted"] > 0
    with pytest.raises(ValueError, match="verifies chains only"):
        cli("--verify", "block", "--tree", "2,1")

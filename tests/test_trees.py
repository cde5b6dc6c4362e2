"""Token trees through the real code: tree attention gives each node the bits of a one-token forward along its
path, the cache keeps the accepted path, TreeDrafter reports what it drew, the round draws 2N + 1 uniforms,
greedy tree decoding is plain greedy decoding, the command line, and (slow) the law of sampled trees.
"""

import json

import numpy as np
import pytest

from npspec import testing as kit
from npspec.decode import SamplingParams, speculative_generate
from npspec.decode.drafters import DynamicTreeDrafter, TreeDrafter
from npspec.model.gpt2 import tree_paths
from npspec.decode.sampling import sample, warp
from npspec.sources import random_model
from npspec.decode.rules.trees import branching_tree

from conftest import run_python, tiny_model
from test_cli import GENERATE, assert_one_clean_line

PREFIX = [5, 6, 7]
IDS, PARENTS = [9, 1, 2, 3, 4, 8], [-1, 0, 0, 1, 1, 2]


@pytest.fixture(scope="module")
def pair():
    return tiny_model(seed=3, n_layer=2), tiny_model(seed=4, n_layer=1, role="draft")


@pytest.mark.parametrize("kernel", ["gemv-panels", "gemv-rows"])
def test_tree_rows_are_one_token_forwards_along_their_paths_bit_for_bit(pair, kernel):
    model = pair[0].with_kernel(kernel)
    cache = model.new_cache()
    model.prefill(np.array(PREFIX), cache)
    tree = model.forward_tree(np.array(IDS), PARENTS, cache)
    assert tree.dtype == np.float32 and tree.shape == (6, model.config.n_vocab) and cache.length == 9
    for i, path in enumerate(tree_paths(PARENTS)):
        one = model.new_cache()
        model.prefill(np.array(PREFIX), one)
        for r in path:
            row = model.forward(np.array([IDS[r]]), one)[-1]
        assert np.array_equal(row, tree[i]), (i, path)


def test_the_cache_keeps_the_accepted_path_and_continues_as_if_it_had_been_fed(pair):
    model = pair[0]
    cache = model.new_cache()
    model.prefill(np.array(PREFIX), cache)
    model.forward_tree(np.array(IDS), PARENTS, cache)
    cache.keep([3 + 0, 3 + 2, 3 + 5], 3)  # the path 9 -> 2 -> 8
    assert cache.length == 6
    after = model.forward(np.array([7]), cache)[-1]
    plain = model.new_cache()
    model.prefill(np.array(PREFIX), plain)
    for token in (9, 2, 8):
        model.forward(np.array([token]), plain)
    assert np.array_equal(model.forward(np.array([7]), plain)[-1], after)
    with pytest.raises(ValueError, match="cannot keep positions"):
        cache.keep([2, 3], 3)


def test_bad_tree_parents_are_refused(pair):
    model = pair[0]
    with pytest.raises(ValueError, match="parent must be -1 or an earlier row"):
        model.forward_tree(np.array([1, 2]), [-1, 1], model.new_cache())


@pytest.mark.parametrize("kind", ["sampled", "top-k"])
def test_tree_drafter_reports_the_rows_it_drew_from(pair, kind):
    _, draft = pair
    drafter = TreeDrafter(draft, (3, 2), kind)
    seq = [1, 2, 3]
    drafter.start(seq)
    warp_args = dict(temperature=0.9, top_k=0, top_p=1.0)
    u = np.random.default_rng(0).random(drafter.tree_size(2))
    proposal = drafter.propose(seq, 2, u, SamplingParams(**warp_args))
    ids, parents, q = proposal.ids, proposal.parents, proposal.q_rows(draft.config.n_vocab)
    assert (proposal.q is None) == (kind == "top-k")  # top-k children are deterministic
    assert parents == branching_tree((3, 2)) and len(ids) == 9 and q.shape == (9, draft.config.n_vocab)
    assert drafter.cache.length == len(seq) and drafter.forwards == 1 + 1 + 3  # prefill, root, three inner nodes
    for i, parent in enumerate(parents):
        ctx = seq + ([] if parent < 0 else [ids[a] for a in tree_paths(parents)[parent]])
        cache = draft.new_cache()
        draft.prefill(np.array(seq[:-1]), cache)  # as the drafter's start: the prompt but its last id
        row = warp(draft.forward(np.array(ctx[len(seq) - 1:]), cache)[-1], **warp_args)
        if kind == "sampled":
            np.testing.assert_allclose(q[i], row, rtol=0, atol=1e-12)
            assert ids[i] == sample(q[i], u[i])
        else:
            siblings = [j for j, p in enumerate(parents) if p == parent]
            assert ids[i] == int(np.argsort(-row, kind="stable")[siblings.index(i)]) and q[i][ids[i]] == 1
    drafter.rollback(len(seq) - 1)  # the round's roll back
    assert drafter.propose(seq, 1, u, SamplingParams(**warp_args)).parents == [-1, -1, -1]  # cut at depth 1


@pytest.mark.parametrize("branching", [(2,), (2, 2, 1), (3, 2, 1, 1)])
def test_each_tree_round_draws_2n_plus_1_uniforms(pair, branching):
    target, draft = pair
    rng = kit.ScriptedRng(np.random.default_rng(1).random(5000))
    gen = speculative_generate(target, TreeDrafter(draft, branching), [1, 2], 30, gamma=8, rng=rng, trace=True)
    assert rng.sizes == [2 * rec["proposed"] + 1 for rec in gen.trace]
    full = len(branching_tree(branching))
    assert rng.sizes[0] == 2 * full + 1 and gen.stats.new_tokens == 30


@pytest.mark.parametrize("kind", ["sampled", "top-k"])
@pytest.mark.parametrize("branching", [(1,), (2,), (2, 2, 1), (3, 2, 1, 1)])
def test_greedy_tree_decoding_is_plain_greedy_decoding(pair, shipped, val_ids, kind, branching):
    for target, draft, prompts in (pair + ([[1, 2, 3], [5]],), shipped + ([list(val_ids[:16])],)):
        for prompt in prompts:
            plain = speculative_generate(target, None, prompt, 30, gamma=0, temperature=0)
            for gamma in (1, 8):
                tree = speculative_generate(target, TreeDrafter(draft, branching, kind), prompt, 30, gamma=gamma,
                                            temperature=0)
                assert tree.ids == plain.ids, (branching, kind, gamma)


@pytest.mark.parametrize("budget", [1, 4, 8, 16])
def test_greedy_dynamic_tree_decoding_is_plain_greedy_decoding(pair, shipped, val_ids, budget):
    for target, draft, prompt in ((*pair, [1, 2, 3]), (*shipped, list(val_ids[:16]))):
        plain = speculative_generate(target, None, prompt, 30, gamma=0, temperature=0)
        for gamma in (2, 8):
            tree = speculative_generate(target, DynamicTreeDrafter(draft, budget), prompt, 30, gamma=gamma,
                                        temperature=0, trace=True)
            assert tree.ids == plain.ids, (budget, gamma)
            first = tree.trace[0]["tree"]
            assert len(first["ids"]) == min(budget, sum(4 ** d for d in range(1, min(gamma, budget) + 1)))


def test_dynamic_tree_reports_one_hot_rows_and_grows_by_the_drafts_rows(pair):
    _, draft = pair
    drafter = DynamicTreeDrafter(draft, 6, max_children=2)
    drafter.start([1, 2])
    proposal = drafter.propose([1, 2], 3, np.zeros(6), SamplingParams(0.8))
    ids, parents, q = proposal.ids, proposal.parents, proposal.q_rows(draft.config.n_vocab)
    assert proposal.q is None and len(ids) == 6 and all(-1 <= p < i for i, p in enumerate(parents))
    assert (q == np.eye(draft.config.n_vocab)[ids]).all() and drafter.cache.length == 2
    with pytest.raises(ValueError, match="budget must be an integer >= 1"):
        DynamicTreeDrafter(draft, 0)


def test_a_tree_is_cut_to_fit_the_context(pair):
    """Near n_ctx the verify's 1 + N rows must fit: the round's depth shrinks, down to a plain step."""
    target, draft = pair
    n_ctx = target.config.n_ctx
    prompt = list(np.arange(n_ctx - 6) % 50)
    plain = speculative_generate(target, None, prompt, 10, gamma=0, temperature=0)
    tree = speculative_generate(target, TreeDrafter(draft, (3, 2, 1)), prompt, 10, gamma=4, temperature=0, trace=True)
    assert tree.ids == plain.ids and tree.stats.stop_reason == "context"
    assert [rec["gamma"] for rec in tree.trace][-1] == 0


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_tree_on_the_command_line_returns_plain_greedys_ids():
    out = [json.loads(run_python(*GENERATE, "--json", "--temperature", "0", "--max-new-tokens", "40", *args,
                                 "ROMEO:").stdout) for args in (("--gamma", "0"), ("--tree", "2,2,1"),
                                                                ("--tree-budget", "8"))]
    assert out[1]["ids"] == out[2]["ids"] == out[0]["ids"]
    assert out[1]["stats"]["rounds"] < out[0]["stats"]["rounds"] and out[2]["stats"]["rounds"] < out[0]["stats"]["rounds"]


def test_a_tree_deeper_than_gamma_is_cut_to_gamma_levels_with_a_note():
    cut, whole = (run_python(*GENERATE, "--json", "--temperature", "0", "--max-new-tokens", "6", "--tree", "2,2,1",
                             "--gamma", gamma, "--kernel-probe", "off", "ROMEO:") for gamma in ("2", "3"))
    assert cut.returncode == whole.returncode == 0
    assert "--tree has 3 levels and --gamma is 2: each round drafts the first 2 levels; give --gamma 3" in cut.stderr
    assert "--tree has" not in whole.stderr and json.loads(cut.stdout)["ids"] == json.loads(whole.stdout)["ids"]


@pytest.mark.parametrize("args, message", [
    (["--tree", "2", "--draft", "ngram"], "cannot be combined with --draft ngram"),
    (["--tree", "2", "--draft-p-min", "0.5"], "cannot be combined"),
    (["--tree-kind", "top-k"], "--tree-kind applies to --tree only"),
    (["--tree", "2", "--tree-budget", "4"], "give one of them"),
    (["--tree-budget", "0"], "--tree-budget must be >= 1"),
    (["--tree-budget", "4", "--draft", "ngram"], "cannot be combined with --draft ngram")])
def test_bad_tree_options_get_one_clean_line(args, message):
    r = run_python(*GENERATE, "--max-new-tokens", "4", *args, "x")
    assert_one_clean_line(r, message)


@pytest.mark.parametrize("value", ["0,1", "2,x", ""])
def test_a_bad_branching_is_refused_by_the_parser(value):
    r = run_python(*GENERATE, "--tree", value, "x")
    assert r.returncode == 2 and "is not a list of counts >= 1" in r.stderr


@pytest.mark.slow
def test_greedy_tree_decoding_on_random_gpt2_shapes():
    """GPT-2's shapes with random weights (gpt2 / distilgpt2): a (2, 2, 1) tree gives plain greedy's ids."""
    target = random_model("gpt2")
    draft = random_model("distilgpt2", tokenizer=target.tokenizer, kernel="gemv-rows")
    plain = speculative_generate(target, None, [464, 1893], 24, gamma=0, temperature=0)
    for kind in ("sampled", "top-k"):
        tree = speculative_generate(target, TreeDrafter(draft, (2, 2, 1), kind), [464, 1893], 24, gamma=3,
                                    temperature=0)
        assert tree.ids == plain.ids


@pytest.mark.slow
@pytest.mark.statistical
@pytest.mark.parametrize("kind", ["sampled", "top-k"])
def test_sampled_tree_rounds_follow_the_target_law(kind):
    """The first two emitted ids of tree speculative decoding on table models against their exact law.

    Pearson's chi-square over the 16 outcomes, 20,000 runs each, rejected below p = 1e-4 per kind
    (a false-alarm rate of 2e-4 for the two). The exact proof is tests/test_trees_exact.py; this runs
    the real loop, drafter and verify end to end.
    """
    p, q = kit.random_table(4, seed=31), kit.random_table(4, seed=32)
    target, draft = kit.TableModel.from_table(p, 4), kit.TableModel.from_table(q, 4)
    law = kit.sequence_distribution(p, (0,), 2)
    outcomes = sorted(law)
    rng = np.random.default_rng(7)
    counts = dict.fromkeys(outcomes, 0)
    for _ in range(20000):
        ids = tuple(speculative_generate(target, TreeDrafter(draft, (2, 2), kind), [0], 2, gamma=2, rng=rng).ids)
        counts[ids] += 1
    stat, df, p_value, impossible = kit.chi_square([counts[o] for o in outcomes], [float(law[o]) for o in outcomes])
    assert not impossible and p_value > 1e-4, (stat, df, p_value)

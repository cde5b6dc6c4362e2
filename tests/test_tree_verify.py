"""The "rsd" tree rule wired in: DistinctTreeDrafter draws each node's children without replacement
(npspec.decode.rules.draw_children), the registered "rsd" rule verifies them (npspec.decode.rules.accept_tree_rsd), `--verify rsd`
picks both, and mixing either with the other rule's children is refused. The rule's law is proven exactly in
tests/test_tree_rules.py; here: greedy identity, the rule the round calls, the drafter's draws, a sampled run on the
shipped pair, and the errors."""

import json

import numpy as np
import pytest

from npspec.decode import RULES, Rule, SamplingParams, accept, speculative_generate
from npspec.decode.drafters import TREE_DRAFTERS, DistinctTreeDrafter, DynamicTreeDrafter, TreeDrafter
from npspec.decode.rules import accept_tree_rsd
from npspec.decode.rules.trees import accept_tree, children

from conftest import run_python, tiny_model
from test_cli import GENERATE, assert_one_clean_line


@pytest.fixture(scope="module")
def pair():
    return tiny_model(seed=3, n_layer=2), tiny_model(seed=4, n_layer=1, role="draft")


def test_the_registry_pairs_each_tree_rule_with_the_drafter_that_draws_its_children():
    assert RULES["rsd"].tree is accept_tree_rsd and RULES["rsd"].siblings == "distinct"
    assert RULES["rsd"].chain is accept  # one child per node: nothing to exclude, the token rule
    assert RULES["token"].tree is accept_tree and RULES["token"].siblings == "iid"
    assert TREE_DRAFTERS == {"iid": TreeDrafter, "distinct": DistinctTreeDrafter}


@pytest.mark.parametrize("branching", [(2,), (3, 1), (2, 2, 1)])
def test_greedy_rsd_decoding_is_plain_greedy_decoding(pair, shipped, val_ids, branching):
    for target, draft, prompt in ((*pair, [1, 2, 3]), (*shipped, list(val_ids[:16]))):
        plain = speculative_generate(target, None, prompt, 30, gamma=0, temperature=0)
        for gamma in (1, 4):
            tree = speculative_generate(target, DistinctTreeDrafter(draft, branching), prompt, 30, gamma=gamma,
                                        temperature=0, verify="rsd")
            assert tree.ids == plain.ids, (branching, gamma)


def test_the_round_calls_the_registered_rsd_rule_on_distinct_siblings(pair, monkeypatch):
    target, draft = pair
    calls = []

    def spy(ids, parents, q, p, u_tests, u_final):
        calls.append((list(ids), list(parents)))
        return accept_tree_rsd(ids, parents, q, p, u_tests, u_final)
    monkeypatch.setitem(RULES, "rsd", Rule("rsd", accept, spy, "distinct"))
    gen = speculative_generate(target, DistinctTreeDrafter(draft, (3, 2)), [1, 2, 3], 24, gamma=2, temperature=1.0,
                               verify="rsd", rng=7)
    assert len(calls) == gen.stats.rounds > 0  # every round of a tree drafter, through the registry (an empty
    assert [] in (ids for ids, _ in calls)  # tree too: the last round has room for no draft, a plain step)
    for ids, parents in calls:
        for kids in children(parents).values():
            assert len({ids[c] for c in kids}) == len(kids)  # no sibling repeats a token (full support at top-p 1)
    monkeypatch.undo()
    again = speculative_generate(target, DistinctTreeDrafter(draft, (3, 2)), [1, 2, 3], 24, gamma=2, temperature=1.0,
                                 verify="rsd", rng=7)
    assert again.ids == gen.ids  # the spy changed nothing


def test_a_short_support_repeats_the_last_child_and_the_rule_never_keeps_the_repeat(pair):
    _, draft = pair
    drafter = DistinctTreeDrafter(draft, (3,))
    row = np.zeros(draft.config.n_vocab)
    row[[4, 9]] = [0.25, 0.75]  # two tokens for three children
    kids = drafter.draw(row, np.array([0.1, 0.5, 0.9]))
    assert sorted(kids[:2]) == [4, 9] and kids[2] == kids[1]
    ids, parents, q = kids, [-1, -1, -1], np.stack([row] * 3)
    p = np.full((4, draft.config.n_vocab), 1 / draft.config.n_vocab)
    for u in np.linspace(0, 0.999, 41):  # whatever the uniforms, the third child (a repeat) is never kept
        for u_final in (0.0, 0.5, 0.99):
            path, token = accept_tree_rsd(ids, parents, q, p, np.array([u, u, u]), u_final)
            assert path != [2] and (path or token not in (4, 9))  # a rejected pair leaves 4 and 9 no mass


def test_a_sampled_rsd_run_on_the_shipped_pair(shipped, val_ids):
    target, draft = shipped
    prompt = list(val_ids[:16])
    runs = [speculative_generate(target, DistinctTreeDrafter(draft, (3, 1)), prompt, 48, gamma=2, temperature=1.0,
                                 verify="rsd", rng=11) for _ in range(2)]
    assert runs[0].ids == runs[1].ids and len(runs[0].ids) == 48  # reproducible from the seed
    s = runs[0].stats
    assert s.accepted > 0 and 1 <= s.mean_acceptance_length <= 3 and s.target_forwards == s.rounds + 1
    top_k = speculative_generate(target, DistinctTreeDrafter(draft, (3, 1)), prompt, 24, gamma=2, temperature=1.0,
                                 top_k=2, verify="rsd", rng=11)  # fewer tokens than children: repeats
    assert len(top_k.ids) == 24


def test_mixing_a_tree_rule_with_the_other_rules_children_is_refused(pair):
    target, draft = pair
    for drafter, verify, message in ((TreeDrafter(draft, (2,)), "rsd", "use verify='token'"),
                                     (DistinctTreeDrafter(draft, (2,)), "token", "use verify='rsd'"),
                                     (DistinctTreeDrafter(draft, (2,)), "block", "verifies chains only")):
        with pytest.raises(ValueError, match=message) as e:
            speculative_generate(target, drafter, [1, 2], 4, gamma=1, verify=verify)
        assert "\n" not in str(e.value)
    for deterministic in (TreeDrafter(draft, (2,), "top-k"), DynamicTreeDrafter(draft, 3)):  # one-hot q: any tree rule
        for verify in ("token", "rsd"):
            assert len(speculative_generate(target, deterministic, [1, 2], 4, gamma=1, verify=verify).ids) == 4
    proposal = DistinctTreeDrafter(draft, (2,))
    proposal.start([1, 2])
    assert proposal.propose([1, 2], 1, np.array([0.3, 0.3]), SamplingParams(1.0)).q.shape == (2, draft.config.n_vocab)


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_verify_rsd_on_the_command_line():
    out = [json.loads(run_python(*GENERATE, "--json", "--temperature", "0", "--max-new-tokens", "30", *args,
                                 "ROMEO:").stdout) for args in (("--gamma", "0"), ("--tree", "3,1", "--verify", "rsd"))]
    assert out[1]["ids"] == out[0]["ids"] and out[1]["stats"]["rounds"] < out[0]["stats"]["rounds"]
    sampled = run_python(*GENERATE, "--json", "--temperature", "1", "--max-new-tokens", "30", "--tree", "3,1",
                         "--verify", "rsd", "--seed", "3", "ROMEO:")
    assert sampled.returncode == 0 and len(json.loads(sampled.stdout)["ids"]) == 30
    for args in (["--verify", "rsd"], ["--verify", "rsd", "--tree", "2", "--tree-kind", "top-k"],
                 ["--verify", "rsd", "--tree-budget", "4"]):
        assert_one_clean_line(run_python(*GENERATE, "--max-new-tokens", "4", *args, "x"), "--verify rsd verifies a "
                              "--tree of children drawn without replacement")
    assert_one_clean_line(run_python(*GENERATE, "--max-new-tokens", "4", "--verify", "block", "--tree", "2", "x"),
                          "verifies chains only")

"""Hostile prompts against the decoding options' bounds: a prompt that leaves a drafter no room, and a prompt that
fills the context for the largest n-gram. Each is refused up front with one line, or decodes in bounded work."""

import numpy as np
import pytest

from npspec.decode import speculative_generate
from npspec.decode.drafters import MAX_NGRAM, DynamicTreeDrafter, NgramDrafter, TreeDrafter, ngram_scan
from npspec.model.gpt2 import ContextOverflowError

from conftest import tiny_model


@pytest.fixture(scope="module")
def pair():  # n_ctx 32: a tree of 32 nodes or more cannot be verified after even one id
    return tiny_model(seed=0), tiny_model(seed=1, role="draft", n_layer=1)


@pytest.mark.parametrize("make, nodes", [(lambda d: TreeDrafter(d, (8, 4)), 40),
                                         (lambda d: TreeDrafter(d, (32,)), 32),
                                         (lambda d: DynamicTreeDrafter(d, 40), 40)], ids=["static", "wide", "dynamic"])
def test_a_tree_the_context_cannot_hold_is_refused_before_any_forward(pair, make, nodes):
    # it used to be cut to the levels that fit, or to no proposal at all, saying nothing
    target, draft = pair
    drafter = make(draft)
    with pytest.raises(ValueError, match=rf"^the draft tree has {nodes} nodes but the context holds 32 ids.*most 31"):
        speculative_generate(target, drafter, [1], 4, gamma=4, temperature=0)
    assert drafter.forwards == 0


def test_a_tree_that_fits_after_one_id_shrinks_as_the_prompt_grows(pair):
    target, draft = pair
    drafter = TreeDrafter(draft, (8, 3))  # 32 nodes > 31: refused; (8, 2) is 24 nodes: taken
    with pytest.raises(ValueError, match="at most 31"):
        speculative_generate(target, drafter, [1], 4, gamma=2, temperature=0)
    gen = speculative_generate(target, TreeDrafter(draft, (8, 2)), list(range(1, 21)), 8, gamma=2, temperature=0,
                               trace=True)  # 20 ids: only the first level (8 nodes) fits, then none
    assert gen.stats.stop_reason in ("context", "max_new_tokens")
    assert all(len(r["tree"]["ids"]) <= 32 - 20 - i for i, r in enumerate(gen.trace))


def test_a_prompt_that_fills_the_context_is_refused_whatever_the_drafter(pair):
    target, draft = pair
    for drafter in (None, NgramDrafter(67, None, 1, MAX_NGRAM), TreeDrafter(draft, (2,))):
        with pytest.raises(ContextOverflowError, match="the prompt has 32 tokens but the context holds 32"):
            speculative_generate(target, drafter, [1] * 32, 4, gamma=2)


def test_the_largest_ngram_on_a_prompt_of_a_whole_context():
    target = tiny_model(seed=0, n_ctx=4 * MAX_NGRAM)
    n_ctx = target.config.n_ctx
    prompt = [int(x) for x in np.arange(n_ctx - 3) % 5 + 1]  # a period of 5 ids: every n-gram recurs
    d = NgramDrafter(67, None, MAX_NGRAM, MAX_NGRAM)
    assert d.lookup(prompt, 4) == ngram_scan(prompt, 4, MAX_NGRAM, MAX_NGRAM) == prompt[-5:-1]
    gen = speculative_generate(target, NgramDrafter(67, None, 1, MAX_NGRAM), prompt, 8, gamma=4, temperature=0)
    assert len(gen.ids) == 3 and gen.stats.stop_reason == "context"  # three ids were left


def test_prompt_ids_of_the_wrong_shape_are_named_before_the_drafter_runs(pair):
    target, draft = pair
    drafter = TreeDrafter(draft, (2,))
    with pytest.raises(TypeError, match=r"^prompt_ids must be a 1-D sequence .* shape \(1, 2\)"):
        speculative_generate(target, drafter, np.array([[1, 2]]), 4)
    assert drafter.forwards == 0

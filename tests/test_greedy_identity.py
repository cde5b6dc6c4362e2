"""Greedy speculative decoding emits exactly greedy decoding's tokens, at every level where it matters.

By construction, not by luck: the target decodes with a batch-invariant kernel (tests/test_kernels.py),
so its verify forward's gamma + 1 rows are the very logits of gamma + 1 one-token forwards, and a draft
is kept only where it equals the target's argmax. Checked for gamma 1..8 against gamma 0 (plain
decoding with the target alone) on a tiny pair, on the shipped pair, on GPT-2's shapes with random
weights, and on the command line; and the loop's own forwards are checked against one-token forwards.
Tiny targets use "gemm-blocks" and drafts "gemv-panels" (conftest.TINY_KERNELS); the shipped pair each role's
first candidate (npspec.kernels.registry.role_candidates: "compiled-panels" where the fast extra is installed).
"""

import json

import numpy as np
import pytest

from npspec.decode.evaluate import fixed_prompts
from npspec.kernels.registry import names, role_candidates
from npspec.sources import random_model
from npspec.decode import speculative_generate

from conftest import installed, run_python, tiny_model

GAMMAS = range(1, 9)


def greedy_identity(target, draft, prompts, max_new_tokens, gammas=GAMMAS, plain_runs=None):
    """For every prompt and gamma: the speculative ids are the plain ids, with the round counts they imply.

    plain_runs: a dict keeping the plain runs between calls (the target's greedy output never changes)."""
    plain_runs = {} if plain_runs is None else plain_runs
    for prompt in prompts:
        key = (tuple(prompt), max_new_tokens)
        if key not in plain_runs:
            plain_runs[key] = speculative_generate(target, None, prompt, max_new_tokens, gamma=0, temperature=0)
        plain = plain_runs[key]
        assert plain.stats.drafted == plain.stats.draft_forwards == 0
        for gamma in gammas:
            spec = speculative_generate(target, draft, prompt, max_new_tokens, gamma=gamma, temperature=0)
            assert spec.ids == plain.ids, (prompt, gamma)
            s = spec.stats
            assert s.new_tokens == len(spec.ids) and s.stop_reason == plain.stats.stop_reason
            assert s.target_forwards <= plain.stats.target_forwards
            assert s.rejected <= s.rounds and s.draft_forwards >= s.drafted
            if s.stop_reason == "max_new_tokens":
                assert s.accepted + s.rounds == max_new_tokens  # each round: its accepted drafts + 1
    return plain


# ---- (a) a tiny pair ----

def test_greedy_identity_on_a_tiny_pair():
    target, draft = tiny_model(seed=3, n_layer=3), tiny_model(seed=4, n_layer=1, role="draft")
    assert (target.kernel, draft.kernel) == ("gemm-blocks", "gemv-panels")
    plain = greedy_identity(target, draft, [[1, 2, 3], [5], [7, 1]], 25)
    assert plain.stats.new_tokens == 25
    # a draft identical to the target is always accepted
    s = speculative_generate(target, target, [1, 2, 3], 25, gamma=4, temperature=0).stats
    assert s.rejected == 0 and s.alpha == 1.0 and s.rounds == 5


def test_greedy_identity_on_random_tiny_gpt2_shapes():
    """GPT-2's init gives near-uniform logits over 50257 ids: near-ties everywhere, the hardest case for identity."""
    target = random_model("tiny", seed=1)
    draft = random_model("tiny-draft", seed=2, tokenizer=target.tokenizer, kernel="gemv-rows")
    prompts = [target.tokenizer.encode(t).ids for t in ("Hello", "The quick brown fox", "1 2 3 4 5 6 7 8")]
    greedy_identity(target, draft, prompts, 16)
    greedy_identity(target, random_model("tiny", seed=3, tokenizer=target.tokenizer, kernel="gemv-rows"),
                    prompts[:1], 16)


# ---- the loop's forwards, by their results ----

class Recorder:
    """A model as the loop sees it: the real model computes everything; each forward's ids, the ids its cache
    held before them, and its logits are kept."""

    def __init__(self, model):
        self.model, self.config, self.tokenizer, self.source = model, model.config, model.tokenizer, model.source
        self.prefills, self.forwards, self.held = [], [], {}  # [ids], [(held ids, ids, logits)], cache -> ids

    def new_cache(self):
        return self.model.new_cache()

    def prefill(self, ids, cache):
        self.prefills.append([int(i) for i in ids])
        self.held[id(cache)] = self.held.get(id(cache), [])[: cache.length] + self.prefills[-1]
        return self.model.prefill(ids, cache)

    def forward(self, ids, cache):
        held, ids = self.held[id(cache)][: cache.length], [int(i) for i in ids]
        logits = self.model.forward(np.asarray(ids), cache)
        self.forwards.append((held, ids, logits.copy()))
        self.held[id(cache)] = held + ids
        return logits


def one_token_logits(model, prompt, held, ids):
    """The logits of `ids` fed one at a time after `held` (the prompt's prefill, then one-token forwards)."""
    assert held[: len(prompt) - 1] == prompt[:-1]
    cache = model.new_cache()
    model.prefill(np.asarray(prompt[:-1]), cache)
    for t in held[len(prompt) - 1 :]:
        model.forward([t], cache)
    return np.concatenate([model.forward([t], cache) for t in ids])


@pytest.mark.parametrize("same_weights", [False, True], ids=["other-draft", "self-draft"])
def test_the_loops_forwards_are_one_token_forwards(same_weights):
    """Every forward after the prompt's prefill, the verify of gamma + 1 rows included, gives the bits of
    one-token forwards of the same ids after the same ids."""
    model = tiny_model(seed=51)
    target = Recorder(model)
    draft = Recorder(model.with_kernel("gemv-rows") if same_weights else tiny_model(seed=52, n_layer=1, role="draft"))
    prompt = [1, 2, 3, 4]
    gen = speculative_generate(target, draft, prompt, 20, gamma=4, temperature=0)
    for rec in (target, draft):
        assert rec.prefills == [prompt[:-1]]  # all but the last prompt id, once
        for held, ids, logits in rec.forwards:
            assert np.array_equal(logits, one_token_logits(rec.model, prompt, held, ids)), (held, ids)
    for held, _, _ in target.forwards:  # rolled back after each round: the target's cache holds emitted ids only
        assert held == (prompt + gen.ids)[: len(held)]
    assert max(len(ids) for _, ids, _ in target.forwards) == 5  # verify feeds gamma + 1 rows
    if same_weights:  # every draft kept: the next round feeds the draft its last draft and the bonus id at once
        assert gen.stats.rejected == 0 and max(len(ids) for _, ids, _ in draft.forwards) == 2
    else:
        assert gen.stats.rejected > 0 and gen.stats.accepted > 0  # both kinds of round ran


# ---- (b) the shipped pair ----

@pytest.fixture(scope="module")
def shipped_plain():
    """The shipped target's plain greedy runs, shared by the gammas."""
    return {}


@pytest.mark.parametrize("gamma", GAMMAS)
def test_greedy_identity_on_the_shipped_pair(shipped, val_ids, shipped_plain, gamma):
    target, draft = shipped
    assert (target.kernel, draft.kernel) == (role_candidates("target")[0], role_candidates("draft")[0])
    assert target.invariant
    for prompt in fixed_prompts(val_ids, n=3, length=24):
        plain = greedy_identity(target, draft, [prompt], 40, [gamma], shipped_plain)
        assert plain.stats.new_tokens == 40 and plain.stats.stop_reason == "max_new_tokens"  # so every round counts
    prompts = fixed_prompts(val_ids, n=6, length=17) + [[0], val_ids[:2]]  # incl. prompts of 1 and 2 ids
    greedy_identity(target, draft, prompts, 24, [gamma], shipped_plain)


@pytest.mark.parametrize("kernel", installed(names(codes=False)))
def test_the_drafts_kernel_does_not_change_greedy_output(shipped, kernel):
    target, draft = shipped
    prompt = target.tokenizer.encode("ROMEO:").ids
    plain = speculative_generate(target, None, prompt, 24, gamma=0, temperature=0).ids
    assert speculative_generate(target, draft.with_kernel(kernel), prompt, 24, gamma=3, temperature=0).ids == plain


# ---- (c) GPT-2's shapes, random weights ----

@pytest.mark.slow
def test_greedy_identity_random_gpt2_with_distilgpt2_draft():
    """Target random:gpt2, draft random:distilgpt2 (seed 0 each, as npspec.sources.random_model builds them),
    prompt "Hello", gamma 4 vs gamma 0, greedy, 32 new tokens."""
    target = random_model("gpt2")
    draft = random_model("distilgpt2", tokenizer=target.tokenizer, kernel="gemv-rows")
    ids = target.tokenizer.encode("Hello").ids
    plain = speculative_generate(target, None, ids, 32, gamma=0, temperature=0)
    spec = speculative_generate(target, draft, ids, 32, gamma=4, temperature=0)
    assert len(plain.ids) == 32 and spec.ids == plain.ids


# ---- (d) the command line ----

@pytest.mark.slow
def test_greedy_identity_on_the_command_line(tmp_path):
    """The same through `python -m npspec.generate`, with the default kernels of each role."""
    out = []
    for draft_args in (["--draft", "random:distilgpt2", "--gamma", "4"], ["--gamma", "0"]):  # --gamma 0 takes no --draft
        r = run_python("-m", "npspec.generate", "--target", "random:gpt2", *draft_args,
                       "--temperature", "0", "--max-new-tokens", "32", "--json", "Hello",
                       env={"NPSPEC_CACHE": str(tmp_path / "cache")}, timeout=1800)
        assert r.returncode == 0, r.stderr
        out.append(json.loads(r.stdout)["ids"])
    assert len(out[0]) == 32 and out[0] == out[1]

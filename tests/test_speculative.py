"""The speculative loop (issue 2, section 5): greedy identity, budgets, EOS, statistics."""

import numpy as np
import pytest

from npspec.evaluate import fixed_prompts
from npspec.speculative import speculative_generate

from conftest import tiny_model


@pytest.mark.parametrize("gamma", range(1, 9))
def test_greedy_speculative_equals_greedy(shipped, val_ids, gamma):
    """Token identity, exactly: the verify forward is batch-invariant (see model.gpt2)."""
    target, draft = shipped
    for prompt in fixed_prompts(val_ids, n=3, length=24):
        plain = speculative_generate(target, None, prompt, 40, gamma=0, temperature=0)
        spec = speculative_generate(target, draft, prompt, 40, gamma=gamma, temperature=0)
        assert spec.ids == plain.ids
        s = spec.stats
        assert s.new_tokens == 40 and s.accepted + s.rounds == 40  # each round: accepted drafts + 1
        assert s.rejected <= s.rounds and s.draft_forwards >= s.drafted


def test_greedy_identity_on_random_models():
    target, draft = tiny_model(seed=3, n_layer=3), tiny_model(seed=4, n_layer=1)
    prompt = [1, 2, 3]
    plain = speculative_generate(target, None, prompt, 25, gamma=0, temperature=0).ids
    for gamma in (1, 3, 8):
        assert speculative_generate(target, draft, prompt, 25, gamma=gamma, temperature=0).ids == plain
    # a draft identical to the target is always accepted
    s = speculative_generate(target, target, prompt, 25, gamma=4, temperature=0).stats
    assert s.rejected == 0 and s.alpha == 1.0 and s.rounds == 5


def test_budget_is_exact_and_stats_consistent(shipped, val_ids):
    target, draft = shipped
    prompt = fixed_prompts(val_ids, n=1)[0]
    for n in (1, 2, 5, 13):
        gen = speculative_generate(target, draft, prompt, n, gamma=4, temperature=0.8, top_p=0.95,
                                   rng=np.random.default_rng(7))
        s = gen.stats
        assert len(gen.ids) == s.new_tokens == n and s.stop_reason == "max_new_tokens"
        assert s.accepted + s.rounds == n
        assert s.tokens_per_round == n / s.rounds
        assert sum(s.accepted_by_position) == s.accepted and sum(s.tested_by_position) == s.accepted + s.rejected
    one = speculative_generate(target, target, prompt, 1, gamma=4, temperature=0).stats
    assert one.new_tokens == 1 and one.drafted == 0  # gamma is clamped to remaining - 1 = 0


def test_stops_at_context_without_error():
    target, draft = tiny_model(seed=5), tiny_model(seed=6, n_layer=1, n_ctx=20)
    gen = speculative_generate(target, draft, [1, 2, 3], 100, gamma=4, temperature=0)
    assert gen.stats.stop_reason == "context" and 3 + len(gen.ids) == 20  # the smaller n_ctx
    with pytest.raises(ValueError, match="context holds 20"):
        speculative_generate(target, draft, list(range(21)), 5, gamma=4)


def test_eos_ends_generation_and_is_counted():
    m = tiny_model(seed=8)
    greedy = speculative_generate(m, None, [1, 2], 12, gamma=0, temperature=0).ids
    eos = greedy[5]
    first = greedy.index(eos)
    from dataclasses import replace
    m_eos = type(m)(replace(m.config, eos_token_id=eos), m.params, None, m.path, {})
    for gamma in (0, 2, 4, 8):
        gen = speculative_generate(m_eos, m_eos, [1, 2], 12, gamma=gamma, temperature=0, trace=True)
        assert gen.ids == greedy[: first + 1] and gen.stats.stop_reason == "eos"
        assert gen.stats.new_tokens == first + 1
        # draft == target: every drafted token up to the EOS is accepted, nothing after it counted;
        # a round that ends on an accepted EOS has no target-produced token
        cut = gen.trace[-1]["token"] is None
        assert cut == (gamma > first)
        assert gen.stats.rejected == 0 and gen.stats.accepted + gen.stats.rounds - cut == first + 1
        assert gen.stats.drafted == gen.stats.accepted


def test_seeded_runs_reproduce(shipped):
    target, draft = shipped
    runs = [speculative_generate(target, draft, [5, 6, 7], 30, gamma=3, temperature=1.0,
                                 rng=np.random.default_rng(11)).ids for _ in range(2)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("kw, msg", [(dict(max_new_tokens=0), "max_new_tokens"), (dict(gamma=-1), "gamma"),
                                     (dict(temperature=-0.5), "temperature"), (dict(top_p=0), "top_p")])
def test_bad_options(tiny, kw, msg):
    args = dict(max_new_tokens=5, gamma=2)
    with pytest.raises(ValueError, match=msg):
        speculative_generate(tiny, tiny, [1], **{**args, **kw})


def test_vocabulary_mismatch_refused(tiny):
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_generate(tiny, tiny_model(n_vocab=50), [1], 5, gamma=2)

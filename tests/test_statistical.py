"""Statistical checks of the real loop against the exact law (marked statistical and slow: `pytest -m slow`).

Each test compares counts from many seeded runs of speculative_generate with the exact law
from npspec.testing's enumeration, by Pearson's chi-square (cells with expected count < 5
pooled). False-alarm rate: each chi-square comparison fails a correct implementation with
probability ALPHA = 1e-4 (asymptotically, for a random choice of seeds); each test's docstring
states its total. The seeds are fixed, so a run is reproducible; the exact tests in
test_one_step.py and test_loop_replay.py are the proof, these watch the real loop.
"""

import numpy as np
import pytest

from npspec import testing as kit
from npspec.decode import speculative_generate

from conftest import tiny_model

pytestmark = [pytest.mark.statistical, pytest.mark.slow]

ALPHA = 1e-4


def assert_fits(counts, probs, what):
    stat, df, pv, impossible = kit.chi_square(counts, probs)
    assert not impossible, f"{what}: outcomes of probability 0 happened: cells {impossible}"
    assert pv >= ALPHA, f"{what}: chi-square {stat:.1f} on {df} df, p-value {pv:.3g} < {ALPHA}"
    return stat, df, pv


def test_tiny_gpt2_sequences_match_the_exact_law():
    """10000 runs of 3 new tokens (gamma 2, temperature 1.3, top-k 4, EOS 4) on a 5-token GPT-2 pair:
    the law of whole output sequences, and the acceptance rate of the first draft (beta = sum(min(p, q))).
    False-alarm rate: at most 2 * ALPHA = 2e-4 (two comparisons)."""
    target = tiny_model(seed=61, n_vocab=5, n_ctx=16, n_layer=2, eos_token_id=4)
    draft = tiny_model(seed=62, role="draft", n_vocab=5, n_ctx=16, n_layer=1, eos_token_id=4)
    warp_args = dict(temperature=1.3, top_k=4)
    prompt = [1, 2]
    p, q = kit.model_table(target, **warp_args), kit.model_table(draft, **warp_args)
    exact = kit.sequence_distribution(p, prompt, 3, eos=4)
    outcomes = sorted(exact)
    index = {k: i for i, k in enumerate(outcomes)}
    counts = np.zeros(len(outcomes))
    first_accepted, n = 0, 10000
    for seed in range(n):
        gen = speculative_generate(target, draft, prompt, 3, gamma=2, rng=np.random.default_rng(seed), trace=True,
                                   **warp_args)
        counts[index[tuple(gen.ids)]] += 1  # a KeyError here is an impossible sequence
        first_accepted += gen.trace[0]["accepted"] >= 1
    assert_fits(counts, np.array([exact[k] for k in outcomes]), "output sequences")
    beta = float(np.minimum(p(tuple(prompt)), q(tuple(prompt))).sum())
    assert 0.2 < beta < 0.95  # both outcomes are frequent: the test has power
    assert_fits([first_accepted, n - first_accepted], [beta, 1 - beta], "first-draft acceptance")


def test_shipped_pair_first_token_matches_the_target(shipped):
    """5000 runs on the shipped pair (temperature 0.8, top-p 0.95, gamma 4): the first emitted token
    (an accepted draft or a residual sample) has the target's warped law at the prompt.
    False-alarm rate: ALPHA = 1e-4."""
    target, draft = shipped
    prompt = target.tokenizer.encode("ROMEO:\n").ids
    warp_args = dict(temperature=0.8, top_p=0.95)
    p_row = kit.model_table(target, **warp_args)(tuple(prompt))
    counts = np.zeros(target.config.n_vocab)
    rejected = 0
    for seed in range(5000):
        gen = speculative_generate(target, draft, prompt, 2, gamma=4, rng=np.random.default_rng(seed), trace=True,
                                   **warp_args)
        counts[gen.ids[0]] += 1
        rejected += gen.trace[0]["accepted"] == 0
    assert rejected > 100  # the residual path is exercised, not only accepted drafts
    assert_fits(counts, p_row, "first emitted token")


def test_npspec_sampler_passes_the_kit_at_full_size():
    """The kit's own statistical tests at their default size (20000 trials per case).
    False-alarm rate: at most 1e-6 in total (the kit's alpha, split over its 9 chi-square tests)."""
    report = kit.check_sampler(*kit.npspec_sampler(temperature=0.9, top_p=0.9))
    assert report.ok, str(report)

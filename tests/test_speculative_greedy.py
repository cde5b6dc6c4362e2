"""The greedy fast path (temperature 0): the same round as the general one, without one-hot rows."""

import itertools

import numpy as np
import pytest

from npspec import speculative
from npspec import testing as kit
from npspec.sampling import greedy, sample, warp
from npspec.speculative import accept, accept_greedy, speculative_generate

from conftest import tiny_model

US = (0.0, 0.3, 0.5, kit.ONE_BELOW)  # uniforms, both ends included


def test_greedy_is_the_id_warp_puts_its_mass_on():
    logits = np.array([[1.0, 3.0, 3.0, -2.0],  # tie: the lower id, 1
                       [0.0, 0.0, 0.0, 0.0],  # all tied: 0
                       [-np.inf, -5.0, -np.inf, -6.0],  # -inf entries are never picked: 1
                       [np.float32(1.0), np.nextafter(np.float32(1.0), np.float32(2.0)), 0.0, 0.0]],  # 1 ulp apart: 1
                      dtype=np.float32)
    assert greedy(logits).tolist() == [1, 0, 1, 1]
    for row in logits:
        assert all(greedy(row) == sample(warp(row, temperature=0), u) for u in US)


@pytest.mark.parametrize("row", [[np.nan, 0.0], [0.0, np.nan], [np.inf, 0.0], [-np.inf, -np.inf]])
def test_greedy_refuses_what_warp_refuses(row):
    with pytest.raises(ValueError, match="NaN or \\+inf, or a row is entirely -inf"):
        greedy(np.array(row, dtype=np.float32))
    with pytest.raises(ValueError, match="NaN or \\+inf, or a row is entirely -inf"):
        greedy(np.array([[0.0, 1.0], row], dtype=np.float32))  # one bad row among good ones


def test_accept_greedy_equals_accept_on_one_hot_rows():
    """Every draft and every target table over 3 ids (ties included), gamma 1 and 2, all uniforms in US."""
    rows = [np.array(r, dtype=np.float32) for r in itertools.product((0.0, 1.0), repeat=3) if any(r)]
    rows.append(np.array([0.0, 0.0, 0.0], dtype=np.float32))  # all tied
    cases = 0
    for gamma in (1, 2):
        for d in itertools.product(range(3), repeat=gamma):
            for p_logits in itertools.product(rows, repeat=gamma + 1):
                p_logits = np.stack(p_logits)
                p = warp(p_logits, temperature=0)
                q = warp(np.eye(3, dtype=np.float32)[list(d)], temperature=0)  # the draft's one-hot on d_i
                fast = accept_greedy(list(d), greedy(p_logits))
                for u in US:
                    assert accept(np.array(d), p, q, np.full(gamma, u), u) == fast
                cases += 1
    assert cases == sum(3 ** g * 8 ** (g + 1) for g in (1, 2))


def test_greedy_round_takes_the_argmax_rows_and_draws_the_documented_uniforms(monkeypatch):
    """The greedy twin of test_edge_cases' q/p test: d_i is the draft's argmax, best the target's, per context."""
    target, draft = tiny_model(seed=41, n_layer=2), tiny_model(seed=42, n_layer=1)
    p_row, q_row = kit.model_table(target, temperature=0), kit.model_table(draft, temperature=0)
    calls, draws = [], []

    def spy(d, best):
        calls.append((list(d), best))
        return accept_greedy(d, best)

    class RecordingRng:
        def __init__(self):
            self.rng = np.random.default_rng(5)

        def random(self, n):
            draws.append(n)
            return self.rng.random(n)

    monkeypatch.setattr(speculative, "accept_greedy", spy)
    prompt = [3]  # one id: no prefill, every row from the batch-invariant path
    gen = speculative_generate(target, draft, prompt, 12, gamma=3, temperature=0, rng=RecordingRng(), trace=True)
    assert len(calls) == len(draws) == len(gen.trace) == gen.stats.rounds
    seq = list(prompt)
    for (d, best), n_u, rec in zip(calls, draws, gen.trace):
        g = len(d)
        assert n_u == 2 * g + 1  # drawn though unused, so the draw count does not depend on the temperature
        for i in range(g):
            assert d[i] == int(np.argmax(q_row(tuple(seq + d[:i]))))  # the one-hot q's id
        for i in range(g + 1):
            assert best[i] == int(np.argmax(p_row(tuple(seq + d[:i]))))  # the one-hot p's id
        seq += d[: rec["accepted"]] + [rec["token"]]
    assert seq == prompt + gen.ids

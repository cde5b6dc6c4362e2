"""The loop makes exactly the decisions its rows dictate: paths replayed through speculative_generate
from scripted uniforms (kit.ScriptedRng), in the documented order.

Per round of g drafts the loop draws 2g + 1 uniforms: g for the draft's samples, g for the
acceptance tests, 1 for the corrected or bonus token. `edge_uniforms` puts each on the EDGE of
its decision, computed from the rows the loop must use (kit.model_table: each model's row after
the context, warped with the run's options): a kept draft gets the largest u below p(d)/q(d), a
rejected one u = p(d)/q(d) itself (the test is strict), a sampled token the lowest or the highest
u of its inverse-CDF cell in q, in the residual or in p. So a loop that tests or samples from any
other array (q not the one the draft was drawn from, p warped otherwise, a residual of other rows)
or reads its uniforms in another order leaves the path, down to one rounding of a ratio.
"""

import numpy as np
import pytest

from npspec import testing as kit
from npspec.decode.sampling import residual, sample
from npspec.decode import speculative_generate

from conftest import tiny_model
from test_one_step import tables

PROMPT = (0, 1)


def cell_edge(row, token, upper):
    """The lowest (upper=False) or highest (upper=True) u in [0, 1) with sample(row, u) == token."""
    cdf = np.cumsum(row)
    u = min(float((cdf[token] if upper else (cdf[token - 1] if token else 0.0)) / cdf[-1]), kit.ONE_BELOW)
    inward, outward = (0.0, 1.0) if upper else (1.0, 0.0)
    for _ in range(64):  # the estimate is a few roundings off the edge
        if sample(row, u) == token:
            break
        u = float(np.nextafter(u, inward))
    assert sample(row, u) == token, f"no uniform samples {token} from {row}"
    for _ in range(64):
        v = float(np.nextafter(u, outward))
        if v == u or v >= 1 or sample(row, v) != token:
            return u
        u = v
    raise AssertionError(f"the edge of {token}'s cell in {row} is not near its CDF")


def accept_edge(p_row, q_row, x, kept):
    """The u on the edge of the strict test u < p(x)/q(x): the largest that keeps x, or the smallest that rejects it."""
    with np.errstate(over="ignore"):
        ratio = float(p_row[x] / q_row[x])
    if kept:
        assert ratio > 0
        return kit.ONE_BELOW if ratio >= 1 else float(np.nextafter(ratio, 0.0))
    assert ratio < 1
    return ratio


def edge_uniforms(rounds, p, q, prompt, gamma, max_new_tokens, upper):
    """The uniforms that drive the loop down `rounds`, every decision on its edge, and each round's count 2g + 1.

    rounds: (drafted, accepted, token) per round, as a trace record or a kit.Round (whose drafts stop at
    the rejected one: later drafts get u = 0.5). p, q: tables of the rows the loop must use.
    upper: every sampled token at the top (True) or the bottom (False) of its cell.
    """
    seq, values, sizes = tuple(prompt), [], []
    for drafted, n, token in rounds:
        g = min(gamma, max_new_tokens - (len(seq) - len(prompt)) - 1)
        ctx = [seq + tuple(drafted[:i]) for i in range(len(drafted) + 1)]
        rejected = token is not None and n < len(drafted)
        drafts = [cell_edge(q(ctx[i]), x, upper) for i, x in enumerate(drafted)]
        tests = [accept_edge(p(ctx[i]), q(ctx[i]), drafted[i], kept=i < n) for i in range(n + rejected)]
        final = 0.5
        if token is not None:
            final = cell_edge(residual(p(ctx[n]), q(ctx[n])) if rejected else p(ctx[n]), token, upper)
        values += drafts + [0.5] * (g - len(drafts)) + tests + [0.5] * (g - len(tests)) + [final]
        sizes.append(2 * g + 1)
        seq += tuple(drafted[:n]) + ((token,) if token is not None else ())
    return values, sizes


@pytest.mark.parametrize("gamma, max_new_tokens, eos", [(1, 3, None), (2, 3, 2), (3, 4, None), (4, 4, 2)])
def test_every_path_replays_through_the_real_loop(gamma, max_new_tokens, eos):
    """For every path the oracle enumerates, uniforms on the edges of its decisions drive
    speculative_generate down the same path: same ids, same rounds (drafts, accepted count,
    corrected or bonus token), 2g + 1 uniforms per round with g clamped as documented."""
    p_exact, q_exact = tables(3, {})
    target = kit.TableModel.from_table(p_exact, 3, eos_token_id=eos)
    draft = kit.TableModel.from_table(q_exact, 3, eos_token_id=eos)
    p, q = kit.model_table(target), kit.model_table(draft)  # float64 rows exactly as the loop sees them
    paths = list(kit.speculative_paths(p, q, PROMPT, gamma, max_new_tokens, eos, rule=kit.npspec_rule))
    rounds = [rnd for path in paths for rnd in path.rounds]
    assert any(rnd.token is not None and rnd.accepted < len(rnd.drafted) for rnd in rounds)  # a rejection
    full = min(gamma, max_new_tokens - 1)
    assert any(rnd.token is not None and rnd.accepted == len(rnd.drafted) == full for rnd in rounds)  # a bonus
    assert eos is None or any(rnd.token is None for rnd in rounds)  # an accepted EOS
    for path in paths:
        for upper in (False, True):
            values, sizes = edge_uniforms([(r.drafted, r.accepted, r.token) for r in path.rounds], p, q, PROMPT,
                                          gamma, max_new_tokens, upper)
            rng = kit.ScriptedRng(values)
            gen = speculative_generate(target, draft, list(PROMPT), max_new_tokens, gamma=gamma, temperature=1.0,
                                       rng=rng, trace=True)
            assert tuple(gen.ids) == path.ids
            assert rng.sizes == sizes and not rng.values
            assert len(gen.trace) == len(path.rounds)
            for rec, rnd in zip(gen.trace, path.rounds):
                assert rec["accepted"] == rnd.accepted and rec["token"] == rnd.token
                assert tuple(rec["drafted"][: len(rnd.drafted)]) == rnd.drafted


def decided(trace):
    """What the rows decide in each round's record: the ids, the count kept, p(d_i) and q(d_i) (not the
    uniforms, which a replay picks on the edges, nor the timings)."""
    return [{k: rec[k] for k in ("drafted", "accepted", "token", "p", "q")} for rec in trace]


@pytest.fixture(scope="module")
def pair():
    return tiny_model(seed=41, n_layer=2), tiny_model(seed=42, role="draft", n_layer=1)


@pytest.mark.parametrize("warp_args", [dict(temperature=1.0), dict(temperature=0.7, top_k=5),
                                       dict(temperature=1.2, top_p=0.6)], ids=["T1", "T0.7_k5", "T1.2_p0.6"])
def test_q_is_what_the_draft_sampled_from_and_p_is_warped_alike(pair, warp_args):
    """A seeded run on tiny GPT-2s, replayed on the edges of the rows it must use (q: the draft's row
    after warping; p: the target's, warped the same way; per context), is repeated exactly."""
    target, draft = pair
    p, q = kit.model_table(target, **warp_args), kit.model_table(draft, **warp_args)
    prompt = [3]  # one id: no prefill, so every row comes from the batch-invariant path, bit for bit
    gen = speculative_generate(target, draft, prompt, 12, gamma=3, rng=np.random.default_rng(5), trace=True,
                               **warp_args)
    rounds = [(rec["drafted"], rec["accepted"], rec["token"]) for rec in gen.trace]
    assert any(n < len(d) for d, n, _ in rounds) and any(n > 0 for _, n, _ in rounds)  # rejections and accepts
    for upper in (False, True):
        values, sizes = edge_uniforms(rounds, p, q, prompt, 3, 12, upper)
        rng = kit.ScriptedRng(values)
        again = speculative_generate(target, draft, prompt, 12, gamma=3, rng=rng, trace=True, **warp_args)
        assert decided(again.trace) == decided(gen.trace) and again.ids == gen.ids
        assert rng.sizes == sizes and not rng.values


def test_greedy_round_takes_the_argmax_rows_and_draws_the_documented_uniforms(pair):
    """Temperature 0: d_i is the draft's argmax and the kept drafts, the correction and the bonus are the
    target's argmax, per context; each round still draws its 2g + 1 uniforms, and they change nothing."""
    target, draft = pair
    p_row, q_row = kit.model_table(target, temperature=0), kit.model_table(draft, temperature=0)
    prompt = [3]  # one id: no prefill, every row from the batch-invariant path
    runs = []
    for values in (np.random.default_rng(5).random(100), np.zeros(100), np.full(100, kit.ONE_BELOW)):
        rng = kit.ScriptedRng(values)
        gen = speculative_generate(target, draft, prompt, 12, gamma=3, temperature=0, rng=rng, trace=True)
        assert len(rng.sizes) == len(gen.trace) == gen.stats.rounds
        assert rng.sizes == [2 * len(rec["drafted"]) + 1 for rec in gen.trace]  # drawn though unused
        runs.append((gen.ids, decided(gen.trace)))
    assert runs[1] == runs[0] == runs[2]
    seq = list(prompt)
    for rec in gen.trace:
        d, n = rec["drafted"], rec["accepted"]
        for i in range(len(d)):
            assert d[i] == int(np.argmax(q_row(tuple(seq + d[:i]))))  # the one-hot q's id
        best = [int(np.argmax(p_row(tuple(seq + d[:i])))) for i in range(n + 1)]  # the one-hot p's ids
        assert d[:n] == best[:n] and (n == len(d) or d[n] != best[n]) and rec["token"] == best[n]
        seq += d[:n] + [rec["token"]]
    assert seq == prompt + gen.ids

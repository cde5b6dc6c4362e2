"""Edge cases real implementations got wrong, a test each; hand-made logits; statistics and the CLI."""

import io
import json
import os
import pty
import re
import subprocess
import sys

import numpy as np
import pytest

import npspec
from npspec import speculative
from npspec import testing as kit
from npspec.checkpoint import Model
from npspec.sampling import residual, sample, warp
from npspec.speculative import accept, round_gamma, speculative_generate

from conftest import ROOT, tiny_model

from npspec.generate import GREEN, RESET, build_parser, run  # noqa: E402

NEG = -np.inf


def rows_model(rows, n_prompt, eos=None, n_ctx=64):
    """A TableModel whose logits depend only on the position after the prompt: rows[k] for the k-th new token."""
    return kit.TableModel(lambda seq: rows[min(len(seq) - n_prompt, len(rows) - 1)], len(rows[0]), n_ctx, eos)


# ---- hand-made logits (+/-10 and -inf), exact outcomes

def test_hand_made_rows_through_accept():
    """accept() on warped hand-made rows, temperature 1, vocabulary of 4; u chosen per row."""
    p = warp(np.array([
        [10, 10, NEG, NEG],  # p1 = [1/2, 1/2, 0, 0]: d1 = 0 has ratio 1/2
        [NEG, 10, 10, NEG],  # p2 = [0, 1/2, 1/2, 0]: d2 = 1 has ratio 1/2
        [NEG, NEG, NEG, 10],  # p3: the bonus is 3
    ], dtype=np.float32))
    q = warp(np.array([
        [10, NEG, NEG, NEG],  # q1 one-hot on 0
        [NEG, 10, NEG, NEG],  # q2 one-hot on 1
    ], dtype=np.float32))
    d = np.array([0, 1])
    below = np.nextafter(0.5, 0)
    assert accept(d, p, q, np.array([below, 0.5]), 0.0) == (1, 2)  # accepts 1, rejects at 2 (u = p/q); residual -> 2
    assert accept(d, p, q, np.array([0.5, 0.0]), 0.0) == (0, 1)  # rejects at 1: residual of p1 - q1 is [0,1,0,0]
    assert accept(d, p, q, np.array([0.0, below]), 0.9) == (2, 3)  # all accepted: bonus 3 from p3
    # -10 leaves a sliver of mass: q = [1 - 2e-9, 2e-9, 0, 0]; p(1) = 0 rejects d = 1 even with u = 0
    q_sliver = warp(np.array([[10, -10, NEG, NEG]], dtype=np.float32))
    p_zero = warp(np.array([[10, NEG, 10, NEG], [0, 0, 0, 0]], dtype=np.float32))
    assert accept(np.array([1]), p_zero, q_sliver, np.array([0.0]), 0.99) == (0, 2)  # residual [~0, 0, ~1, 0] -> 2


ROUND_ROWS = {  # per new position k (the last row repeats): draft rows, target rows, then the expected round
    "accepts 1, rejects at 2": (
        [[10, NEG, NEG, NEG],  # k=0: draft sure of 0
         [NEG, 10, NEG, NEG],  # k=1: draft sure of 1
         [NEG, NEG, 10, NEG]],  # k=2: draft sure of 2 (drafted, never tested: the round ends at k=1)
        [[10, 10, NEG, NEG],  # k=0: target 1/2 on 0: u = 0.25 < 1/2 accepts 0
         [NEG, NEG, 10, NEG],  # k=1: target gives 1 probability 0: rejected, residual one-hot on 2
         [NEG, NEG, NEG, 10]],  # k=2: (a bonus would be 3)
        [0, 1, 2], 1, 2),
    "all accepted, bonus": (
        [[10, NEG, NEG, NEG], [NEG, 10, NEG, NEG], [NEG, NEG, 10, NEG], [NEG, NEG, NEG, 10]],  # draft: 0, 1, 2
        [[10, NEG, NEG, NEG], [NEG, 10, NEG, NEG], [NEG, NEG, 10, NEG],  # target agrees at k = 0, 1, 2
         [NEG, NEG, NEG, 10]],  # k=3: the bonus is 3
        [0, 1, 2], 3, 3),
    "rejects at 1": (
        [[10, -10, NEG, NEG],  # k=0: draft ~sure of 0 (q(1) = 2e-9; u = 0.25 picks 0)
         [10, NEG, NEG, NEG]],  # k>=1: draft sure of 0
        [[NEG, 10, NEG, NEG],  # k=0: target sure of 1: 0 rejected even at u = 0.25, residual -> 1
         [10, NEG, NEG, NEG]],
        [0, 0, 0], 0, 1),
}


@pytest.mark.parametrize("case", list(ROUND_ROWS))
def test_hand_made_rows_through_the_loop(case):
    """The same kind of rows as models: the first round of gamma = 3, every uniform 0.25, is exactly as commented."""
    draft_rows, target_rows, drafted, n_accepted, token = ROUND_ROWS[case]
    draft, target = rows_model(np.array(draft_rows), 1), rows_model(np.array(target_rows), 1)
    rng = kit.ScriptedRng([0.25] * 30)
    gen = speculative_generate(target, draft, [0], 4, gamma=3, temperature=1.0, rng=rng, trace=True)
    assert gen.trace[0] == {"drafted": drafted, "accepted": n_accepted, "token": token}
    assert gen.ids[: n_accepted + 1] == drafted[:n_accepted] + [token]
    assert rng.sizes[0] == 7  # g = min(3, 4 - 1): 3 draft draws, 3 acceptance tests, 1 final draw


# ---- q is the array sampled from; p carries the same warping; the documented uniform order

class RecordingRng:
    """A real seeded Generator that records every `random(n)` it hands out."""

    def __init__(self, seed):
        self.rng, self.draws = np.random.default_rng(seed), []

    def random(self, n):
        u = self.rng.random(n)
        self.draws.append(u)
        return u


@pytest.mark.parametrize("warp_args", [dict(temperature=1.0), dict(temperature=0.7, top_k=5),
                                       dict(temperature=1.2, top_p=0.6)],
                         ids=["T1", "T0.7_k5", "T1.2_p0.6"])  # greedy: test_speculative_greedy.py
def test_q_is_what_the_draft_sampled_from_and_p_is_warped_alike(monkeypatch, warp_args):
    target, draft = tiny_model(seed=41, n_layer=2), tiny_model(seed=42, n_layer=1)
    p_row, q_row = kit.model_table(target, **warp_args), kit.model_table(draft, **warp_args)
    calls = []

    def spy(d, p, q, u_accept, u_final):
        calls.append((list(d), p, q, u_accept, u_final))
        return accept(d, p, q, u_accept, u_final)

    monkeypatch.setattr(speculative, "accept", spy)
    rng = RecordingRng(5)
    prompt = [3]  # one id: no prefill, so every row comes from the batch-invariant path, bit for bit
    gen = speculative_generate(target, draft, prompt, 12, gamma=3, rng=rng, trace=True, **warp_args)
    assert len(calls) == len(rng.draws) == len(gen.trace) == gen.stats.rounds
    seq = list(prompt)
    for (d, p, q, u_accept, u_final), u, rec in zip(calls, rng.draws, gen.trace):
        g = len(d)
        assert len(u) == 2 * g + 1
        np.testing.assert_array_equal(u_accept, u[g:2 * g])  # the documented order: g, g, then 1
        assert u_final == u[2 * g]
        for i in range(g):
            ctx = tuple(seq + d[:i])
            assert np.array_equal(q[i], q_row(ctx))  # q: the draft's row AFTER warping, bit for bit
            assert d[i] == sample(q[i], u[i])  # ... and d_i was drawn from it with u_i
            if warp_args["temperature"] == 0:
                assert q[i].max() == 1.0 and np.count_nonzero(q[i]) == 1  # greedy: one-hot, not a softmax
        for i in range(g + 1):
            assert np.array_equal(p[i], p_row(tuple(seq + d[:i])))  # p: the target's row, warped the same way
        seq += d[: rec["accepted"]] + [rec["token"]]
    assert seq == prompt + gen.ids


# ---- strict acceptance, residual guard

def test_strict_acceptance_u_zero_never_accepts_p_zero():
    p = np.array([[0.0, 1.0], [0.5, 0.5]])
    q = np.array([[0.5, 0.5]])
    assert accept(np.array([0]), p, q, np.array([0.0]), 0.0) == (0, 1)  # p(0) = 0: rejected though u = 0
    assert accept(np.array([1]), p, q, np.array([kit.ONE_BELOW]), 0.0)[0] == 1  # ratio 2: always kept


def test_residual_zero_or_non_finite_mass_falls_back_to_p():
    p = np.array([0.0, 0.5, 0.5 - 2.0 ** -54])
    q = np.array([0.0, 0.5, 0.5])  # p <= q everywhere: max(0, p - q) == 0
    assert residual(p, q) is p
    # and a rejection in that state samples p, no division by zero: u = 1 - 2**-53 is exactly p(2)/q(2)
    n, token = accept(np.array([2]), np.stack([p, p]), q[None], np.array([kit.ONE_BELOW]), 0.0)
    assert n == 0 and token == 1
    assert residual(p, np.array([np.nan, 0.5, 0.5])) is p  # NaN mass
    assert residual(np.array([np.inf, 0.0]), np.array([0.5, 0.5]))[0] == np.inf  # inf mass: p, never inf/inf
    with pytest.raises(ValueError, match="no positive finite mass"):
        sample(np.array([np.nan, 1.0]), 0.5)  # and the sampler refuses NaN rather than return an id


# ---- gamma clamping, budgets, the context

def deterministic_pair(n_vocab=5, n_ctx=64, eos=None, draft_n_ctx=None):
    """Draft == target, one-hot rows cycling 1, 2, 3, ...: every draft is accepted."""
    def logits(seq):
        row = np.full(n_vocab, NEG)
        row[(seq[-1] % (n_vocab - 1)) + 1] = 10.0
        return row
    return (kit.TableModel(logits, n_vocab, n_ctx, eos), kit.TableModel(logits, n_vocab, draft_n_ctx or n_ctx, eos))


@pytest.mark.parametrize("gamma, max_new_tokens, n_ctx", [(4, 1, 64), (4, 7, 64), (3, 10, 64), (5, 30, 12), (8, 9, 9)])
def test_gamma_is_clamped_each_round(gamma, max_new_tokens, n_ctx):
    """g = min(gamma, remaining - 1, n_ctx - length - 1), a plain target step when 0; the context stops cleanly."""
    target, draft = deterministic_pair(n_ctx=n_ctx)
    prompt = [1, 2]
    rng = RecordingRng(0)
    gen = speculative_generate(target, draft, prompt, max_new_tokens, gamma=gamma, temperature=1.0, rng=rng,
                               trace=True)
    length = len(prompt)
    for rec, u in zip(gen.trace, rng.draws):
        g = min(gamma, max_new_tokens - (length - len(prompt)) - 1, n_ctx - length - 1)
        assert len(rec["drafted"]) == g and len(u) == 2 * g + 1 and rec["accepted"] == g
        length += g + 1
    assert len(gen.ids) == length - len(prompt) == min(max_new_tokens, n_ctx - len(prompt))
    s = gen.stats
    assert s.stop_reason == ("context" if n_ctx - len(prompt) < max_new_tokens else "max_new_tokens")
    # prefill + one forward per draft, none at g = 0; no prefill when no round can draft (max_new_tokens = 1)
    assert s.draft_forwards == s.drafted + (len(prompt) > 1 and max_new_tokens > 1)
    if max_new_tokens == 1:
        assert gen.ids == [3] and s.drafted == 0 and s.rounds == 1  # every draft would be accepted: still 1 token


def test_round_gamma_values():
    assert round_gamma(4, 10, 64, 2) == 4  # nothing binds
    assert round_gamma(4, 3, 64, 2) == 2  # 3 ids left: 2 drafts + 1 target id
    assert round_gamma(4, 10, 12, 9) == 2  # 3 positions left in the context
    assert round_gamma(4, 1, 64, 2) == 0  # one id left: a plain target step
    assert round_gamma(4, 3, None, 1000) == 2  # no context limit (the oracle's tables)


def test_context_is_the_smaller_of_the_two():
    target, draft = deterministic_pair(n_ctx=30, draft_n_ctx=10)
    gen = speculative_generate(target, draft, [1, 2, 3], 50, gamma=4, temperature=0)
    assert gen.stats.stop_reason == "context" and 3 + len(gen.ids) == 10


# ---- EOS in the middle of a block

@pytest.mark.parametrize("gamma", [3, 4, 8])
def test_eos_accepted_mid_block_ends_output_and_statistics(gamma):
    target, draft = deterministic_pair(n_vocab=5, eos=3)  # one-hot chain 1 -> 2 -> 3 (EOS) -> 4 -> 1 ...
    gen = speculative_generate(target, draft, [1], 20, gamma=gamma, temperature=1.0, trace=True)
    assert gen.ids == [2, 3]  # the drafts after the EOS (4, 1, ...) are neither emitted ...
    s = gen.stats
    assert s.stop_reason == "eos" and s.new_tokens == 2 and s.rounds == 1
    assert s.drafted == s.accepted == 2 and s.rejected == 0  # ... nor counted
    assert s.tested_by_position == [1, 1] + [0] * (gamma - 2) and s.accepted_by_position == s.tested_by_position
    assert s.acceptance_by_position[:2] == [1.0, 1.0] and all(np.isnan(s.acceptance_by_position[2:]))
    assert gen.trace == [{"drafted": [2, 3], "accepted": 2, "token": None}]


def test_eos_as_corrected_token_and_as_bonus():
    eos = 3
    # draft proposes 1 then 2; the target puts all its mass on the EOS at the first position
    draft = rows_model(np.array([[NEG, 10, NEG, NEG], [NEG, NEG, 10, NEG]]), 1, eos=eos)
    target = rows_model(np.array([[NEG, NEG, NEG, 10], [NEG, NEG, NEG, 10]]), 1, eos=eos)
    gen = speculative_generate(target, draft, [0], 10, gamma=2, temperature=1.0, trace=True)
    assert gen.ids == [eos] and gen.stats.rejected == 1 and gen.stats.accepted == 0
    assert gen.stats.tested_by_position == [1, 0] and gen.trace[0]["token"] == eos
    # draft == target, EOS only as the bonus after gamma accepted drafts
    rows = np.array([[NEG, 10, NEG, NEG], [NEG, NEG, 10, NEG], [NEG, NEG, NEG, 10]])
    same = rows_model(rows, 1, eos=eos)
    gen = speculative_generate(same, rows_model(rows, 1, eos=eos), [0], 10, gamma=2, temperature=1.0, trace=True)
    assert gen.ids == [1, 2, eos] and gen.stats.accepted == 2 and gen.trace[0]["token"] == eos


def test_budget_cut_statistics():
    target, draft = deterministic_pair()
    s = speculative_generate(target, draft, [1], 3, gamma=4, temperature=0).stats  # g = min(4, 3 - 1) = 2
    assert s.new_tokens == 3 and s.drafted == s.accepted == 2 and s.rounds == 1
    # gamma is clamped to max_new_tokens - 1 = 2 up front: positions 3 and 4 could never be tested
    assert s.tested_by_position == [1, 1] and s.acceptance_by_position == [1.0, 1.0]


def test_statistics_add_up_under_rejections():
    target, draft = tiny_model(seed=43), tiny_model(seed=44, n_layer=1)
    gen = speculative_generate(target, draft, [1, 2], 25, gamma=4, temperature=1.0, trace=True,
                               rng=np.random.default_rng(2))
    s = gen.stats
    assert s.rejected > 0 and s.accepted > 0  # both happen with these seeds
    assert sum(s.accepted_by_position) == s.accepted and sum(s.tested_by_position) == s.accepted + s.rejected
    assert sum(len(r["drafted"]) for r in gen.trace) == s.drafted
    assert sum(r["accepted"] + (r["token"] is not None) for r in gen.trace) == s.new_tokens == len(gen.ids)
    assert all(a >= b for a, b in zip(s.tested_by_position, s.tested_by_position[1:]))  # position i+1 needs i kept


# ---- a draft that cannot speak for the target is refused

def test_different_vocabularies_are_refused():
    with pytest.raises(ValueError, match="draft vocabulary \\(50\\) differs"):
        speculative_generate(tiny_model(), tiny_model(n_vocab=50), [1], 5, gamma=2)


def test_different_tokenizers_are_refused():
    from tokenizers import Tokenizer

    gpt2 = Tokenizer.from_file(str(ROOT / "weights" / "gpt2" / "tokenizer.json"))
    other = Tokenizer.from_file(str(ROOT / "weights" / "shakespeare" / "target" / "tokenizer.json"))
    base = tiny_model()
    with_tok = lambda tok: Model(base.config, base.params, tok, base.path, {})  # noqa: E731
    with pytest.raises(ValueError, match="different tokenizers"):
        speculative_generate(with_tok(gpt2), with_tok(other), [1], 5, gamma=2)
    again = Tokenizer.from_file(str(ROOT / "weights" / "gpt2" / "tokenizer.json"))  # same file, another object
    assert len(speculative_generate(with_tok(gpt2), with_tok(again), [1], 5, gamma=2).ids) == 5
    assert len(speculative_generate(with_tok(gpt2), None, [1], 5, gamma=2).ids) == 5  # no draft: nothing to check


# ---- reproducibility

def test_seeded_runs_reproduce_and_draw_a_fixed_number_of_uniforms(monkeypatch):
    target, draft = tiny_model(seed=45), tiny_model(seed=46, n_layer=1)

    def forbidden(*a, **k):
        raise AssertionError("the loop reseeded or used the global generator")

    runs = []
    for _ in range(2):
        rng = RecordingRng(9)
        with monkeypatch.context() as m:
            m.setattr(np.random, "seed", forbidden)
            m.setattr(np.random, "default_rng", forbidden)
            gen = speculative_generate(target, draft, [1, 2], 30, gamma=3, temperature=1.0, rng=rng, trace=True)
        runs.append(gen.ids)
        assert gen.stats.rejected > 0 and gen.stats.accepted > 0  # what gets accepted varies within the run ...
        # ... yet every round drew exactly 2g + 1 uniforms from the one generator, and nothing else did
        assert [len(u) for u in rng.draws] == [2 * len(r["drafted"]) + 1 for r in gen.trace]
        fresh = np.random.default_rng(9)
        fresh.random(sum(len(u) for u in rng.draws))
        assert rng.rng.random() == fresh.random()  # the same position in the stream: no hidden draws
    assert runs[0] == runs[1]


# ---- the CLI: --trace, colour

class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def cli(argv, out, monkeypatch, no_color_env=None):
    if no_color_env is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", no_color_env)
    return run(build_parser().parse_args(argv), out=out, err=io.StringIO())


ARGS = ["ROMEO:", "--max-new-tokens", "40", "--seed", "4", "--temperature", "0.8"]


def test_trace_in_json(monkeypatch):
    out = io.StringIO()
    cli(ARGS + ["--json", "--trace", "--gamma", "3"], out, monkeypatch)
    obj = json.loads(out.getvalue())
    ids, trace, stats = obj["ids"], obj["trace"], obj["stats"]
    rebuilt = []
    for rec in trace:  # each round: the accepted drafts, then the corrected or bonus id
        assert 0 <= rec["accepted"] <= len(rec["drafted"]) <= 3
        rebuilt += rec["drafted"][: rec["accepted"]] + ([rec["token"]] if rec["token"] is not None else [])
    assert rebuilt == ids and len(trace) == stats["rounds"]
    assert len(stats["acceptance_by_position"]) == 3
    for rate, a, t in zip(stats["acceptance_by_position"], stats["accepted_by_position"], stats["tested_by_position"]):
        assert rate == a / t if t else np.isnan(rate)  # JSON carries NaN where nothing was tested
    out2 = io.StringIO()
    cli(ARGS + ["--json", "--gamma", "3"], out2, monkeypatch)
    assert "trace" not in json.loads(out2.getvalue()) and json.loads(out2.getvalue())["ids"] == ids


def test_colour_marks_accepted_drafts_on_a_terminal(monkeypatch):
    tty, plain = FakeTTY(), io.StringIO()
    gen = cli(ARGS + ["--trace"], tty, monkeypatch)
    cli(ARGS, plain, monkeypatch)
    text = tty.getvalue()
    assert GREEN in text and RESET in text
    assert re.sub(r"\x1b\[[0-9;]*m", "", text) == plain.getvalue()  # colour adds nothing but escapes
    green = "".join(re.findall(re.escape(GREEN) + "(.*?)" + re.escape(RESET), text, flags=re.S))
    from npspec.models import load

    tokenizer = load(None, "target").tokenizer
    accepted = [i for r in gen.trace for i in r["drafted"][: r["accepted"]]]
    assert green == tokenizer.decode(accepted)  # exactly the accepted draft tokens are green
    assert "\x1b[" not in plain.getvalue()  # piped: plain


@pytest.mark.parametrize("how", ["--no-color", "NO_COLOR"])
def test_colour_can_be_turned_off(monkeypatch, how):
    tty = FakeTTY()
    cli(ARGS + (["--no-color"] if how == "--no-color" else []), tty, monkeypatch,
        no_color_env="1" if how == "NO_COLOR" else None)
    assert "\x1b[" not in tty.getvalue() and tty.getvalue().startswith("ROMEO:")


@pytest.mark.parametrize("env", [{}, {"NO_COLOR": "1"}])
def test_colour_on_a_real_pseudo_terminal(env):
    """A real pty as stdout: colour unless NO_COLOR is set."""
    master, slave = pty.openpty()
    environ = {k: v for k, v in os.environ.items() if k != "NO_COLOR"} | env
    proc = subprocess.run([sys.executable, "-m", "npspec.generate", *ARGS], stdout=slave, stderr=subprocess.PIPE,
                          cwd=ROOT, env=environ, timeout=300)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO once the pty is drained
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    text = b"".join(chunks).decode("utf-8", "replace")
    assert proc.returncode == 0, proc.stderr
    assert text.startswith("ROMEO:") and (GREEN in text) == (not env)


def test_importing_the_cli_keeps_the_api_function():
    # the CLI module is npspec.generate; the API function has its own name, so importing one never hides the other
    assert callable(npspec.generate_text) and npspec.generate.__name__ == "npspec.generate"

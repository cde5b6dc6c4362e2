"""The speculative loop (npspec.decode.speculative_generate): hand-made rows, gamma clamping,
budget, context, EOS, statistics, reproducibility, refused options and pairs.

Models are tiny GPT-2s with the shipped kernels (conftest.tiny_model: target "gemv-panels", draft
"gemv-rows"), the shipped pair, or kit.TableModel (logits an explicit function of the sequence).
Uniforms come from a seeded np.random.Generator or kit.ScriptedRng, whose `sizes` records each draw:
the loop draws 2 * g + 1 uniforms at the start of every round of g drafts.
"""

import re

import numpy as np
import pytest

from npspec import testing as kit
from npspec.decode.evaluate import fixed_prompts
from npspec.model.gpt2 import ContextOverflowError
from npspec.decode.sampling import warp
from npspec.decode import GenerationInterrupted, accept, round_gamma, speculative_generate

from conftest import tiny_model

NEG = -np.inf


def rows_model(rows, n_prompt, eos=None, n_ctx=64):
    """A TableModel whose logits depend only on the position after the prompt: rows[k] for the k-th new token."""
    return kit.TableModel(lambda seq: rows[min(len(seq) - n_prompt, len(rows) - 1)], len(rows[0]), n_ctx, eos)


def deterministic_pair(n_vocab=5, n_ctx=64, eos=None, draft_n_ctx=None):
    """Draft == target, one-hot rows cycling 1, 2, 3, ...: every draft is accepted."""
    def logits(seq):
        row = np.full(n_vocab, NEG)
        row[(seq[-1] % (n_vocab - 1)) + 1] = 10.0
        return row
    return (kit.TableModel(logits, n_vocab, n_ctx, eos), kit.TableModel(logits, n_vocab, draft_n_ctx or n_ctx, eos))


def round_sizes(gen):
    """The uniforms each round of `gen` should have drawn: 2 * g + 1 (g = its drafts, none cut by an EOS here)."""
    return [2 * len(rec["drafted"]) + 1 for rec in gen.trace]


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
    rec = gen.trace[0]
    assert {k: rec[k] for k in ("drafted", "accepted", "token", "proposed", "gamma")} == {
        "drafted": drafted, "accepted": n_accepted, "token": token, "proposed": 3, "gamma": 3}
    kept = [u < p / q for p, q, u in zip(rec["p"], rec["q"], rec["u"])]  # the trace shows why: u < p/q
    assert rec["u"] == [0.25] * 3 and kept[:n_accepted] == [True] * n_accepted and False in kept[n_accepted:] + [False]
    assert gen.ids[: n_accepted + 1] == drafted[:n_accepted] + [token]
    assert rng.sizes[0] == 7  # g = min(3, 4 - 1): 3 draft draws, 3 acceptance tests, 1 final draw


# ---- gamma clamping, budgets, the context

def test_round_gamma_is_the_budget_and_context_rule():
    assert round_gamma(4, 10, 64, 2) == 4  # nothing binds
    assert round_gamma(4, 3, 64, 2) == 2  # 3 ids left: 2 drafts + 1 target id
    assert round_gamma(4, 10, 12, 9) == 2  # 3 positions left in the context
    assert round_gamma(4, 1, 64, 2) == 0  # one id left: a plain target step
    assert round_gamma(4, 3, None, 1000) == 2  # no context limit (the oracle's tables)


@pytest.mark.parametrize("gamma, max_new_tokens, n_ctx", [(4, 1, 64), (4, 7, 64), (3, 10, 64), (5, 30, 12), (8, 9, 9)])
def test_gamma_is_clamped_each_round(gamma, max_new_tokens, n_ctx):
    """g = min(gamma, remaining - 1, n_ctx - length - 1), a plain target step when 0; the context stops cleanly."""
    target, draft = deterministic_pair(n_ctx=n_ctx)
    prompt = [1, 2]
    rng = kit.ScriptedRng(np.random.default_rng(0).random(200))
    gen = speculative_generate(target, draft, prompt, max_new_tokens, gamma=gamma, temperature=1.0, rng=rng,
                               trace=True)
    assert len(rng.sizes) == len(gen.trace)
    length = len(prompt)
    for rec, n_u in zip(gen.trace, rng.sizes):
        g = min(gamma, max_new_tokens - (length - len(prompt)) - 1, n_ctx - length - 1)
        assert len(rec["drafted"]) == g and n_u == 2 * g + 1 and rec["accepted"] == g
        length += g + 1
    assert len(gen.ids) == length - len(prompt) == min(max_new_tokens, n_ctx - len(prompt))
    s = gen.stats
    assert s.stop_reason == ("context" if n_ctx - len(prompt) < max_new_tokens else "max_new_tokens")
    # prefill + one forward per draft, none at g = 0; no prefill when no round can draft (max_new_tokens = 1)
    assert s.draft_forwards == s.drafted + (len(prompt) > 1 and max_new_tokens > 1)
    if max_new_tokens == 1:
        assert gen.ids == [3] and s.drafted == 0 and s.rounds == 1  # every draft would be accepted: still 1 token


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


@pytest.mark.parametrize("gamma", range(1, 9))
def test_greedy_statistics_on_the_shipped_pair(shipped, val_ids, gamma):
    """Temperature 0: each round emits its accepted drafts + 1; at most one rejection a round."""
    target, draft = shipped
    for prompt in fixed_prompts(val_ids, n=3, length=24):
        s = speculative_generate(target, draft, prompt, 40, gamma=gamma, temperature=0).stats
        assert s.new_tokens == 40 and s.accepted + s.rounds == 40
        assert s.rejected <= s.rounds and s.draft_forwards >= s.drafted


def test_budget_cut_statistics():
    target, draft = deterministic_pair()
    s = speculative_generate(target, draft, [1], 3, gamma=4, temperature=0).stats  # g = min(4, 3 - 1) = 2
    assert s.new_tokens == 3 and s.drafted == s.accepted == 2 and s.rounds == 1
    # gamma is clamped to max_new_tokens - 1 = 2 up front: positions 3 and 4 could never be tested
    assert s.tested_by_position == [1, 1] and s.acceptance_by_position == [1.0, 1.0]


def test_context_is_the_smaller_of_the_two():
    """The loop stops cleanly (stop_reason "context") at the smaller n_ctx; a prompt longer than it is refused."""
    target, draft = deterministic_pair(n_ctx=30, draft_n_ctx=10)
    gen = speculative_generate(target, draft, [1, 2, 3], 50, gamma=4, temperature=0)
    assert gen.stats.stop_reason == "context" and 3 + len(gen.ids) == 10
    target, draft = tiny_model(seed=5), tiny_model(seed=6, role="draft", n_layer=1, n_ctx=20)
    gen = speculative_generate(target, draft, [1, 2, 3], 100, gamma=4, temperature=0)
    assert gen.stats.stop_reason == "context" and 3 + len(gen.ids) == 20
    with pytest.raises(ValueError, match="context holds 20"):
        speculative_generate(target, draft, list(range(21)), 5, gamma=4)


# ---- EOS

def test_eos_ends_generation_and_is_counted():
    greedy = speculative_generate(tiny_model(seed=8), None, [1, 2], 12, gamma=0, temperature=0).ids
    eos = greedy[5]
    first = greedy.index(eos)
    target = tiny_model(seed=8, eos_token_id=eos)
    draft = target.with_kernel("gemv-rows")  # the same weights: a draft identical to the target
    for gamma in (0, 2, 4, 8):
        gen = speculative_generate(target, draft, [1, 2], 12, gamma=gamma, temperature=0, trace=True)
        assert gen.ids == greedy[: first + 1] and gen.stats.stop_reason == "eos"
        assert gen.stats.new_tokens == first + 1
        # draft == target: every drafted token up to the EOS is accepted, nothing after it counted;
        # a round that ends on an accepted EOS has no target-produced token
        cut = gen.trace[-1]["token"] is None
        assert cut == (gamma > first)
        assert gen.stats.rejected == 0 and gen.stats.accepted + gen.stats.rounds - cut == first + 1
        assert gen.stats.drafted == gen.stats.accepted


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
    assert [{k: r[k] for k in ("drafted", "accepted", "token", "p", "q", "proposed", "gamma")} for r in gen.trace] == \
        [{"drafted": [2, 3], "accepted": 2, "token": None, "p": [1.0, 1.0], "q": [1.0, 1.0], "proposed": gamma,
          "gamma": gamma}]  # one-hot rows


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


# ---- statistics

def test_statistics_add_up_under_rejections():
    target, draft = tiny_model(seed=43), tiny_model(seed=44, role="draft", n_layer=1)
    gen = speculative_generate(target, draft, [1, 2], 25, gamma=4, temperature=1.0, trace=True,
                               rng=np.random.default_rng(2))
    s = gen.stats
    assert s.rejected > 0 and s.accepted > 0  # both happen with these seeds
    assert sum(s.accepted_by_position) == s.accepted and sum(s.tested_by_position) == s.accepted + s.rejected
    assert sum(len(r["drafted"]) for r in gen.trace) == s.drafted
    assert sum(r["accepted"] + (r["token"] is not None) for r in gen.trace) == s.new_tokens == len(gen.ids)
    assert all(a >= b for a, b in zip(s.tested_by_position, s.tested_by_position[1:]))  # position i+1 needs i kept


def test_a_draft_identical_to_the_target_is_always_accepted():
    target = tiny_model(seed=3, n_layer=3)
    s = speculative_generate(target, target.with_kernel("gemv-rows"), [1, 2, 3], 25, gamma=4, temperature=0).stats
    assert s.rejected == 0 and s.alpha == 1.0 and s.rounds == 5


# ---- reproducibility: one generator, 2g + 1 uniforms a round, nothing else

def test_seeded_runs_reproduce_and_draw_a_fixed_number_of_uniforms():
    """Two runs with the same seed agree; each round drew exactly 2g + 1 uniforms from the one generator
    (its stream sits exactly that far on), the output is a function of those uniforms alone (the same
    uniforms from kit.ScriptedRng replay it), and NumPy's global generator is neither used nor reseeded."""
    target, draft = tiny_model(seed=45), tiny_model(seed=46, role="draft", n_layer=1)
    global_state = np.random.get_state()
    runs = []
    for _ in range(2):
        rng = np.random.default_rng(9)
        gen = speculative_generate(target, draft, [1, 2], 30, gamma=3, temperature=1.0, rng=rng, trace=True)
        runs.append(gen.ids)
        assert gen.stats.rejected > 0 and gen.stats.accepted > 0  # what gets accepted varies within the run ...
        drawn = sum(round_sizes(gen))  # ... yet every round drew exactly 2g + 1 uniforms
        fresh = np.random.default_rng(9)
        fresh.random(drawn)
        assert rng.random() == fresh.random()  # the same position in the stream: no hidden draws
        scripted = kit.ScriptedRng(np.random.default_rng(9).random(drawn))
        again = speculative_generate(target, draft, [1, 2], 30, gamma=3, temperature=1.0, rng=scripted, trace=True)
        untimed = [[{k: v for k, v in r.items() if not k.startswith("seconds")} for r in g.trace] for g in (again, gen)]
        assert again.ids == gen.ids and untimed[0] == untimed[1]  # the same uniforms: the same rounds, u included
        assert scripted.sizes == round_sizes(gen) and not scripted.values
    assert runs[0] == runs[1]
    now = np.random.get_state()
    assert np.array_equal(now[1], global_state[1]) and now[2:] == global_state[2:]


def test_seeded_runs_reproduce(shipped):
    target, draft = shipped
    runs = [speculative_generate(target, draft, [5, 6, 7], 30, gamma=3, temperature=1.0,
                                 rng=np.random.default_rng(11)).ids for _ in range(2)]
    assert runs[0] == runs[1]


# ---- refused before any forward: bad options, a draft of another vocabulary

@pytest.mark.parametrize("kw, msg", [(dict(max_new_tokens=0), "max_new_tokens"), (dict(gamma=-1), "gamma"),
                                     (dict(temperature=-0.5), "temperature"), (dict(top_p=0), "top_p")])
def test_bad_options(tiny, kw, msg):
    args = dict(max_new_tokens=5, gamma=2)
    with pytest.raises(ValueError, match=msg):
        speculative_generate(tiny, tiny, [1], **{**args, **kw})


@pytest.mark.parametrize("kw, message", [
    (dict(gamma=2.0), "gamma must be an integer >= 0 (0 = no drafting), got 2.0 (a float)"),  # was a numpy TypeError
    (dict(gamma="4"), "gamma must be an integer >= 0 (0 = no drafting), got '4' (a str)"),  # was "got 4"
    (dict(gamma=True), "gamma must be an integer >= 0 (0 = no drafting), got True (a bool)"),
    (dict(max_new_tokens=8.0), "max_new_tokens must be an integer >= 1, got 8.0 (a float)"),
    (dict(max_new_tokens=None), "max_new_tokens must be an integer >= 1, got None (a NoneType)"),
    (dict(top_k=2.0), "top_k must be an integer >= 0 (0 = off), got 2.0 (a float)"),
    (dict(temperature="hot"), "temperature must be a number"),
    (dict(rng=1.5), "rng must be an np.random.Generator or an int seed, got 1.5"),
])
def test_options_of_the_wrong_type_are_named(tiny, kw, message):
    args = dict(max_new_tokens=5, gamma=2)
    with pytest.raises(TypeError, match=re.escape(message)):
        speculative_generate(tiny, tiny, [1], **{**args, **kw})
    ok = dict(max_new_tokens=np.int64(3), gamma=np.uint8(2), top_k=np.int32(5), temperature=np.float32(0.5))
    assert len(speculative_generate(tiny, tiny, [1], **ok).ids) == 3  # NumPy integers and floats are fine


@pytest.mark.parametrize("ids, error, message", [
    (np.array([[1, 2]]), TypeError, ("1-D sequence of integer token ids (a list or a 1-D integer array), got an array "
                                     "of shape (1, 2)")),
    (np.array(3), TypeError, "got an array of shape ()"),
    (None, TypeError, "1-D sequence of integer token ids (a list or a 1-D integer array), got NoneType"),
    ((i for i in [1, 2]), TypeError, "got generator"),
    ("ROMEO:", TypeError, "got a str; encode text with the model's tokenizer first"),
    ([[1, 2]], TypeError, "prompt_ids[0] is [1, 2] (a list)"),
    ([1, 2.0], TypeError, "prompt_ids[1] is 2.0 (a float)"),
    ([1, True], TypeError, "prompt_ids[1] is True (a bool)"),
    (np.array([1.0, 2.0]), TypeError, "dtype float64"),
    ([1, 2 ** 70], ValueError, f"prompt_ids[1] is {2 ** 70}, not a token id of this vocabulary: ids are in [0, 67)"),
    (np.array([5, -1]), ValueError, "prompt_ids[1] is -1, not a token id of this vocabulary"),
    ([], ValueError, "the prompt is empty"),
])
def test_prompt_ids_are_a_1d_sequence_of_ids_in_range(tiny, ids, error, message):
    with pytest.raises(error, match=re.escape(message)):
        speculative_generate(tiny, None, ids, 3, gamma=0)


def test_a_prompt_that_fills_the_context_is_refused(tiny):
    # a prompt of exactly n_ctx ids returned 0 new tokens and "alpha nan, nan tokens/round": nothing can follow it
    with pytest.raises(ContextOverflowError, match="the prompt has 32 tokens but the context holds 32"):
        speculative_generate(tiny, None, [1] * 32, 3, gamma=0)
    gen = speculative_generate(tiny, None, [1] * 31, 3, gamma=0)
    assert len(gen.ids) == 1 and gen.stats.stop_reason == "context"


def test_ctrl_c_keeps_the_completed_rounds(tiny):
    # the CLI prints what was generated before Ctrl-C: the loop hands it over in GenerationInterrupted
    draft = tiny_model(seed=6, role="draft", n_layer=1)
    full = speculative_generate(tiny, draft, [1, 2], 20, gamma=3, temperature=1.0, rng=4, trace=True)
    calls = []

    def on_emit(ids, n_accepted):
        calls.append(list(ids))
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(GenerationInterrupted) as caught:
        speculative_generate(tiny, draft, [1, 2], 20, gamma=3, temperature=1.0, rng=4, on_emit=on_emit, trace=True)
    gen = caught.value.generation
    assert isinstance(caught.value, KeyboardInterrupt) and gen.stats.stop_reason == "interrupted"
    assert gen.ids == calls[0] + calls[1] == full.ids[:len(gen.ids)] and gen.stats.new_tokens == len(gen.ids)
    assert gen.stats.rounds == len(gen.trace) == 2


def test_different_vocabularies_are_refused(tiny):
    with pytest.raises(ValueError, match="draft vocabulary \\(50\\) differs"):
        speculative_generate(tiny, tiny_model(role="draft", n_vocab=50), [1], 5, gamma=2)

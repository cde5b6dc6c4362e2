"""The shipped Shakespeare pair reproduces its model card (weights/shakespeare/card.json).

weights/model_card.py measures every number in the card with npspec's own functions
(npspec.decode.evaluate, npspec.decode); these tests run the same functions on the shipped files
and expect the same numbers: counts, acceptance and greedy ids exactly, losses to the last bits a
BLAS build may change. The card's `demo` is one greedy run of the documented command
`python -m npspec.generate --json --max-new-tokens 64 --temperature 0 "ROMEO:"`.
"""

import json

import numpy as np
import pytest

from npspec.decode.evaluate import acceptance, fixed_prompts, validation_loss
from npspec.decode import speculative_generate
from npspec.decode.text import encode_prompt

from conftest import run_python

DEMO_ARGS = ["--json", "--max-new-tokens", "64", "--temperature", "0", "ROMEO:"]  # gamma: the CLI's default, 4


def test_validation_loss_matches_model_card(shipped, val_ids, card):
    for model, name in zip(shipped, ("target", "draft")):
        loss, n = validation_loss(model, val_ids, max_windows=card["slice_windows"])
        assert n == card[name]["slice_tokens"]
        # the same NumPy code on the same files; BLAS builds may differ in the last bits
        assert loss == pytest.approx(card[name]["slice_loss"], rel=1e-5)
        assert card[name]["slice_ppl"] == pytest.approx(np.exp(card[name]["slice_loss"]), rel=1e-12)
    assert card["target"]["val_loss"] < card["draft"]["val_loss"]  # the target is the better model


@pytest.mark.slow
def test_whole_validation_split_matches_model_card(shipped, val_ids, card):
    assert len(val_ids) == card["validation_tokens"]
    for model, name in zip(shipped, ("target", "draft")):
        loss, n = validation_loss(model, val_ids)
        assert n == card[name]["val_tokens"] == len(val_ids) - 1
        assert loss == pytest.approx(card[name]["val_loss"], rel=1e-5)


def test_greedy_acceptance_matches_model_card(shipped, val_ids, card):
    measured = card["acceptance"]["greedy"]
    s = acceptance(*shipped, fixed_prompts(val_ids), gamma=4, max_new_tokens=64, temperature=0)
    assert s.alpha == pytest.approx(measured["alpha"], abs=1e-12)  # greedy is deterministic
    assert (s.accepted, s.rejected, s.rounds, s.new_tokens) == \
        (measured["accepted"], measured["rejected"], measured["rounds"], measured["new_tokens"])
    assert s.alpha >= 0.58  # floor, from the measured 0.634: a retrained pair must stay a useful pair


@pytest.mark.slow
@pytest.mark.parametrize("label, warping", [("t0.8_p0.95", dict(temperature=0.8, top_p=0.95)),
                                            ("t1.0", dict(temperature=1.0))])
def test_sampled_acceptance_matches_model_card(shipped, val_ids, card, label, warping):
    # one Generator seeded 0 for the whole set of prompts, as the card's run
    measured = card["acceptance"][label]
    s = acceptance(*shipped, fixed_prompts(val_ids), gamma=4, max_new_tokens=64, **warping)
    assert (s.accepted, s.rejected, s.rounds, s.new_tokens) == \
        (measured["accepted"], measured["rejected"], measured["rounds"], measured["new_tokens"])
    assert s.alpha == pytest.approx(measured["alpha"], abs=1e-12)
    assert s.tokens_per_round == pytest.approx(measured["tokens_per_round"], abs=1e-12)


def test_demo_run_matches_model_card(shipped, card):
    demo = card["demo"]
    assert (demo["prompt"], demo["max_new_tokens"], demo["gamma"], demo["temperature"]) == ("ROMEO:", 64, 4, 0.0)
    target, draft = shipped
    ids = encode_prompt(target.tokenizer, demo["prompt"], target.config.eos_token_id)
    spec = speculative_generate(target, draft, ids, demo["max_new_tokens"], gamma=demo["gamma"], temperature=0)
    plain = speculative_generate(target, None, ids, demo["max_new_tokens"], gamma=0, temperature=0)
    assert spec.ids == plain.ids == demo["ids"] and demo["ids_equal_gamma0"] is True
    assert (spec.stats.alpha, spec.stats.rounds, spec.stats.tokens_per_round, spec.stats.new_tokens) == \
        (demo["alpha"], demo["rounds"], demo["tokens_per_round"], demo["new_tokens"])
    assert target.tokenizer.decode(spec.ids) == demo["text"]


def test_demo_command_matches_model_card(card):
    demo = card["demo"]
    out = []
    for extra in ([], ["--gamma", "0"]):
        r = run_python("-m", "npspec.generate", *DEMO_ARGS, *extra)
        assert r.returncode == 0, r.stderr
        out.append(json.loads(r.stdout))
    spec, plain = out
    assert spec["ids"] == plain["ids"] == demo["ids"]
    assert (spec["stats"]["alpha"], spec["stats"]["rounds"], spec["stats"]["tokens_per_round"]) == \
        (demo["alpha"], demo["rounds"], demo["tokens_per_round"])
    assert plain["stats"]["rounds"] == 64 and plain["stats"]["drafted"] == 0

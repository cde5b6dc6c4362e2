"""Regression guards on the shipped Shakespeare pair, against its model card (weights/shakespeare/card.json)."""

import json
import subprocess
import sys

import pytest

from npspec.evaluate import acceptance, fixed_prompts, validation_loss

from conftest import ROOT


def test_validation_loss_matches_model_card(shipped, val_ids, card):
    for model, name in zip(shipped, ("target", "draft")):
        loss, n = validation_loss(model, val_ids, max_windows=card["slice_windows"])
        assert n == card[name]["slice_tokens"]
        # the same NumPy code on the same files; BLAS builds may differ in the last bits
        assert loss == pytest.approx(card[name]["slice_loss"], rel=1e-5)
    assert card["target"]["val_loss"] < card["draft"]["val_loss"]  # the target is the better model


def test_greedy_acceptance_floor(shipped, val_ids, card):
    measured = card["acceptance"]["greedy"]["alpha"]
    s = acceptance(*shipped, fixed_prompts(val_ids), gamma=4, max_new_tokens=64, temperature=0)
    assert s.alpha == pytest.approx(measured, abs=1e-12)  # greedy is deterministic
    assert s.alpha >= 0.58  # floor, from the measured 0.634: a retrained pair must stay a useful pair


def test_done_when_command_matches_model_card(card):
    dw = card["done_when"]
    cmd = [sys.executable, "-m", "npspec.generate", "--json", "--max-new-tokens", "64", "--temperature", "0", "ROMEO:"]
    out = [json.loads(subprocess.run(cmd + extra, capture_output=True, text=True, check=True, cwd=ROOT).stdout)
           for extra in ([], ["--gamma", "0"])]
    spec, plain = out
    assert spec["ids"] == plain["ids"] == dw["ids"]
    assert (spec["stats"]["alpha"], spec["stats"]["rounds"], spec["stats"]["tokens_per_round"]) == \
        (dw["alpha"], dw["rounds"], dw["tokens_per_round"])
    assert plain["stats"]["rounds"] == 64 and plain["stats"]["drafted"] == 0

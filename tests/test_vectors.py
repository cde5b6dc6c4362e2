"""`python -m npspec.testing vectors OUT.json`: the kit's exact laws as a versioned file for other engines.

The file is written atomically and never over an existing one without --force; its laws are exact
fractions, and npspec's own float64 rule reproduces them to 1e-12. A copy is kept in tests/data/ so a
change of the format or of a law shows up here, with the command that regenerates it.
"""

import json
from fractions import Fraction as F

import numpy as np
import pytest

from npspec import testing as kit
from npspec.sampling import warp
from npspec.testing.vectors import CASES, FORMAT, VERSION, vectors

from conftest import ROOT, run_python

VECTORS = ("-m", "npspec.testing", "vectors")
STORED = ROOT / "tests" / "data" / "speculative_vectors.json"


def test_the_command_writes_atomically_and_never_overwrites_without_force(tmp_path):
    out = tmp_path / "v.json"
    r = run_python(*VECTORS, out)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    assert r.stderr == f"wrote {out} ({FORMAT}, version {VERSION})\n"
    first = out.read_bytes()
    data = json.loads(first)
    assert (data["format"], data["version"]) == ("npspec-speculative-vectors", 1)
    out.write_text("mine")
    r = run_python(*VECTORS, out)
    assert r.returncode == 1 and r.stderr == f"npspec.testing: error: {out} exists; pass --force to replace it " \
                                              "(nothing was written)\n"
    assert out.read_text() == "mine"
    r = run_python(*VECTORS, out, "--force")
    assert r.returncode == 0 and out.read_bytes() == first  # deterministic, byte for byte
    r = run_python(*VECTORS, tmp_path / "nodir" / "v.json")
    assert r.returncode == 1 and r.stderr == (f"npspec.testing: error: cannot write {tmp_path / 'nodir' / 'v.json'}: "
                                              f"the directory {tmp_path / 'nodir'} does not exist\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.json"]  # no temporary file left


def test_the_cases_cover_what_other_engines_get_wrong():
    cases = {c["name"]: c for c in vectors()["cases"]}
    assert {"disjoint-supports", "one-hot-q", "one-hot-q-where-p-is-0", "q-zero-where-p-positive", "top-k", "top-p",
            "greedy", "eos", "budget-below-gamma"} <= set(cases)
    assert cases["one-hot-q"]["q_warped"] == ["0", "1", "0"]
    assert cases["q-zero-where-p-positive"]["q_warped"][2] == "0" and cases["q-zero-where-p-positive"]["p"][2] == "1/2"
    assert cases["top-k"]["p_warped"] == ["0", "1/2", "1/2", "0", "0"]  # the two 3/10 tie for second: both kept
    assert cases["budget-below-gamma"]["first_round_gamma"] == 1
    # disjoint supports: every draft is rejected and the residual is p itself
    assert cases["disjoint-supports"]["accepted_total_law"] == [{"accepted": 0, "probability": "1"}]
    for c in cases.values():
        for law in ("output_law", "first_round_law", "accepted_length_law", "accepted_total_law"):
            assert sum(F(e["probability"]) for e in c[law]) == 1, (c["name"], law)
            assert all(F(e["probability"]) > 0 for e in c[law])
    # the one round of the eos case by hand: draft 2 (EOS) with q 1/2 is kept with min(1, (1/3) / (1/2)) = 2/3
    eos = cases["eos"]["first_round_law"]
    assert {"drafted": [2], "accepted": 1, "token": None, "probability": "1/3"} in eos


@pytest.mark.parametrize("c", vectors()["cases"], ids=[c[0] for c in CASES])
def test_npspecs_float_rule_reproduces_every_law(c):
    p = [float(F(v)) for v in c["p_warped"]]
    q = [float(F(v)) for v in c["q_warped"]]
    args = (kit.constant_table(p), kit.constant_table(q), tuple(c["prompt"]), c["gamma"], c["max_new_tokens"],
            c["eos_token_id"])
    got = kit.speculative_distribution(*args, rule=kit.npspec_rule)
    expected = {tuple(e["ids"]): float(F(e["probability"])) for e in c["output_law"]}
    assert {k for k, v in got.items() if v} == set(expected)
    assert max(abs(got[k] - v) for k, v in expected.items()) <= 1e-12
    lengths = {}
    for path in kit.speculative_paths(*args, rule=kit.npspec_rule):
        lengths[path.rounds[0].accepted] = lengths.get(path.rounds[0].accepted, 0) + path.prob
    for e in c["accepted_length_law"]:
        assert abs(lengths.pop(e["accepted"]) - float(F(e["probability"]))) <= 1e-12
    assert all(abs(v) <= 1e-12 for v in lengths.values())


@pytest.mark.parametrize("c", [c for c in vectors()["cases"] if c["warping"] != {"temperature": 1, "top_k": 0,
                                                                                   "top_p": "1"}],
                         ids=lambda c: c["name"])
def test_the_exact_warping_is_npspecs(c):
    w = c["warping"]
    for raw, warped in ((c["p"], c["p_warped"]), (c["q"], c["q_warped"])):
        with np.errstate(divide="ignore"):  # log(0) = -inf: a removed entry
            logits = np.log([float(F(v)) for v in raw])
        got = warp(logits, temperature=w["temperature"], top_k=w["top_k"], top_p=float(F(w["top_p"])))
        np.testing.assert_allclose(got, [float(F(v)) for v in warped], rtol=1e-12, atol=1e-15)


def test_the_stored_copy_is_current():
    stored = json.loads(STORED.read_text(encoding="utf-8"))
    assert stored == json.loads(json.dumps(vectors())), (
        f"{STORED} is stale (format version {stored.get('version')}, now {VERSION}); if the change is intended, "
        f"regenerate it with: python -m npspec.testing vectors {STORED.relative_to(ROOT)} --force")

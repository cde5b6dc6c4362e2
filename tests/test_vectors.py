"""`python -m npspec.testing vectors OUT.json`: the kit's exact laws as a versioned file for other engines.

The file is written atomically and never over an existing one without --force; its laws are exact
fractions, and npspec's own float64 rule reproduces them to 1e-12; its probe and round cases are npspec's own
decisions; it matches its JSON Schema; and tests/vectors/client.py, which imports no npspec, checks a sampler
with it and VECTORS.md alone, catching each classic bug. A copy is kept in tests/data/ so a change of the
format or of a law shows up here, with the command that regenerates it.
"""

import ast
import json
from fractions import Fraction as F

import numpy as np
import pytest

from npspec import testing as kit
from npspec.decode.sampling import sample, warp
from npspec.decode import accept
from npspec.decode.rules import accept_tree_traversal, exact_match_accept
from npspec.decode.rules.trees import depths
from npspec.testing.probes import ACCEPT_PROBES
from npspec.testing.trees import sampled_expander, tree_round_distribution
from npspec.testing.vectors import CASES, FORMAT, VERSION, positional_table, vectors

from conftest import ROOT, run_python

VECTORS = ("-m", "npspec.testing", "vectors")
STORED = ROOT / "tests" / "data" / "speculative_vectors.json"
SCHEMA = ROOT / "npspec" / "testing" / "vectors.schema.json"
CLIENT = ROOT / "tests" / "vectors" / "client.py"
DATA = vectors()


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_the_command_writes_atomically_and_never_overwrites_without_force(tmp_path):
    out = tmp_path / "v.json"
    r = run_python(*VECTORS, out)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    assert r.stderr == f"wrote {out} ({FORMAT}, version {VERSION})\n"
    first = out.read_bytes()
    data = json.loads(first)
    assert (data["format"], data["version"]) == ("npspec-speculative-vectors", 2)
    out.write_text("mine")
    r = run_python(*VECTORS, out)
    assert r.returncode == 1 and r.stderr == f"npspec.testing: error: {out} exists; pass --force to replace it " \
                                              "(nothing was written)\n"
    assert out.read_text() == "mine"
    r = run_python(*VECTORS, out, "--force")
    assert r.returncode == 0 and out.read_bytes() == first  # deterministic, byte for byte
    r = run_python(*VECTORS, tmp_path / "nodir" / "v.json")
    assert r.returncode == 1 and r.stderr == (f"npspec.testing: error: cannot write {tmp_path / 'nodir' / 'v.json'}: "
                                              f"{tmp_path / 'nodir'} does not exist; choose a path in an existing "
                                              "directory\n")
    r = run_python(*VECTORS, out / "v.json")  # below a file
    assert r.returncode == 1 and r.stderr == (f"npspec.testing: error: cannot write {out / 'v.json'}: {out} is not a "
                                              "directory; choose a path in an existing directory\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.json"]  # no temporary file left


def test_the_cases_cover_what_other_engines_get_wrong():
    cases = {c["name"]: c for c in DATA["cases"]}
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


@pytest.mark.parametrize("c", DATA["cases"], ids=[c[0] for c in CASES])
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


@pytest.mark.parametrize("c", [c for c in DATA["cases"] if c["warping"] != {"temperature": 1, "top_k": 0,
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
    assert stored == json.loads(json.dumps(DATA)), (
        f"{STORED} is stale (format version {stored.get('version')}, now {VERSION}); if the change is intended, "
        f"regenerate it with: python -m npspec.testing vectors {STORED.relative_to(ROOT)} --force")


def floats(strings):
    return np.array([float(F(v)) for v in strings])


def test_the_file_matches_its_schema_and_the_schema_can_fail():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(DATA, schema, cls=jsonschema.Draft202012Validator)
    broken = json.loads(json.dumps(DATA))
    broken["probe_cases"][0]["decision"] = "maybe"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema, cls=jsonschema.Draft202012Validator)


def test_every_boundary_probe_is_exported_with_npspecs_decision():
    probes = DATA["probe_cases"]
    assert {c["name"].split("/")[0] for c in probes} == {p[0] for p in ACCEPT_PROBES}
    for c in probes:
        p, q = np.array(c["p"]), np.array(c["q"])
        n, token = accept(np.array([c["x"]]), np.stack([p, p]), q[None], np.array([c["u_test"]]), c["u_final"])
        assert (n == 1) == (c["decision"] == "accept") and (n == 1 or token == c["token"]), c["name"]
    u0 = next(c for c in probes if c["name"].startswith("strict-u0-p0/"))
    assert (u0["u_test"], u0["p"][u0["x"]], u0["decision"]) == (0.0, 0.0, "reject")
    at = next(c for c in probes if c["name"].startswith("at-ratio/"))
    assert at["u_test"] == at["p"][at["x"]] / at["q"][at["x"]] and at["decision"] == "reject"
    assert any(c["name"].startswith("residual-zero-mass-above-ratio/") and c["decision"] == "reject" for c in probes)


def test_every_round_trial_is_what_npspecs_round_returns():
    """Rows by position, injected uniforms: npspec's warp, sample and accept give each trial's drafts, count, token."""
    for c in DATA["round_cases"]:
        g = c["gamma"]
        P = np.array([floats(r) for r in c["p_warped_rows"]])
        Q = np.array([floats(r) for r in c["q_warped_rows"]])
        raw = np.array([floats(r) for r in c["p_rows"]])
        w = c["warping"]
        np.testing.assert_allclose(warp(np.log(raw), temperature=w["temperature"], top_k=w["top_k"],
                                        top_p=float(F(w["top_p"]))), P, rtol=1e-12, atol=1e-15)
        assert not np.allclose(P[0], P[1])  # rows differ by position
        for t in c["trials"]:
            u = np.array(t["uniforms"])
            drafts = [sample(Q[i], u[i]) for i in range(g)]
            n, token = accept(np.array(drafts), P, Q[:g], u[g:2 * g], u[2 * g])
            assert (drafts, n, token) == (t["drafts"], t["accepted"], t["token"]), c["name"]
        assert {t["accepted"] for t in c["trials"]} >= {0, g}  # the residual and the bonus are both reached
    top50 = DATA["round_cases"][0]
    assert top50["warping"]["top_k"] == 50 and top50["n_vocab"] == 64
    assert all(sum(F(v) > 0 for v in r) < 64 for r in top50["p_warped_rows"])  # top-50 really cuts


@pytest.mark.parametrize("c", DATA["position_cases"], ids=lambda c: c["name"])
def test_npspecs_float_rule_reproduces_the_laws_by_position(c):
    P = [list(floats(r)) for r in c["p_warped_rows"]]
    Q = [list(floats(r)) for r in c["q_warped_rows"]]
    n = len(c["prompt"])
    got = kit.speculative_distribution(positional_table(P, n), positional_table(Q, n), tuple(c["prompt"]), c["gamma"],
                                       c["max_new_tokens"], c["eos_token_id"], rule=kit.npspec_rule)
    expected = {tuple(e["ids"]): float(F(e["probability"])) for e in c["output_law"]}
    assert {k for k, v in got.items() if v} == set(expected)
    assert max(abs(got[k] - v) for k, v in expected.items()) <= 1e-12
    # and the output law is not what rows fixed at position 0 would give: the positions matter
    fixed = kit.sequence_distribution(kit.constant_table(P[0]), tuple(c["prompt"]), c["max_new_tokens"])
    assert any(abs(fixed.get(k, 0) - v) > 0.01 for k, v in expected.items())


def test_the_tree_cases_are_lossless_rounds():
    for c in DATA["tree_cases"]:
        assert sum(F(e["probability"]) for e in c["round_law"]) == 1
        p, q = [F(v) for v in c["p"]], [F(v) for v in c["q"]]
        law = tree_round_distribution(kit.constant_table(p), sampled_expander(kit.constant_table(q), c["branching"]),
                                      tuple(c["prompt"]), len(c["branching"]))
        assert law == kit.sequence_distribution(kit.constant_table(p), tuple(c["prompt"]), len(c["branching"]) + 1)
        assert max(len(e["ids"]) for e in c["round_law"]) == len(c["branching"]) + 1  # a bonus is reachable


def test_the_traversal_and_exact_match_vectors_are_exact_and_npspecs():
    """Each traversal case's round law is a law and kept at least the token-wise rule's; each trial is npspec's
    decision (accept_tree_traversal given each node's row before excluding siblings; exact_match_accept); a draft
    is kept by exact-match with sum p q."""
    assert {c["name"] for c in DATA["traversal"]} >= {"paper-example", "three-tokens-chain-3"}
    for c in DATA["traversal"]:
        assert sum(F(e["probability"]) for e in c["round_law"]) == 1
        assert F(c["expected_accepted"]["traversal"]) >= F(c["expected_accepted"]["token_wise"])
        P, Q = [floats(r) for r in c["p_rows"]], [floats(r) for r in c["q_rows"]]
        for t in c["trials"]:
            depth = [0] + depths(t["parents"])
            q = np.array([Q[min(depth[parent + 1], len(Q) - 1)] for parent in t["parents"]])
            p = np.array([P[min(depth[i + 1], len(P) - 1)] for i in range(-1, len(t["parents"]))])
            u = t["uniforms"]
            assert accept_tree_traversal(t["ids"], t["parents"], q, p, np.array(u[:-1]), u[-1]) == (t["kept"],
                                                                                                   t["token"])
    paper = {c["name"]: c for c in DATA["traversal"]}["paper-example"]
    assert sum(F(e["probability"]) for e in paper["round_law"] if e["kept"] == [0, 0]) == F(1, 4) * F(2, 3)
    for c in DATA["exact_match"]:
        p, q = [F(v) for v in c["p_warped"]], [F(v) for v in c["q_warped"]]
        assert F(c["acceptance"]["exact_match"]) == sum(a * b for a, b in zip(p, q))
        for t in c["trials"]:
            g, u = len(t["drafts"]), t["uniforms"]
            got = exact_match_accept(np.array(t["drafts"]), np.array([floats(c["p_warped"])] * (g + 1)),
                                     np.array([floats(c["q_warped"])] * g), np.array(u[g:2 * g]), u[2 * g])
            assert got == (t["accepted"], t["token"])


def test_the_procedures_critical_values_have_the_stated_tail():
    proc = DATA["procedure"]
    assert proc["alpha_per_test"] == proc["alpha"] / proc["tests"] and proc["n_samples"] >= 20000
    for df in (1, 4, 16, 64):
        x = proc["critical_values"][str(df)]
        assert kit.chi2_sf(x * 1.0001, df) < proc["alpha_per_test"] < kit.chi2_sf(x * 0.9999, df)


def test_the_client_imports_no_npspec():
    tree = ast.parse(CLIENT.read_text(encoding="utf-8"))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported == {"json", "random", "sys"}


@pytest.fixture(scope="module")
def vectors_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("vectors") / "v.json"
    r = run_python(*VECTORS, out)
    assert r.returncode == 0, r.stderr
    return out


def client(path, *args):
    return run_python("-I", CLIENT, path, *args)  # -I: no PYTHONPATH, no site: npspec cannot be imported


@pytest.mark.parametrize("bug, fails", [
    (None, set()),
    ("non-strict", {"probe strict-u0-p0", "probe at-ratio", "round round-64-ids-top-k-50"}),
    ("unguarded-residual", {"probe residual-zero-mass-above-ratio"}),
    ("bonus-from-draft", {"round round-64-ids-plain", "round round-64-ids-top-k-50"}),
    ("q-unwarped", {"round round-64-ids-top-k-50", "round round-64-ids-top-p-0.8"}),
    ("rows-off-by-one", {"round round-64-ids-plain", "round round-64-ids-top-k-50"}),
    ("strict-on-draft", {"exact-match basic", "exact-match top-k"}),
    ("traversal-weight-kept", {"traversal sun-rows-tree-2x1"}),
    ("traversal-top-down", {"traversal three-tokens-chain-3"}),
], ids=lambda v: str(v) if not isinstance(v, set) else "")
def test_the_vectors_alone_catch_each_classic_bug(vectors_file, bug, fails):
    """A sampler written from VECTORS.md (tests/vectors/client.py, no npspec): the exact sections fail each bug."""
    r = client(vectors_file, *(("--bug", bug) if bug else ()))
    lines = r.stdout.splitlines()
    assert (r.returncode == 0) == (bug is None) and lines[-1].endswith(" failures"), r.stdout + r.stderr
    failed = {" ".join(line.split()[1:3]).split("/")[0].rstrip(":") for line in lines if line.startswith("FAIL ")}
    assert fails <= failed, r.stdout
    if bug == "unguarded-residual":
        assert "ZeroDivisionError" in r.stdout


@pytest.mark.slow
@pytest.mark.statistical
@pytest.mark.parametrize("bug", [None, "bonus-from-draft", "rows-off-by-one", "q-unwarped"])
def test_the_vectors_procedure_passes_a_correct_sampler_and_catches_the_law_bugs(vectors_file, bug):
    """The sampling procedure of VECTORS.md (20,000 generations per case, total false-alarm rate 1e-6)."""
    r = client(vectors_file, "--statistical", *(("--bug", bug) if bug else ()))
    law_failures = [line for line in r.stdout.splitlines() if line.startswith("FAIL law ")]
    assert (not law_failures) == (bug is None), r.stdout
    if bug in ("bonus-from-draft", "rows-off-by-one"):
        assert any("rows-by-position" in line for line in law_failures), r.stdout

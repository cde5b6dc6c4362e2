"""The vectors in a second language: tests/vectors/client.mjs, a sampler for Node with no packages.

It is written from VECTORS.md alone, like client.py, but in JavaScript: it passes with its correct round and
fails, from the exported vectors alone, with each planted bug (a non-strict test, a bonus from the draft, a
reused uniform, a one-sided warp), naming the failing cases. Skipped with its reason where `node` is not on
PATH; CI's default run holds it.
"""

import json
import re
import shutil
import subprocess

import pytest

from conftest import ROOT, run_python

NODE = shutil.which("node")
CLIENT = ROOT / "tests" / "vectors" / "client.mjs"
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not on PATH: the JavaScript consumer cannot run")


@pytest.fixture(scope="module")
def vectors_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("vectors") / "v.json"
    r = run_python("-m", "npspec.testing", "vectors", out)
    assert r.returncode == 0, r.stderr
    return out


def node(*args):
    return subprocess.run([NODE, CLIENT, *map(str, args)], capture_output=True, text=True, timeout=300)


def failed_cases(stdout):  # "FAIL probe at-ratio/u_final=0.0: ..." -> "probe at-ratio"
    return {" ".join(line.split()[1:3]).split("/")[0].rstrip(":") for line in stdout.splitlines()
            if line.startswith("FAIL ")}


def test_the_client_uses_nothing_but_nodes_standard_library():
    text = CLIENT.read_text(encoding="utf-8")
    imports = re.findall(r'^import .* from "([^"]+)";', text, flags=re.M)
    assert imports and all(m.startswith("node:") for m in imports), imports
    assert "require(" not in text and "import(" not in text


def test_a_correct_sampler_passes_every_exact_section(vectors_file):
    r = node(vectors_file)
    assert (r.returncode, r.stdout, r.stderr) == (0, "0 failures\n", "")


@pytest.mark.parametrize("bug, fails", [
    ("non-strict", {"probe strict-u0-p0", "probe at-ratio", "round round-64-ids-top-k-50"}),
    ("bonus-from-draft", {"round round-64-ids-plain", "law basic", "law rows-by-position"}),
    ("reused-uniform", {"round round-64-ids-plain", "round round-64-ids-top-k-50", "law basic"}),
    ("one-sided-warp", {"round round-64-ids-top-k-50", "round round-64-ids-top-p-0.8", "law top-k", "law top-p"}),
    ("traversal-top-down", {"traversal three-tokens-chain-3"}),
])
def test_the_vectors_alone_catch_each_planted_bug(vectors_file, bug, fails):
    r = node(vectors_file, "--bug", bug)
    lines = r.stdout.splitlines()
    assert r.returncode == 1 and lines[-1] == f"{len(lines) - 1} failures", r.stdout + r.stderr
    failed = failed_cases(r.stdout)
    assert fails <= failed, r.stdout
    assert not any(case.startswith("warp ") for case in failed)  # the warp is right; the bug is where it is used
    assert all(len(line) < 400 for line in lines)  # one short line per failing case


def test_a_non_strict_test_is_invisible_to_the_laws_and_caught_by_the_probes(vectors_file):
    """u <= p/q differs from u < p/q on a set of measure zero: only injected uniforms at the boundary see it."""
    failed = failed_cases(node(vectors_file, "--bug", "non-strict").stdout)
    assert not any(case.startswith("law ") for case in failed), failed


def tampered(vectors_file, tmp_path, edit):
    data = json.loads(vectors_file.read_text(encoding="utf-8"))
    edit(data)
    out = tmp_path / "tampered.json"
    out.write_text(json.dumps(data), encoding="utf-8")
    return node(out)


def by_name(items, name):
    return next(c for c in items if c["name"] == name)


def test_each_exact_section_can_fail_on_a_wrong_vector(vectors_file, tmp_path):
    """A correct sampler against vectors with one number changed: the section that holds it names the case."""
    def warp(d):
        by_name(d["cases"], "top-k")["q_warped"] = ["1/2", "1/4", "1/4", "0", "0"]

    def law(d):
        by_name(d["cases"], "basic")["output_law"][0]["probability"] = "1/9"

    def probe(d):
        d["probe_cases"][0]["token"] = 2

    def trial(d):
        by_name(d["round_cases"], "round-64-ids-plain")["trials"][0]["accepted"] = 1

    def traversal(d):
        by_name(d["traversal"], "paper-example")["round_law"][0]["probability"] = "1/3"

    def strict(d):
        by_name(d["exact_match"], "basic")["trials"][0]["token"] += 1

    # a wrong *_warped row also moves the exact law's cells, which are its CDF edges
    for edit, cases in ((warp, {"warp top-k", "law top-k"}), (law, {"law basic"}), (probe, {"probe strict-u0-p0"}),
                        (trial, {"round round-64-ids-plain"}), (traversal, {"traversal paper-example"}),
                        (strict, {"exact-match basic"})):
        r = tampered(vectors_file, tmp_path, edit)
        assert r.returncode == 1 and failed_cases(r.stdout) == cases, (cases, r.stdout)


def test_misuse_exits_2_with_the_usage(vectors_file, tmp_path):
    r = node(vectors_file, "--bug", "no-such-bug")
    assert r.returncode == 2 and r.stdout == "" and "usage: node client.mjs VECTORS.json" in r.stderr
    (tmp_path / "other.json").write_text('{"format": "something-else", "version": 2}', encoding="utf-8")
    r = node(tmp_path / "other.json")
    assert r.returncode == 2 and "not npspec-speculative-vectors version 2" in r.stderr


@pytest.mark.slow
@pytest.mark.statistical
@pytest.mark.parametrize("bug", [None, "bonus-from-draft", "reused-uniform", "one-sided-warp"])
def test_the_sampling_procedure_in_javascript(vectors_file, bug):
    """VECTORS.md's procedure (20,000 generations per case, false-alarm rate 1e-6), seeded: about two seconds."""
    r = node(vectors_file, "--statistical", *(("--bug", bug) if bug else ()))
    sampled = [line for line in r.stdout.splitlines() if line.startswith("FAIL sampled ")]
    assert (not sampled) == (bug is None) and r.returncode == (0 if bug is None else 1), r.stdout

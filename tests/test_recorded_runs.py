"""Recorded runs: the ids, counts, uniform draws and traces (times excluded) of a broad set of generations, replayed.

Every drafter (draft model, confidence stopping, n-gram lookup, static and dynamic trees, the controlled drafters of
--simulate-acceptance and the bench), tree shape and kind, gamma schedule, p_min and sampling option (greedy,
temperature, top-k, top-p), on the shipped pair, on a table model with an EOS and a short context, and on
random:gpt2 (in memory; marked slow), plus the command line (--simulate-acceptance, --draft ngram, --compare). The
record was made before the decoding layer moved into npspec.decode, so a refactoring that changes any decision shows
here. A stale record fails with the command that rewrites it (after a deliberate change of behaviour only):

    PYTHONPATH=. python tests/test_recorded_runs.py      # rewrites tests/data/recorded_runs.json
"""

import io
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from npspec import testing as kit
from npspec.cli import generate
from bench.controlled import ControlledLookup, ControlledTree
from npspec.decode.drafters import DynamicTreeDrafter, ModelDrafter, NgramDrafter, TreeDrafter
from npspec.decode.drafters import ControlledDraft
from npspec.decode import speculative_generate
from npspec.sources import load, random_model

RECORD = Path(__file__).resolve().parent / "data" / "recorded_runs.json"
KERNELS = {"target": "gemm-blocks", "draft": "gemv-panels"}  # the kernels recorded with (a sampled run's p and q bits)
# A trace's p and q are floats whose last bits come from the BLAS of the machine that runs the test (gemm-blocks'
# GEMM and numpy's vector exp differ between CPUs: the record's machine and an AMD Zen 5 differ in the 17th digit).
# Every id, count, draw and decision must match exactly; a float within REL_TOL (or ABS_TOL near zero) of its record.
REL_TOL, ABS_TOL = 1e-4, 1e-9
VERSION = 1
HINT = "if the change of behaviour is deliberate, rewrite the record: PYTHONPATH=. python tests/test_recorded_runs.py"
TIMES = ("seconds", "seconds_draft", "seconds_verify", "seconds_other", "tokens_per_s")
SAMPLINGS = {"greedy": dict(temperature=0.0), "t0.8-p0.95": dict(temperature=0.8, top_p=0.95),
             "t1.0-k20": dict(temperature=1.0, top_k=20), "t1.5": dict(temperature=1.5)}


class CountingRng:
    """An np.random.Generator seeded with `seed`, recording the size of each `random(n)` request."""

    def __init__(self, seed):
        self.rng, self.sizes = np.random.default_rng(seed), []

    def random(self, n):
        self.sizes.append(int(n))
        return self.rng.random(n)


def timeless(x):
    """x (a stats dict or trace list) without times, with NaN as None."""
    if isinstance(x, dict):
        return {k: timeless(v) for k, v in x.items() if k not in TIMES}
    if isinstance(x, list):
        return [timeless(v) for v in x]
    return None if isinstance(x, float) and x != x else x


def outcome(gen, rng, emitted):
    return {"ids": [int(i) for i in gen.ids], "stats": timeless(gen.stats.as_dict()), "draws": rng.sizes,
            "emitted": emitted, "trace": timeless(gen.trace)}


def first_difference(got, want, path="run"):
    """None if `got` matches `want` (same structure, ints, strings and bools exactly, floats within REL_TOL or ABS_TOL),
    else the path and both values of the first difference, as one line."""
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        return None if math.isclose(got, want, rel_tol=REL_TOL, abs_tol=ABS_TOL) else f"{path}: {got!r} != {want!r}"
    if isinstance(want, dict) and isinstance(got, dict):
        if sorted(got) != sorted(want):
            return f"{path}: keys {sorted(got)} != {sorted(want)}"
        return next((d for k in sorted(want) if (d := first_difference(got[k], want[k], f"{path}.{k}"))), None)
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return f"{path}: length {len(got)} != {len(want)}"
        return next((d for i, (g, w) in enumerate(zip(got, want)) if (d := first_difference(g, w, f"{path}[{i}]"))),
                    None)
    return None if type(got) is type(want) and got == want else f"{path}: {got!r} != {want!r}"


def run(target, drafter, prompt, max_new_tokens, gamma, seed=0, **options):
    rng, emitted = CountingRng(seed), []
    gen = speculative_generate(target, drafter, prompt, max_new_tokens, gamma=gamma, rng=rng, trace=True,
                               on_emit=lambda ids, n: emitted.append([[int(i) for i in ids], int(n)]), **options)
    return outcome(gen, rng, emitted)


def greedy_sequence(target, prompt, n):
    return list(prompt) + speculative_generate(target, None, prompt, n, gamma=0, temperature=0).ids


def shipped_runs():
    """name -> a function returning the run's outcome, on the shipped pair."""
    target, draft = load(None, "target", kernel=KERNELS["target"]), load(None, "draft", kernel=KERNELS["draft"])
    n_vocab, eos = target.config.n_vocab, target.config.eos_token_id
    romeo = target.tokenizer.encode("ROMEO:").ids
    passage = target.tokenizer.encode("JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\nJULIET:\nO Romeo").ids
    long = (passage * 40)[:target.config.n_ctx - 7]  # the context ends the run
    runs = {}
    for name, sampling in SAMPLINGS.items():
        runs[f"plain {name}"] = lambda s=sampling: run(target, None, romeo, 16, 0, **s)
        runs[f"model g4 {name}"] = lambda s=sampling: run(target, draft, romeo, 24, 4, **s)
        runs[f"ngram g4 {name}"] = lambda s=sampling: run(target, NgramDrafter(n_vocab, eos), passage, 24, 4, **s)
        runs[f"tree 3,2,1 sampled {name}"] = lambda s=sampling: run(target, TreeDrafter(draft, (3, 2, 1)), romeo, 20,
                                                                    4, **s)
        runs[f"dynamic tree 6 {name}"] = lambda s=sampling: run(target, DynamicTreeDrafter(draft, 6), romeo, 20, 4,
                                                                **s)
    for name in ("greedy", "t0.8-p0.95"):
        s = SAMPLINGS[name]
        runs[f"model heuristic {name}"] = lambda s=s: run(target, ModelDrafter(draft), romeo, 24, 2,
                                                          gamma_schedule="heuristic", **s)
        runs[f"ngram heuristic 2..3 {name}"] = lambda s=s: run(target, NgramDrafter(n_vocab, eos, 2, 3), passage, 24,
                                                               3, gamma_schedule="heuristic", **s)
        for p_min in (0.3, 0.7):
            runs[f"model p_min {p_min} {name}"] = lambda s=s, p=p_min: run(target, ModelDrafter(draft, p_min=p),
                                                                           romeo, 24, 5, **s)
        runs[f"tree 2,2 top-k {name}"] = lambda s=s: run(target, TreeDrafter(draft, (2, 2), "top-k"), romeo, 16, 3,
                                                         **s)
        runs[f"tree 4 {name}"] = lambda s=s: run(target, TreeDrafter(draft, (4,)), romeo, 16, 4, seed=3, **s)
        runs[f"model context stop {name}"] = lambda s=s: run(target, draft, long, 40, 4, **s)
        runs[f"tree context stop {name}"] = lambda s=s: run(target, TreeDrafter(draft, (2, 1, 1)), long, 40, 4, **s)
        runs[f"huge gamma {name}"] = lambda s=s: run(target, draft, romeo, 8, 100, seed=5, **s)
    greedy = greedy_sequence(target, romeo, 30)
    runs["controlled draft a0.7"] = lambda: run(
        target, ModelDrafter(ControlledDraft(draft, greedy, 0.7, np.random.default_rng(1))), romeo, 24, 4,
        temperature=0)
    runs["controlled lookup a0.5"] = lambda: run(
        target, ControlledLookup(n_vocab, eos, greedy, 0.5, np.random.default_rng(2)), romeo, 24, 3, temperature=0)
    runs["controlled tree a0.7"] = lambda: run(
        target, ControlledTree(draft, (2, 1), greedy, 0.7, np.random.default_rng(3)), romeo, 24, 2, temperature=0)
    return runs


def eos_runs():
    """Table models with an EOS (id 0) and a short context: the EOS cut, an accepted EOS, the context stop."""
    def table(shift):
        def logits(seq):
            row = np.log(np.full(5, 0.05))
            row[(sum(seq) + shift) % 5] = np.log(0.8)
            return row
        return logits
    target, draft = kit.TableModel(table(0), 5, 24, 0), kit.TableModel(table(1), 5, 20, 0)
    same = kit.TableModel(table(0), 5, 24, 0)
    runs = {}
    for name, sampling in SAMPLINGS.items():
        for seed in range(3):
            runs[f"table eos seed {seed} {name}"] = lambda s=sampling, k=seed: run(target, draft, [1, 2], 30, 3, seed=k,
                                                                                   **s)
            runs[f"table same seed {seed} {name}"] = lambda s=sampling, k=seed: run(target, same, [3], 30, 4, seed=k,
                                                                                    **s)
            runs[f"table tree seed {seed} {name}"] = lambda s=sampling, k=seed: run(
                target, TreeDrafter(draft, (2, 2)), [1], 30, 3, seed=k, **s)
    return runs


def cli_runs():
    """The command line's --json output (speeds excluded)."""
    def cli(*argv):
        out, err = io.StringIO(), io.StringIO()
        kernels = ["--target-kernel", KERNELS["target"]] + ([] if "ngram" in argv else ["--draft-kernel", KERNELS["draft"]])
        generate.run(generate.build_parser().parse_args([*argv, *kernels, "--json", "--trace", "--quiet"]), out=out,
                     err=err)
        obj = json.loads(out.getvalue())
        compare = obj.pop("compare", None)
        for key in [f"{role}_{k}" for role in ("target", "draft") for k in ("kernel", "threads", "prefill_rows")]:
            # pinned kernels, the CPUs, the machine's prefill (npspec.kernels.probe.choose_prefill)
            obj["stats"].pop(key, None)
        obj = timeless(obj)
        if compare is not None:
            obj["compare_same_ids"] = compare["same_ids"]
        return obj
    return {"cli simulate-acceptance 0.6": lambda: cli("--simulate-acceptance", "0.6", "--temperature", "0",
                                                       "--max-new-tokens", "20"),
            "cli ngram": lambda: cli("--draft", "ngram", "--max-new-tokens", "20", "--seed", "3"),
            "cli compare greedy": lambda: cli("--compare", "--temperature", "0", "--max-new-tokens", "12"),
            "cli tree budget": lambda: cli("--tree-budget", "5", "--gamma", "3", "--max-new-tokens", "12")}


def random_runs():
    """random:gpt2 (GPT-2 small's shapes, seed 0, in memory) with n-gram lookup, itself as its draft, and the
    controlled drafters."""
    target = random_model("gpt2", seed=0, kernel=KERNELS["target"])
    prompt = target.tokenizer.encode("The quick brown fox jumps over the lazy dog. The quick brown").ids
    n_vocab, eos = target.config.n_vocab, target.config.eos_token_id
    greedy = greedy_sequence(target, prompt, 8)
    return {
        "random gpt2 ngram greedy": lambda: run(target, NgramDrafter(n_vocab, eos), prompt, 6, 3, temperature=0),
        "random gpt2 self t0.8": lambda: run(target, target, prompt, 4, 2, temperature=0.8, top_p=0.95),
        "random gpt2 controlled draft": lambda: run(
            target, ModelDrafter(ControlledDraft(target, greedy, 0.7, np.random.default_rng(4))), prompt, 6, 3,
            temperature=0),
        "random gpt2 controlled tree": lambda: run(
            target, ControlledTree(target, (2, 1), greedy, 0.7, np.random.default_rng(5)), prompt, 6, 2,
            temperature=0),
    }


GROUPS = {"shipped": shipped_runs, "table": eos_runs, "cli": cli_runs, "random": random_runs}


def stored():
    if not RECORD.exists():
        pytest.fail(f"{RECORD} is missing; {HINT}")
    data = json.loads(RECORD.read_text())
    if data.get("version") != VERSION:
        pytest.fail(f"{RECORD} has version {data.get('version')}, this test expects {VERSION}; {HINT}")
    return data["runs"]


@pytest.mark.parametrize("group", [pytest.param(g, marks=pytest.mark.slow) if g == "random" else g for g in GROUPS])
def test_recorded_runs_replay(group, tmp_path, monkeypatch):
    """Each run of the group reproduces its record: ids, counts, draws, on_emit calls and trace exactly, p and q within
    REL_TOL (their last bits are the BLAS's)."""
    monkeypatch.setenv("NPSPEC_CACHE", str(tmp_path / "cache"))
    record = stored()[group]
    runs = GROUPS[group]()
    assert sorted(runs) == sorted(record), f"the runs of {group} changed; {HINT}"
    for name, make in runs.items():
        got = json.loads(json.dumps(make()))
        difference = first_difference(got, record[name], name)
        assert difference is None, f"{difference}; {HINT}"


def test_the_comparison_allows_a_float_s_last_bits_and_nothing_else():
    record = {"ids": [1, 2], "trace": [{"p": [0.15805954114327977, 1e-12], "accepted": 1}], "stop": "eos"}
    assert first_difference(json.loads(json.dumps(record)), record) is None
    last_bits = {**record, "trace": [{"p": [0.15805954114327975, 1.3e-12], "accepted": 1}]}
    assert first_difference(last_bits, record) is None
    for changed, where in ((dict(record, ids=[1, 3]), "run.ids[1]"), (dict(record, ids=[1]), "run.ids: length"),
                           (dict(record, stop="max_new_tokens"), "run.stop"), (dict(record, extra=1), "run: keys"),
                           ({**record, "trace": [{"p": [0.1581, 1e-12], "accepted": 1}]}, "run.trace[0].p[0]"),
                           ({**record, "trace": [{"p": [0.15805954114327977, 1e-12], "accepted": 2}]},
                            "run.trace[0].accepted"),
                           ({**record, "trace": [{"p": [0.15805954114327977, 1e-12], "accepted": True}]},
                            "run.trace[0].accepted")):
        assert first_difference(changed, record).startswith(where), where


def write():
    runs = {group: {name: json.loads(json.dumps(make())) for name, make in build().items()}
            for group, build in GROUPS.items()}
    RECORD.write_text(json.dumps({"version": VERSION, "runs": runs}, sort_keys=True) + "\n")
    print(f"wrote {RECORD}: {sum(map(len, runs.values()))} runs")


if __name__ == "__main__":
    import os
    import tempfile
    with tempfile.TemporaryDirectory() as cache:
        os.environ["NPSPEC_CACHE"] = cache
        write()
    sys.exit(0)

"""python -m bench.mutants [NAME ...] [--list]: the classic sampler faults, planted one at a time in a copy of npspec.

Each mutant (MUTANTS) is one textual edit of npspec's own sampler, round or drafter, the fault real engines
shipped: the six classic ones (a non-strict test, an unguarded residual, the bonus from the draft, q reported
unwarped, the target's rows off by one, a drafter length rule that peeks), then one per class of the kit's bug zoo
(npspec.testing.zoo.BUGS) that npspec's round can express (not placeholder-id: npspec never pads drafts). For each, the
repository (npspec/, tests/, setup.cfg, examples/, notes/, README.md; weights/ linked, not copied) is copied
to a fresh temporary directory, the edit is applied there (it must match exactly once: a stale mutant is an
error, not a pass), and the tests named for that fault run on the copy with pytest. The working tree is never
touched. The mutant is killed when at least one test fails; the report names every test that failed.

Exit status 0 if every mutant is killed, 1 if one survives, 2 for a usage error or a stale mutant. Takes a few
minutes on 2 cores (tests/test_mutants.py, marked slow, runs it).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("npspec", "tests", "examples", "notes", "bench", "setup.cfg", "pyproject.toml", "README.md", "LICENSE")

STRICT_TESTS = [
    "tests/test_one_step.py::test_no_nan_reaches_a_sampler_in_accept",
    "tests/test_one_step.py::test_strict_acceptance_u_zero_never_accepts_p_zero",
    "tests/test_sampling.py::test_no_nan_reaches_a_sampler_from_logits",
    "tests/test_derivation_warping.py::test_strict_test_never_accepts_p_zero",
    "tests/test_kit.py::test_npspec_sampler_passes",
    "tests/test_kit_rounds.py::test_npspecs_own_round_passes",
]
ROUND_TESTS = [
    "tests/test_kit.py::test_npspec_sampler_passes",
    "tests/test_kit_rounds.py::test_npspecs_own_round_passes",
    "tests/test_derivation.py::test_sequence_law_through_accept",
    "tests/test_one_step.py",
]
DRAFTER_TESTS = [
    "tests/test_drafters_exact.py::test_the_kit_checks_drafter_objects",
    "tests/test_kit_rounds.py::test_model_drafter_objects_are_lossless_under_every_warp",
]

ZOO_SAMPLER_TESTS = [
    "tests/test_kit.py::test_npspec_sampler_passes",
    "tests/test_kit_rounds.py::test_npspecs_own_round_passes",
]
BLOCK_TESTS = [
    "tests/test_block_verify.py::test_block_verification_keeps_the_target_law_on_every_small_case",
    "tests/test_block_verify.py::test_block_accept_decides_as_block_verification",
]
TEST_RULE = "kept = u_accept < p[rows, d] / q[rows, d]"
LAST_ROW = "last = p[gamma] if n == gamma else residual(p[n], q[n])"
DRAW = "token, top = sample(row, u[i]), row.max()"

# (name, file, the original text, the mutant's text, the tests that must kill it)
MUTANTS = [
    ("non-strict-test", "npspec/decode/rules/token.py",
     "kept = u_accept < p[rows, d] / q[rows, d]", "kept = u_accept <= p[rows, d] / q[rows, d]", STRICT_TESTS),
    ("unguarded-residual", "npspec/decode/sampling.py",
     "    if not mass > 0:\n        return p\n    return r / mass", "    return r / mass",
     ["tests/test_kit.py::test_npspec_sampler_passes", "tests/test_sampling.py", "tests/test_one_step.py"]),
    ("bonus-from-q", "npspec/decode/rules/token.py",
     "last = p[gamma] if n == gamma else residual(p[n], q[n])",
     "last = (q[gamma - 1] if gamma else p[gamma]) if n == gamma else residual(p[n], q[n])", ROUND_TESTS),
    ("q-unwarped", "npspec/decode/drafters/model.py",
     "                q.append(row)\n",
     "                q.append(warp(logits, temperature=sampling.temperature))\n", DRAFTER_TESTS),
    ("row-off-by-one", "npspec/decode/rules/token.py",
     "kept = u_accept < p[rows, d] / q[rows, d]", "kept = u_accept < p[rows + 1, d] / q[rows, d]", ROUND_TESTS),
    ("length-rule-peeks", "npspec/decode/drafters/model.py",
     "            d.append(token)\n            ctx.append(token)\n            if top < self.p_min:",
     "            if not sampling.greedy and row[token] < self.p_min:  # withholds d_i after seeing it\n"
     "                q.pop()\n                break\n"
     "            d.append(token)\n            ctx.append(token)\n            if top < self.p_min:", DRAFTER_TESTS),
    # the bug zoo, one mutant per class npspec's round can express (named as npspec.testing.zoo.BUGS names them)
    ("zoo-uniform-reused", "npspec/decode/rules/token.py", "return n, sample(last, u_final)",
     "return n, sample(last, u_accept[n] if n < gamma else u_final)", ZOO_SAMPLER_TESTS),
    ("zoo-constant-uniform", "npspec/decode/rules/token.py", TEST_RULE,
     "kept = 0.0 * u_accept < p[rows, d] / q[rows, d]", ZOO_SAMPLER_TESTS),
    ("zoo-p-unwarped", "npspec/decode/round.py", "p, q = sampling.warp(logits[:k + 1]), proposal.q_rows(n_vocab)",
     "p, q = type(sampling)(sampling.temperature).warp(logits[:k + 1]), proposal.q_rows(n_vocab)",
     ["tests/test_loop_replay.py::test_q_is_what_the_draft_sampled_from_and_p_is_warped_alike"]),
    ("zoo-argmax-draft", "npspec/decode/drafters/model.py", DRAW, "token, top = int(np.argmax(row)), row.max()",
     DRAFTER_TESTS),
    ("zoo-precision-mismatch", "npspec/decode/drafters/model.py", DRAW,
     "token, top = sample(row.astype(np.float16).astype(np.float64), u[i]), row.max()",
     ["tests/test_kit_zoo.py::test_npspecs_model_drafter_draws_from_the_q_it_reports_at_cells_edges"]),
    ("zoo-block-token-test", "npspec/decode/rules/block.py",
     "    h = block_thresholds(w, p, q)\n    kept = np.asarray(u_tests[:k]) < h[1:]",
     "    h = np.append(1.0, np.cumprod(np.minimum(1.0, p[np.arange(k), d] / q[np.arange(k), d])))\n"
     "    kept = np.cumprod(u_tests[:k]) <= h[1:]", BLOCK_TESTS),
    ("zoo-block-q-one", "npspec/decode/rules/block.py", "ratio = p[np.arange(k), d] / q[np.arange(k), d]",
     "ratio = p[np.arange(k), d] / 1.0", BLOCK_TESTS),
    ("zoo-inputs-mutated", "npspec/decode/rules/token.py", LAST_ROW, LAST_ROW + "\n    q[rows, d] = 0.0",
     ZOO_SAMPLER_TESTS),
    ("zoo-no-residual", "npspec/decode/rules/token.py", LAST_ROW,
     "last = p[gamma] if n == gamma else p[n]", ZOO_SAMPLER_TESTS),
]


class StaleMutant(Exception):
    """A mutant's original text is not in its file exactly once: the code moved; update MUTANTS."""


def copy_tree(dest):
    """The files the tests need, copied into dest (weights/ as a symlink: read only, 39 MB)."""
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis"))
        elif src.exists():
            shutil.copy2(src, dest / name)
    (dest / "weights").symlink_to(ROOT / "weights", target_is_directory=True)


def plant(dest, file, original, mutant):
    path = dest / file
    text = path.read_text(encoding="utf-8")
    if text.count(original) != 1:
        raise StaleMutant(f"{file}: the mutant's original text occurs {text.count(original)} times, not once: "
                          "update bench/mutants.py's MUTANTS")
    path.write_text(text.replace(original, mutant), encoding="utf-8")


def run_tests(dest, tests):
    """(returncode, failed test ids) of pytest on the copy, slow tests included, no cache written."""
    env = dict(os.environ, PYTHONPATH=str(dest), NPSPEC_CACHE=str(dest / ".cache"), PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow",
                        "-o", "addopts=--strict-markers", *tests], cwd=dest, env=env, capture_output=True, text=True)
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+?)(?: - .*)?$", r.stdout, flags=re.M)))
    return r.returncode, failed, r.stdout


def check(name, file, original, mutant, tests):
    """Plant one mutant in a fresh copy and run its tests: (killed, the tests that failed, pytest's tail)."""
    with tempfile.TemporaryDirectory(prefix=f"npspec-mutant-{name}-") as tmp:
        dest = Path(tmp)
        copy_tree(dest)
        plant(dest, file, original, mutant)
        rc, failed, out = run_tests(dest, tests)
    return rc != 0 and bool(failed), failed, out.strip().splitlines()[-1:] if out.strip() else []


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.mutants", description=__doc__.split("\n")[0].split(": ", 1)[1])
    ap.add_argument("names", nargs="*", help="mutants to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutants and their tests, run nothing")
    args = ap.parse_args(argv)
    known = [m[0] for m in MUTANTS]
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"bench.mutants: error: no mutant {', '.join(unknown)}; choose from {', '.join(known)}", file=sys.stderr)
        return 2
    chosen = [m for m in MUTANTS if not args.names or m[0] in args.names]
    if args.list:
        for name, file, *_, tests in chosen:
            print(f"{name}: {file}; tests {' '.join(tests)}")
        return 0
    survived = 0
    for name, file, original, mutant, tests in chosen:
        try:
            killed, failed, tail = check(name, file, original, mutant, tests)
        except StaleMutant as e:
            print(f"bench.mutants: error: {name}: {e}", file=sys.stderr)
            return 2
        survived += not killed
        print(f"{name}: " + (f"killed by {', '.join(failed)}" if killed else f"SURVIVED ({' '.join(tail)})"),
              flush=True)
    print(f"{len(chosen) - survived} of {len(chosen)} mutants killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())

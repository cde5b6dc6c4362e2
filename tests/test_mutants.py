"""bench/mutants.py, the mutation check: each classic sampler fault planted in a copy of npspec is killed by a
named test. The full run is slow (a few minutes: it runs the tests once per mutant); the default suite checks
that every mutant still applies to today's code, so the slow run cannot pass by mutating nothing."""

import pytest

from bench import mutants
from npspec.testing import BUGS

from conftest import ROOT, run_python


# the bug-zoo class each mutant plants (npspec.testing.zoo.BUGS); None: a classic fault outside the zoo
CLASS_OF = {"non-strict-test": "non-strict-test", "unguarded-residual": None, "bonus-from-q": "bonus-from-draft",
            "q-unwarped": "q-unwarped", "row-off-by-one": "rows-off-by-one", "length-rule-peeks": None}
NOT_IN_NPSPECS_ROUND = {"placeholder-id"}  # npspec never pads its drafts: no edit of its round writes this class


def test_every_zoo_class_npspecs_round_can_express_is_a_mutant():
    planted = {CLASS_OF[name] if name in CLASS_OF else name.removeprefix("zoo-") for name, *_ in mutants.MUTANTS}
    assert planted - {None} == {b.name for b in BUGS} - NOT_IN_NPSPECS_ROUND


def test_every_mutant_applies_to_the_code_exactly_once_and_names_its_tests():
    assert {m[0] for m in mutants.MUTANTS} >= set(CLASS_OF)
    for name, file, original, mutant, tests in mutants.MUTANTS:
        assert (ROOT / file).read_text(encoding="utf-8").count(original) == 1, name
        assert original != mutant and tests, name
        for test in tests:
            assert (ROOT / test.split("::")[0]).is_file(), (name, test)


def test_a_stale_mutant_is_an_error_not_a_pass(tmp_path):
    (tmp_path / "x.py").write_text("a = 1\n")
    with pytest.raises(mutants.StaleMutant, match="occurs 0 times"):
        mutants.plant(tmp_path, "x.py", "a = 2", "a = 3")
    mutants.plant(tmp_path, "x.py", "a = 1", "a = 3")
    assert (tmp_path / "x.py").read_text() == "a = 3\n"


def test_an_unknown_mutant_is_a_usage_error():
    r = run_python("-m", "bench.mutants", "no-such")
    assert r.returncode == 2 and r.stdout == "" and "no mutant no-such" in r.stderr


@pytest.mark.slow
def test_every_mutant_is_killed_by_a_named_test():
    before = sorted(p.read_bytes() for p in (ROOT / "npspec").rglob("*.py"))
    r = run_python("-m", "bench.mutants", timeout=3000)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == f"{len(mutants.MUTANTS)} of {len(mutants.MUTANTS)} mutants killed", r.stdout
    for name, *_ in mutants.MUTANTS:
        line = next(x for x in lines if x.startswith(f"{name}: "))
        assert line.startswith(f"{name}: killed by tests/"), line
    assert sorted(p.read_bytes() for p in (ROOT / "npspec").rglob("*.py")) == before  # the tree is untouched

"""notes/ and README.md cannot drift: the notes' code runs, and every test, test file or function they name exists
(the figures notes/ quote from bench/results/: tests/test_notes_figures.py).

* Every ```python block of a note runs, in order, in one namespace per note (a small markdown
  runner); a failing block fails here with the note's own line numbers in the traceback.
  Blocks check values with asserts.
* A ```output block right after a ```python block quotes what that block prints, and must match it
  (`same_output`): the text exactly (runs of spaces and trailing spaces aside, so that column
  alignment may shift), integers exactly, numbers with a decimal
  point or an exponent within 0.5% of the quoted value or one unit of its last printed digit,
  whichever is larger (the last printed digit may change with the BLAS build; a quoted 0.0028 may
  read 0.0027 to 0.0029, never 0.0048), and a number written `~123` in the quote (a timing) is not
  compared.
* Every `tests/<file>.py::<test>` reference in notes/*.md names a test function defined in that
  file, and every numbered claim of derivation.md names at least one; each test a claim cites is
  checked against the claim's own words (CLAIM_WORDS: words of the claim's text, at least one of which
  the test's source, decorators included, must use), and each claim still cites the tests
  CLAIM_TESTS maps to it (a test moved or renamed must be cited again).
* Every `npspec/<module>.py::<name>` reference names an attribute that exists (`Stats.alpha` too).
* Every `tests/<file>.py` that notes/*.md or README.md names exists.
"""

import ast
import contextlib
import importlib
import io
import re
import sys
from functools import lru_cache

import pytest

from conftest import ROOT

NOTES = ROOT / "notes"
TEST_REF = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
TEST_FILE = re.compile(r"tests/[\w/]+\.py")
CODE_REF = re.compile(r"(npspec/[\w/]+\.py)::([\w.]+)")
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
OUTPUT = re.compile(r"[ \t]*\n(?:[ \t]*\n)*```output[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
NUMBER = re.compile(r"~?[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
REL_TOL = 0.005


def notes():
    return sorted(NOTES.glob("*.md"))


def python_blocks(text):
    """[(first line number of the code, code)] of every ```python block, in order."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in FENCE.finditer(text)]


def quoted_outputs(text):
    """{first line number of a python block's code: the ```output block quoted right after it}."""
    out = {}
    for m in FENCE.finditer(text):
        quote = OUTPUT.match(text, m.end())
        if quote:
            out[text.count("\n", 0, m.start(1)) + 1] = quote.group(1)
    return out


def same_output(quoted, printed):
    """None if `printed` matches the `quoted` output (rules in the module docstring), else what differs."""
    def split(s):
        lines = "\n".join(re.sub(r"[ \t]+", " ", line).rstrip() for line in s.strip("\n").splitlines())
        return NUMBER.split(lines), NUMBER.findall(lines)

    (q_text, q_nums), (p_text, p_nums) = split(quoted), split(printed)
    if q_text != p_text or len(q_nums) != len(p_nums):
        return f"the text differs:\n--- quoted\n{quoted}\n--- printed\n{printed}"
    for q, p in zip(q_nums, p_nums):
        if q.startswith("~"):
            continue
        if not re.search(r"[.eE]", q):
            if q.lstrip("+") != p.lstrip("+"):
                return f"integer {p} printed where the quote says {q}"
        elif abs(float(p) - float(q)) > (tol := max(REL_TOL * abs(float(q)), last_digit(q))):
            return f"{p} printed where the quote says {q} (tolerance {tol:.2g}: {REL_TOL:.1%} or its last digit)"
    return None


def last_digit(number):
    """One unit of the last printed digit of a decimal: 0.0001 for "0.0028", 10 for "1.23e+03"; 1e-12 slack for
    the binary representation."""
    mantissa, _, exponent = number.lstrip("~+-").lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals) * (1 + 1e-9)


@lru_cache(maxsize=None)
def defined_tests(path):
    """Names of the test functions (and test methods, as Class::name) defined in a test file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(f"{node.name}::{f.name}" for f in node.body if isinstance(f, ast.FunctionDef))
    return {n for n in names if n.split("::")[-1].startswith("test")}


def missing_test_refs(text):
    """The `tests/...py::test` references in text that do not name an existing test."""
    missing = []
    for file, name in TEST_REF.findall(text):
        path = ROOT / file
        if not path.is_file() or name not in defined_tests(path):
            missing.append(f"{file}::{name}")
    return missing


def missing_test_files(text):
    """The `tests/...py` files named in text that do not exist."""
    return sorted({f for f in TEST_FILE.findall(text) if not (ROOT / f).is_file()})


def missing_code_refs(text):
    """The `npspec/...py::name` references in text that do not resolve to an attribute."""
    missing = []
    for file, dotted in CODE_REF.findall(text):
        try:
            obj = importlib.import_module(file[:-3].replace("/", ".").removesuffix(".__init__"))
            for part in dotted.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            missing.append(f"{file}::{dotted}")
    return missing


def test_the_notes_exist():
    names = {p.name for p in notes()}
    assert {"README.md", "derivation.md", "walkthrough.md", "reading.md"} <= names
    for name in ("derivation.md", "walkthrough.md"):
        assert len(python_blocks((NOTES / name).read_text(encoding="utf-8"))) >= 5, name


@pytest.mark.parametrize("note", [p.name for p in notes()])
def test_note_code_runs(note, monkeypatch):
    """Run the note's ```python blocks in order in one namespace, from the repository root."""
    path = NOTES / note
    blocks = python_blocks(path.read_text(encoding="utf-8"))
    if not blocks:
        pytest.skip(f"{note} has no python blocks")
    monkeypatch.chdir(ROOT)
    namespace = {"__name__": f"notes.{path.stem}"}
    quotes = quoted_outputs(path.read_text(encoding="utf-8"))
    for line, code in blocks:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            # pad so tracebacks point at the note's own line numbers
            exec(compile("\n" * (line - 1) + code, str(path), "exec"), namespace)
        sys.stdout.write(printed.getvalue())
        if line in quotes:
            differs = same_output(quotes[line], printed.getvalue())
            assert differs is None, f"{note}, the block at line {line}: {differs}"


@pytest.mark.parametrize("pattern, missing, at_least", [
    (TEST_REF, missing_test_refs, 30),  # the derivation names its tests; an empty match would pass vacuously
    (CODE_REF, missing_code_refs, 10),  # notes/README.md maps the math to npspec/
    (TEST_FILE, missing_test_files, 30),
], ids=["tests", "code", "test-files"])
def test_references_exist(pattern, missing, at_least):
    total = 0
    for path in [*notes(), ROOT / "README.md"]:
        text = path.read_text(encoding="utf-8")
        assert missing(text) == [], path.name
        total += len(pattern.findall(text))
    assert total >= at_least


def test_every_numbered_claim_names_a_test():
    text = (NOTES / "derivation.md").read_text(encoding="utf-8")
    claims = re.split(r"^## (?=\d+\. )", text, flags=re.M)[1:]
    assert len(claims) == 15  # 0 (notation) + claims 1..14
    for claim in claims[1:]:
        assert TEST_REF.search(claim), claim.splitlines()[0]


# each claim's own words (each occurs in the claim's text): every test the claim cites must use one of them
CLAIM_WORDS = {
    1: ("accept", "residual", "leviathan"),
    2: ("beta", "coupling", "acceptance probability"),
    3: ("sequence", "round", "replay", "draft length"),
    4: ("expected tokens", "alpha"),
    5: ("speedup", "verify cost", "gamma"),
    6: ("greedy", "temperature"),
    7: ("warp", "strict", "softmax"),
    8: ("drafter", "n-gram", "confidence", "schedule", "length"),
    9: ("tree",),
    10: ("block",),
    11: ("rsd", "replacement", "children", "coupling"),
    12: ("traversal",),
    13: ("match", "sum p q", "strict"),
    14: ("ceiling", "lossiness", "lossy"),
}
# the tests each claim must keep citing (more may be cited)
CLAIM_TESTS = {
    1: {"tests/test_derivation.py::test_one_step_law_exact", "tests/test_one_step.py::test_one_step_law"},
    2: {"tests/test_derivation.py::test_beta_is_one_minus_tv",
        "tests/test_derivation.py::test_no_lossless_verifier_keeps_a_draft_more_often_than_beta"},
    3: {"tests/test_derivation.py::test_sequence_law_exact", "tests/test_loop_replay.py::test_every_path_replays_through_the_real_loop"},
    4: {"tests/test_derivation_speedup.py::test_expected_tokens_per_round_exact",
        "tests/test_derivation_speedup.py::test_stats_alpha_counts_rounds_as_the_ratio_of_expectations"},
    5: {"tests/test_derivation_speedup.py::test_speedup_is_leviathan_at_v1", "tests/test_bench_results.py::test_committed_speedups_against_the_model"},
    6: {"tests/test_derivation_warping.py::test_greedy_step_is_target_argmax",
        "tests/test_greedy_identity.py::test_greedy_identity_on_the_shipped_pair"},
    7: {"tests/test_derivation_warping.py::test_unwarped_p_gives_the_unwarped_law",
        "tests/test_derivation_warping.py::test_strict_test_never_accepts_p_zero"},
    8: {"tests/test_drafters_exact.py::test_the_kit_catches_wrong_drafters",
        "tests/test_drafters_exact.py::test_ngram_lookup_keeps_the_target_law_exactly"},
    9: {"tests/test_trees_exact.py::test_a_tree_round_keeps_the_target_law_exactly",
        "tests/test_trees_exact.py::test_the_classic_tree_mistakes_change_the_law"},
    10: {"tests/test_block_verify.py::test_block_verification_keeps_the_target_law_on_every_small_case",
         "tests/test_block_verify.py::test_the_kit_catches_wrong_block_verifiers"},
    11: {"tests/test_tree_rules.py::test_an_rsd_tree_round_keeps_the_target_law_exactly",
         "tests/test_tree_rules.py::test_mixing_the_two_drafters_changes_the_law"},
    12: {"tests/test_traversal.py::test_a_traversal_round_keeps_the_target_law_exactly",
         "tests/test_traversal.py::test_on_a_chain_the_law_is_block_verifications_draft_by_draft"},
    13: {"tests/test_exact_match.py::test_exact_match_keeps_the_target_law_on_every_small_case",
         "tests/test_exact_match.py::test_a_draft_is_kept_with_probability_sum_p_q_exactly"},
    14: {"tests/test_gap.py::test_every_rule_keeps_at_most_its_ceiling_in_a_whole_tree",
         "tests/test_lossiness.py::test_lossiness_is_exactly_zero_for_npspecs_rules_stated_in_fractions"},
}


def claims_by_number():
    text = (NOTES / "derivation.md").read_text(encoding="utf-8")
    return {int(c.split(".")[0]): c for c in re.split(r"^## (?=\d+\. )", text, flags=re.M)[1:]}


def source_of_test(file, name):
    """A test function's source, decorators included, lower case, with _ and - read as spaces."""
    text = (ROOT / file).read_text(encoding="utf-8")
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            return "\n".join(text.splitlines()[first - 1:node.end_lineno]).lower().replace("_", " ").replace("-", " ")
    raise KeyError(f"{file}::{name}")


def off_topic_citations(number, claim):
    """The tests a claim cites whose source uses none of the claim's words (CLAIM_WORDS)."""
    words = [w.replace("-", " ") for w in CLAIM_WORDS[number]]
    return [f"{file}::{name}" for file, name in sorted(set(TEST_REF.findall(claim)))
            if not any(w in source_of_test(file, name) for w in words)]


def test_each_claims_tests_check_that_claim():
    claims = claims_by_number()
    assert set(claims) == {0, *CLAIM_WORDS} and set(CLAIM_TESTS) == set(CLAIM_WORDS)
    for number, claim in claims.items():
        if not number:
            continue
        low = claim.lower()
        assert all(w in low for w in CLAIM_WORDS[number]), (number, [w for w in CLAIM_WORDS[number] if w not in low])
        assert off_topic_citations(number, claim) == [], f"claim {number} cites tests that use none of its words"
        cited = {f"{file}::{name}" for file, name in TEST_REF.findall(claim)}
        assert CLAIM_TESTS[number] <= cited, f"claim {number} no longer cites {sorted(CLAIM_TESTS[number] - cited)}"


def test_a_test_cited_under_the_wrong_claim_is_found():
    wrong = "## 9. Trees\nsee `tests/test_derivation_warping.py::test_temperature_limit`\n"
    assert off_topic_citations(9, wrong) == ["tests/test_derivation_warping.py::test_temperature_limit"]
    right = "## 6. Greedy\nsee `tests/test_derivation_warping.py::test_temperature_limit`\n"
    assert off_topic_citations(6, right) == []


def test_the_reference_checks_can_fail():
    assert missing_test_refs("see tests/test_derivation.py::test_no_such_thing") == \
        ["tests/test_derivation.py::test_no_such_thing"]
    assert missing_test_refs("tests/test_nowhere.py::test_x and tests/test_notes.py::test_the_notes_exist") == \
        ["tests/test_nowhere.py::test_x"]
    assert missing_code_refs("npspec/decode/sampling.py::residual, npspec/decode/sampling.py::no_such") == \
        ["npspec/decode/sampling.py::no_such"]
    assert missing_test_files("tests/test_notes.py and tests/test_nowhere.py") == ["tests/test_nowhere.py"]
    assert python_blocks("a\n```python\nx = 1\n```\n```text\ny\n```\n") == [(3, "x = 1\n")]
    assert quoted_outputs("```python\nprint(1)\n```\n\n```output\n1\n```\n```python\nx\n```\n") == {2: "1\n"}


def test_the_output_check_can_fail():
    assert same_output("beta = 0.700 after 12 rounds\n", "beta = 0.7003 after 12 rounds  \n") is None
    assert same_output("p 0.500, ~812 tokens/s\n", "p 0.501, 97 tokens/s\n") is None  # ~: a timing
    assert "text differs" in same_output("kept 3\n", "rejected 3\n")
    assert same_output("[0.5   0.3]\n", "[0.5 0.3]\n") is None and "text differs" in same_output("a b\n", "ab\n")
    assert "integer" in same_output("ids [5, 7]\n", "ids [5, 8]\n")
    assert "tolerance" in same_output("alpha 0.640\n", "alpha 0.650\n")
    assert "text differs" in same_output("1 2 3\n", "1 2\n")
    assert "tolerance" in same_output("x 1e-80\n", "x 3e-80\n") and "tolerance" in same_output("r 120.0\n", "r 121.0\n")
    assert same_output("p 0.0028\n", "p 0.0029\n") is None and "tolerance" in same_output("p 0.0028\n", "p 0.0048\n")
    assert same_output("v 1.48\n", "v 1.49\n") is None and "tolerance" in same_output("v 1.48\n", "v 1.50\n")

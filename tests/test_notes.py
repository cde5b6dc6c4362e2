"""notes/ and README.md cannot drift: the notes' code runs, and every test, test file or function they name exists.

* Every ```python block of a note runs, in order, in one namespace per note (a small markdown
  runner); a failing block fails here with the note's own line numbers in the traceback.
  Blocks check values with asserts.
* A ```output block right after a ```python block quotes what that block prints, and must match it
  (`same_output`): the text exactly (runs of spaces and trailing spaces aside, so that column
  alignment may shift), integers exactly, numbers with a decimal
  point or an exponent within 0.002 absolute or 0.5% relative (the last printed digit may change
  with the BLAS build), and a number written `~123` in the quote (a timing) is not compared.
* Every `tests/<file>.py::<test>` reference in notes/*.md names a test function defined in that
  file, and every numbered claim of derivation.md names at least one.
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
ABS_TOL, REL_TOL = 0.002, 0.005


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
        elif abs(float(p) - float(q)) > max(ABS_TOL, REL_TOL * abs(float(q))):
            return f"{p} printed where the quote says {q} (tolerance {ABS_TOL} or {REL_TOL:.1%})"
    return None


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
    assert len(claims) == 12  # 0 (notation) + claims 1..11
    for claim in claims[1:]:
        assert TEST_REF.search(claim), claim.splitlines()[0]


def test_the_reference_checks_can_fail():
    assert missing_test_refs("see tests/test_derivation.py::test_no_such_thing") == \
        ["tests/test_derivation.py::test_no_such_thing"]
    assert missing_test_refs("tests/test_nowhere.py::test_x and tests/test_notes.py::test_the_notes_exist") == \
        ["tests/test_nowhere.py::test_x"]
    assert missing_code_refs("npspec/sampling.py::residual, npspec/sampling.py::no_such") == \
        ["npspec/sampling.py::no_such"]
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
    assert same_output("x 1e-80\n", "x 3e-80\n") is None and "tolerance" in same_output("r 120.0\n", "r 121.0\n")

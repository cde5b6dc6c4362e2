"""notes/ and README.md cannot drift: the notes' code runs, and every test, test file or function they name exists.

* Every ```python block of a note runs, in order, in one namespace per note (a small markdown
  runner); a failing block fails here with the note's own line numbers in the traceback.
  Blocks check values with asserts; what they print is for the reader.
* Every `tests/<file>.py::<test>` reference in notes/*.md names a test function defined in that
  file, and every numbered claim of derivation.md names at least one.
* Every `npspec/<module>.py::<name>` reference names an attribute that exists (`Stats.alpha` too).
* Every `tests/<file>.py` that notes/*.md or README.md names exists.
"""

import ast
import importlib
import re
from functools import lru_cache

import pytest

from conftest import ROOT

NOTES = ROOT / "notes"
TEST_REF = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
TEST_FILE = re.compile(r"tests/[\w/]+\.py")
CODE_REF = re.compile(r"(npspec/[\w/]+\.py)::([\w.]+)")
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def notes():
    return sorted(NOTES.glob("*.md"))


def python_blocks(text):
    """[(first line number of the code, code)] of every ```python block, in order."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in FENCE.finditer(text)]


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
    for line, code in blocks:
        # pad so tracebacks point at the note's own line numbers
        exec(compile("\n" * (line - 1) + code, str(path), "exec"), namespace)


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
    assert len(claims) == 8  # 0 (notation) + claims 1..7
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

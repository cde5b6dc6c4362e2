"""The code's layout rules, checked on the source: npspec/ in a few wings whose imports run one way, short
functions, no hasattr dispatch outside the kit, and npspec.decode reaching models only through its protocols (it
imports GPT-2's ContextOverflowError, never Model, files or sources)."""

import ast
from pathlib import Path

import pytest

from npspec.decode import Drafter, Forwarder, TreeForwarder
from npspec.decode.drafters import (ControlledDraft, ControlledLookup, DynamicTreeDrafter, ModelDrafter, NgramDrafter,
                                    TreeDrafter)

from conftest import tiny_model

NPSPEC = Path(__file__).resolve().parent.parent / "npspec"
MAX_BODY = 60
DECODE_MAY_IMPORT = {"npspec.model.gpt2"}
WINGS = ("kernels", "model", "decode", "sources", "cli", "testing")  # each imports only the wings before it
TOP = {"__init__.py", "generate.py", *WINGS}  # generate.py: `python -m npspec.generate`, README's name for the command


def functions(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def body_lines(fn):
    """Lines of a function's body, its docstring excluded."""
    body = fn.body[1:] if ast.get_docstring(fn) is not None and len(fn.body) > 1 else fn.body
    return body[-1].end_lineno - body[0].lineno + 1


def test_no_function_has_more_than_60_lines_of_body():
    long = [f"{path.relative_to(NPSPEC.parent)}:{fn.lineno} {fn.name} ({body_lines(fn)} lines)"
            for path in sorted(NPSPEC.rglob("*.py")) for fn in functions(path) if body_lines(fn) > MAX_BODY]
    assert not long, f"functions over {MAX_BODY} lines of body (split them): {long}"


def test_no_function_takes_a_note_callback():
    """Notes go through the "npspec" loggers (the commands print them on stderr), never a `note` parameter."""
    noted = [f"{path.relative_to(NPSPEC.parent)}:{fn.lineno} {fn.name}" for path in sorted(NPSPEC.rglob("*.py"))
             for fn in functions(path) for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
             if a.arg == "note"]
    assert not noted, f"functions with a `note` parameter (log with logging.getLogger(__name__) instead): {noted}"


def test_no_hasattr_dispatch_outside_the_kit():
    calls = [f"{path.relative_to(NPSPEC.parent)}:{node.lineno}" for path in sorted(NPSPEC.rglob("*.py"))
             if "testing" not in path.parts for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hasattr"]
    assert not calls, f"hasattr outside npspec/testing (declare it in a typing.Protocol instead): {calls}"


def imported(path):
    """The npspec modules a file imports (relative imports resolved)."""
    package = ".".join(path.relative_to(NPSPEC.parent).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[:len(package.split(".")) - node.level + 1]
            yield ".".join(base + ([node.module] if node.module else []))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("npspec"):
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("npspec"))


def test_npspec_is_a_few_wings():
    entries = {p.name for p in NPSPEC.iterdir() if p.name != "__pycache__"}
    assert entries == TOP, f"npspec/ holds {sorted(entries)}; a new module belongs in one of the wings {WINGS}"
    assert len(entries) <= 8


def wing_of(module):  # "npspec.kernels.compiled" -> "kernels"; "npspec" -> None
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in WINGS else None


def test_wings_import_one_way():
    """A wing imports only the wings listed before it in WINGS (the math at the bottom, the commands on top)."""
    upward = sorted({f"{path.relative_to(NPSPEC.parent)} imports {module}"
                     for wing in WINGS for path in (NPSPEC / wing).rglob("*.py") for module in imported(path)
                     if wing_of(module) and WINGS.index(wing_of(module)) > WINGS.index(wing)})
    assert not upward, f"imports against the wings' order {WINGS}: {upward}"


def test_every_wing_opens_with_what_it_holds():
    missing = [wing for wing in WINGS if not ast.get_docstring(ast.parse((NPSPEC / wing / "__init__.py").read_text()))]
    assert not missing, f"wings without a docstring in __init__.py: {missing}"


def test_decode_imports_only_the_math():
    outside = {f"{path.relative_to(NPSPEC.parent)} imports {module}"
               for path in sorted((NPSPEC / "decode").rglob("*.py")) for module in imported(path)
               if not module.startswith("npspec.decode") and module not in DECODE_MAY_IMPORT}
    assert not outside, f"npspec.decode reaches models through its protocols only: {sorted(outside)}"


def test_gpt2_is_imported_by_decode_for_its_error_only():
    for path in (NPSPEC / "decode").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in ("model.gpt2", "npspec.model.gpt2"):
                assert [a.name for a in node.names] == ["ContextOverflowError"], path


@pytest.fixture(scope="module")
def drafters():
    draft = tiny_model(1, "draft")
    return [ModelDrafter(draft), NgramDrafter(67), TreeDrafter(draft, (2, 1)), DynamicTreeDrafter(draft, 3),
            ControlledLookup(67, None, [0, 1], 0.5, None), ModelDrafter(ControlledDraft(draft, [0, 1], 0.5, None))]


def test_every_drafter_implements_the_protocol_and_every_model_the_forwarder(drafters):
    assert all(isinstance(d, Drafter) for d in drafters)
    assert [d.tree for d in drafters] == [False, False, True, True, False, False]
    target = tiny_model()
    assert isinstance(target, TreeForwarder) and isinstance(ControlledDraft(target, [0], 0.5, None), Forwarder)
    assert not isinstance(target, Drafter) and not isinstance(NgramDrafter(3), Forwarder)

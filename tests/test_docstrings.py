"""Docstrings say what, not how we got here: a module's in at most 15 lines (what it holds, its contract, what it
imports), a function's or class's in at most 10 (shapes, units, errors, the source), and all of them at most 15% of
npspec/'s lines. Measured history belongs with the results that measured it (bench/results/, notes/kernels.md)."""

import ast
from pathlib import Path

NPSPEC = Path(__file__).resolve().parent.parent / "npspec"
MODULE_LINES, FUNCTION_LINES, SHARE = 15, 10, 0.15


def docstrings(source):  # -> [(kind, name, line, length in lines)] of a module's source
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                kind = "module" if isinstance(node, ast.Module) else "function"
                found.append((kind, getattr(node, "name", "(module)"), first.lineno, first.end_lineno - first.lineno + 1))
    return found


def too_long(source):  # -> ["NAME:LINE (N lines)"] of the docstrings over their limit
    return [f"{name}:{line} ({n} lines)" for kind, name, line, n in docstrings(source)
            if n > (MODULE_LINES if kind == "module" else FUNCTION_LINES)]


def test_every_docstring_is_within_its_limit():
    long = {str(p.relative_to(NPSPEC.parent)): found for p in sorted(NPSPEC.rglob("*.py"))
            if (found := too_long(p.read_text(encoding="utf-8")))}
    assert not long, f"docstrings over {MODULE_LINES} (module) or {FUNCTION_LINES} (function) lines: {long}"


def test_docstrings_are_at_most_15_percent_of_the_code():
    sources = [p.read_text(encoding="utf-8") for p in NPSPEC.rglob("*.py")]
    share = sum(n for s in sources for *_, n in docstrings(s)) / sum(len(s.splitlines()) for s in sources)
    assert share <= SHARE, f"docstrings are {share:.1%} of npspec/'s lines (at most {SHARE:.0%})"


def test_the_limits_can_fail():
    planted = '"""' + "\n" * 15 + '"""\n\n\ndef f():\n    """' + "\n" * 10 + '"""\n\n\ndef g():\n    """ok."""\n'
    assert too_long(planted) == ["(module):1 (16 lines)", "f:20 (11 lines)"]

"""README.md as a reference: its option table names every option `npspec generate` has, its layout names every wing
of npspec/ in import order, its table of bug classes is the kit's own (npspec.testing.zoo_table()), and its
reference sections (Quick start to the end, that generated table aside) fit in REFERENCE_LINES lines.
The synopsis is test_cli.py's, the troubleshooting table test_cli.py's and test_hostile_cli.py's, the Performance
section and the introduction's figures test_bench_report.py's."""

import re

from npspec.testing import BUGS, zoo_table

from conftest import ROOT, run_python
from test_layout import WINGS

README = ROOT / "README.md"
REFERENCE_LINES = 450


def section(text, title):
    """The text of README's `## title` section, up to the next `## `."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def options(help_text):
    """The long options a --help output lists (--help itself aside)."""
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", help_text)) - {"--help"}


def table_options(text):
    """The long options the first cell of each row of the command line's option table names."""
    rows = [line.split(" | ")[0] for line in section(text, "The command line").splitlines() if line.startswith("| `")]
    return {o for cell in rows for o in re.findall(r"--[a-z][a-z-]*", cell)}


def test_the_option_table_names_every_option_of_generate():
    text = README.read_text(encoding="utf-8")
    parsed = options(run_python("-m", "npspec.generate", "--help").stdout)
    assert {"--verify", "--kernel-probe", "--compare-repeats"} <= parsed  # the help was read
    assert parsed <= table_options(text), parsed - table_options(text)


def test_the_option_check_can_fail():
    text = "\n## The command line\n| option | default |\n| `--gamma` | 4 |\n| `--top-k` / `--top-p` | 0 |\n## Next\n"
    assert table_options(text) == {"--gamma", "--top-k", "--top-p"}
    assert options("  --gamma GAMMA  draft tokens (--no-such in prose too)\n  -h, --help\n") == {"--gamma", "--no-such"}


def test_the_layout_names_each_wing_in_import_order():
    layout = section(README.read_text(encoding="utf-8"), "Layout")
    rows = re.findall(r"^\| `([\w/]+)/` \|", layout, re.M)
    assert [r.split("/")[1] for r in rows if r.startswith("npspec/")] == list(WINGS)
    assert {"tests", "bench", "notes", "weights"} <= set(rows)


ZOO = re.compile(r"<!-- zoo:start -->\n(.*?)<!-- zoo:end -->\n", re.S)


def zoo_block(text):
    """The text between README's zoo markers (exactly one pair), without its final newline."""
    blocks = ZOO.findall(text)
    assert len(blocks) == 1, f"README holds {len(blocks)} zoo tables, not one"
    return blocks[0].rstrip("\n")


def test_the_bug_table_is_the_kits_own_list():
    assert zoo_block(README.read_text(encoding="utf-8")) == zoo_table(), \
        "README's bug table differs from npspec.testing.zoo_table(): paste its output between the zoo markers"
    assert zoo_table().count("\n| `") == len(BUGS)


def test_the_bug_table_check_can_fail():
    text = f"x\n<!-- zoo:start -->\n{zoo_table()}\n<!-- zoo:end -->\ny"
    assert zoo_block(text) == zoo_table()
    assert zoo_block(text.replace("vLLM 47386", "vLLM 1")) != zoo_table()


def test_the_reference_sections_fit():
    text = ZOO.sub("", README.read_text(encoding="utf-8"))
    reference = text[text.index("\n## Quick start\n"):].strip("\n").splitlines()
    assert len(reference) <= REFERENCE_LINES, f"README's reference sections hold {len(reference)} lines"

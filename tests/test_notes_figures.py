"""notes/ quote the runs in bench/results/ as they are: a figure test that checks every citation and can fail.

* No note names `bench/results/earlier/` (the earlier runs are history nothing quotes), and every
  decimal figure in a paragraph of prose that cites a results file (its path under `bench/results/`, any folder
  deep; or its bare name `NAME.md`, `NAME.csv`, `NAME.json`, looked up in the folders of the paragraph's own paths,
  then in `bench/results/`, then in the one folder of QUOTED that holds it) is a number of one of those files, at
  the digits quoted (`figures_not_in_files`): a figure that drifts from the run fails, and so does a
  `bench/results/` path that names no file. Figures derived from the files are printed by a block instead, where
  the output check holds them. A planted wrong figure in every quoting paragraph must fail the check.
"""

import re
from functools import lru_cache

import pytest

from conftest import ROOT
from test_notes import NOTES, NUMBER, last_digit, notes

RESULTS = ROOT / "bench" / "results"
QUOTED = ("run_all-xeon-spr", "quantized-epyc", "verification-epyc")  # the runs a bare file name may name
# a results file: its path under bench/results/ (`bench/results/run_all-xeon-spr/speedup.md`), or its bare name
RESULT_REF = re.compile(r"(?<![\w/.-])(bench/results/(?:[\w.-]+/)*[\w.-]+\.(?:md|csv|json|log|txt)|[\w-]+\.(?:md|csv|json))\b")
VERSION = re.compile(r"\d+(?:\.\d+){2,}")  # 0.3.31, 2.4.6: versions, not figures
ARXIV = re.compile(r"arXiv[: ]?\d{4}\.\d{4,5}", re.I)  # a paper's number, not a figure
FIGURE = re.compile(r"(?<![\w.])-?\d*\.\d+(?!\.\d|[A-Za-wyz_])")  # a decimal, 1.26x too, not part of a name



def prose_paragraphs(text):
    """[(first line number, paragraph)] of a note's prose: code blocks (``` fences) left out, blank lines and list
    items split (each item of a list is its own paragraph)."""
    out, start, lines, fenced = [], None, [], False
    for number, line in enumerate(text.splitlines() + [""], 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if lines and re.match(r"\s*(?:[-*]|\d+\.) ", line):
            out.append((start, "\n".join(lines)))
            start, lines = None, []
        if line.strip():
            start = start or number
            lines.append(line)
        elif lines:
            out.append((start, "\n".join(lines)))
            start, lines = None, []
    return out


def resolve(name, results=RESULTS, folders=()):
    """The file a citation names: a `bench/results/...` path as written; a bare NAME in one of `folders` (those of the
    paragraph's own paths), else results/NAME, else the one QUOTED run holding it; None if none does."""
    if name.startswith("bench/results/"):
        path = results / name.removeprefix("bench/results/")
        return path if path.is_file() else None
    for folder in folders:
        if (folder / name).is_file():
            return folder / name
    if (results / name).is_file():
        return results / name
    found = [results / folder / name for folder in QUOTED if (results / folder / name).is_file()]
    return found[0] if len(found) == 1 else None


@lru_cache(maxsize=None)
def file_numbers(path):
    """Every number written in the file at `path` and in its table's other form (NAME.csv for NAME.md and back)."""
    stem = path.with_suffix("")
    found = [p for p in (path, stem.with_suffix(".csv"), stem.with_suffix(".md")) if p.is_file()]
    text = "\n".join(p.read_text(encoding="utf-8") for p in dict.fromkeys(found))
    return [float(x.lstrip("~")) for x in NUMBER.findall(VERSION.sub(" ", text))]


def cited_files(paragraph, results=RESULTS):
    """(the results files a paragraph cites, the `bench/results/` paths it cites that name no file)."""
    names = list(dict.fromkeys(RESULT_REF.findall(paragraph)))
    paths = [n for n in names if n.startswith("bench/results/")]
    folders = [f.parent for p in paths if (f := resolve(p, results))]
    files = {n: resolve(n, results, folders) for n in names}
    return [f for f in dict.fromkeys(files.values()) if f], [n for n in paths if not files[n]]


def figures_not_in_files(paragraph, results=RESULTS):
    """The decimal figures of a prose paragraph that cites results files and that none of those files holds at the
    digits quoted, and every `bench/results/` path it cites that names no file ([] if it cites none: such a
    paragraph quotes no run)."""
    files, gone = cited_files(paragraph, results)
    if not files:
        return gone
    numbers = [x for path in files for x in file_numbers(path)]
    missing = list(gone)
    for figure in FIGURE.findall(VERSION.sub(" ", ARXIV.sub(" ", re.sub(r"`[^`]*`", " ", paragraph)))):
        unit = last_digit(figure) / 2
        if not any(abs(abs(x) - abs(float(figure))) <= unit for x in numbers):
            missing.append(figure)
    return missing


def test_no_note_quotes_an_earlier_run():
    for path in notes():
        assert "results/earlier" not in path.read_text(encoding="utf-8"), path.name


@pytest.mark.parametrize("note", [p.name for p in notes()])
def test_the_figures_a_paragraph_quotes_are_in_the_results_files_it_cites(note):
    """Every decimal in a prose paragraph that names a bench/results file is one of that file's numbers (module docstring)."""
    drifted = [(line, figures) for line, paragraph in prose_paragraphs((NOTES / note).read_text(encoding="utf-8"))
               if (figures := figures_not_in_files(paragraph))]
    assert drifted == [], f"{note}: (line, figures in no cited file): {drifted}"


def test_the_figure_check_can_fail(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "speedup.csv").write_text("# numpy: 2.4.6\ngamma,speedup\n1,1.2649\n2,0.9837\n", encoding="utf-8")
    (tmp_path / "run" / "speedup.md").write_text("| gamma | speedup |\n| 1 | 1.26 |\n", encoding="utf-8")
    def check(text):  # R/ stands for the results folder (so that this file cites no results path)
        return figures_not_in_files(text.replace("R/", "bench/" "results/"), tmp_path)
    assert check("`R/run/speedup.md`: 1.26x, 1.265x and 0.98x at gamma 2 (numpy 2.4.6)") == []
    assert check("(R/run/speedup.csv): 1.27x, 0.984x, 0.983x, 1.2x, 2.4 and 0.9837") == \
        ["1.27", "0.983", "1.2", "2.4"]
    assert check("`R/run/speedup.md`, then `speedup.csv` in the same folder: 1.27x") == ["1.27"]
    assert check("`R/gone/speedup.md`: 1.26x") == ["bench/" "results/gone/speedup.md"]  # names no file
    assert check("no file cited: 1.27x") == [] and check("`README.md` (not in the folder): 1.27x") == []
    (tmp_path / "quantized-epyc").mkdir()  # a bare name found in one of the QUOTED runs: that run's file
    (tmp_path / "quantized-epyc" / "beta.csv").write_text("scheme,beta\nint4,0.912\n", encoding="utf-8")
    assert check("`beta.csv`: 0.912 and 0.913") == ["0.913"]
    assert check("`R/quantized-epyc/beta.csv` (arXiv:2305.09781): 0.912") == []
    assert prose_paragraphs("a 1.5\n\n```python\nx = 2.5\n```\nb\nc 3.5\n") == [(1, "a 1.5"), (6, "b\nc 3.5")]
    assert prose_paragraphs("- a 1.5\n  b\n- c\n1. d\n") == [(1, "- a 1.5\n  b"), (3, "- c"), (4, "1. d")]


def quoting_paragraphs():
    """[(note, line, paragraph)] of every prose paragraph of notes/ that cites a results file and quotes a figure."""
    return [(path.name, line, paragraph) for path in notes()
            for line, paragraph in prose_paragraphs(path.read_text(encoding="utf-8"))
            if cited_files(paragraph)[0] and FIGURE.search(VERSION.sub(" ", re.sub(r"`[^`]*`", " ", paragraph)))]


def test_a_planted_wrong_figure_in_a_note_fails_the_check():
    """Every paragraph that quotes a run: one of its figures, moved off every number of its cited files, is caught."""
    quoting = quoting_paragraphs()
    assert len(quoting) >= 8 and {"derivation.md", "walkthrough.md", "quantized.md"} <= {n for n, _, _ in quoting}
    for note, line, paragraph in quoting:
        prose = re.sub(r"`[^`]*`", lambda m: " " * len(m.group(0)), paragraph)  # figures in code spans are not quoted
        figure = next(m for m in FIGURE.finditer(prose) if not VERSION.match(prose, m.start()))
        numbers = [x for path in cited_files(paragraph)[0] for x in file_numbers(path)]
        wrong = next(f"{float(figure.group(0)) + k * 0.37:.2f}" for k in range(1, 999)
                     if not any(abs(abs(x) - abs(float(figure.group(0)) + k * 0.37)) < 0.01 for x in numbers))
        planted = paragraph[:figure.start()] + wrong + paragraph[figure.end():]
        assert wrong in figures_not_in_files(planted), (note, line, wrong)

"""bench.figures: each picture notes/ cite is drawn by its command, and each is cited where it teaches.

* `python -m bench.figures NAME --out DIR` writes DIR/NAME.png for every NAME (a PNG), from committed tables only.
* Every notes/figures/NAME.png is committed, and a note cites it as `figures/NAME.png` together with the command
  `python -m bench.figures NAME` in the next paragraph.
* The quantized picture's law: C / qmax(b) fitted from 3 to 8 bits lies within 15% of every point it was fitted to
  (the tolerance of notes/quantized.md), and the 2-bit point lies above it (where the first-order law ends).
"""

import re

import pytest

from bench import figures

from conftest import ROOT

pytest.importorskip("matplotlib")
NOTES = ROOT / "notes"


def test_every_figure_draws(tmp_path):
    assert figures.main(["--out", str(tmp_path)]) == 0
    for name in figures.NAMES:
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_each_committed_figure_is_cited_with_its_command():
    text = {p.name: p.read_text(encoding="utf-8") for p in NOTES.glob("*.md")}
    for name in figures.NAMES:
        assert (NOTES / "figures" / f"{name}.png").is_file(), name
        cites = [(note, m.end()) for note, t in text.items() for m in re.finditer(rf"\(figures/{name}\.png\)", t)]
        assert cites, f"no note shows figures/{name}.png"
        assert any(f"python -m bench.figures {name}`" in text[note][at:at + 1200] for note, at in cites), name


def test_the_quantized_law_fits_three_to_eight_bits_and_ends_at_two():
    for column in ("beta_t1.0", "beta_greedy"):
        points, c = figures.quantized_points(column=column)
        assert [b for b, _ in points] == [2, 3, 4, 5, 6, 8]
        for bits, lost in points:
            if bits >= 3:
                assert abs(lost * figures.qmax(bits) / c - 1) < 0.15, (column, bits)
        assert points[0][1] > 1.15 * c / figures.qmax(2)  # 2 bits: above the line (1.59 and 1.17 of it)

"""bench.figures: each picture notes/ cite is drawn by its command, and each is cited where it teaches.

* `python -m bench.figures NAME --out DIR` writes DIR/NAME.png for every NAME (a PNG), from committed tables only.
* Every notes/figures/NAME.png is committed, and a note cites it as `figures/NAME.png` together with the command
  `python -m bench.figures NAME` in the next paragraph.
* The quantized picture's law: C / qmax(b) fitted from 3 to 8 bits lies within 15% of every point it was fitted to
  (the tolerance of notes/quantized.md), and the 2-bit point lies above it (where the first-order law ends).
* The gap picture holds every row of the committed exact tables, each rule at or below its ceiling, and the kit's own
  tree_gap gives the same fractions (Sun et al.'s rows, tree 2,1).
* The verify curves, in notes/figures/verify.png and in bench.verify_cost's plot alike, divide each kernel by its OWN
  t(1) (the `v` column, not `vs_ar`), and draw compiled-panels' max(1, M / M*) only where the run timed it;
  `python -m bench.verify_cost --replot --out FOLDER` redraws a committed run's plot from its CSV, timing nothing.
"""

import re
from fractions import Fraction as F

import numpy as np
import pytest

from bench import common, figures, verify_cost
from bench.report import curves_of, verify_curves
from npspec.testing import constant_table
from npspec.testing.gap import GAP_RULES, tree_gap

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


def test_the_gap_picture_is_the_exact_tables_and_the_kits_fractions():
    node, tree = figures.gap_points("gap_node"), figures.gap_points("gap_tree")
    assert set(node) == set(GAP_RULES) and set(tree) == {*GAP_RULES, "block verification (chain)"}
    for table, points in (("gap_node", node), ("gap_tree", tree)):
        rows, _ = common.read_table(figures.GAP / f"{table}.csv")
        assert sum(map(len, points.values())) == len(rows) > 0, table
        assert all(0 < kept <= ceiling for rule in points.values() for _, kept, ceiling in rule), table
    sun = {rule: (kept, ceiling) for rule, rows in tree.items() for label, kept, ceiling in rows
           if label == "Sun et al.'s two tokens, tree 2,1"}
    p, q = constant_table([F(1, 3), F(2, 3)]), constant_table([F(2, 3), F(1, 3)])
    assert sun == {name: (kept, bound) for name, kept, bound in tree_gap(p, q, (2, 1))}
    assert sun["traversal (without replacement)"] == (F(16, 9), F(17, 9))  # claim 14's example


def verify_rows(kernels, m_star=None):  # bench.verify_cost.measure's rows: v against the kernel's own t(1), vs_ar not
    return [{"model": "random:gpt2", "threads": 1, "layout": "column-major", "kernel": k, "M": m, "v": v ** (m - 1),
             "vs_ar": 9.0, "roofline_v": 1.0, **({"panels_m_star": m_star} if m_star else {})}
            for k, v in kernels.items() for m in (1, 2, 3)]


def test_the_verify_axes_draw_each_kernels_own_v_and_the_compiled_roofline_only_where_timed():
    plt = common.pyplot()
    for m_star, extra in ((None, 0), (2.0, 2)):  # the compiled roofline, and M* marked
        fig, ax = plt.subplots()
        figures.verify_axes(ax, curves_of(verify_rows({"gemm": 1.5, "compiled-panels": 1.25}, m_star)), m_star)
        lines = {line.get_label(): list(line.get_ydata()) for line in ax.lines}
        assert len(lines) == 3 + extra
        assert lines["gemm"] == [1.0, 1.5, 2.25] and lines["compiled-panels"] == [1.0, 1.25, 1.5625]
        if m_star:
            assert np.allclose(next(v for k, v in lines.items() if "M*" in k), [1.0, 1.0, 1.5])
            assert any(list(line.get_xdata()) == [2.0, 2.0] for line in ax.lines)
        plt.close(fig)


@pytest.mark.filterwarnings("ignore:No artists with labels")  # the stand-in axes draw nothing
def test_verify_costs_plot_draws_v_per_panel_with_the_shared_axes(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(verify_cost, "verify_axes", lambda ax, curves, m_star: drawn.append((curves, m_star)))
    rows = verify_rows({"gemv-panels": 2.0}, 3.5) + [dict(r, threads=2) for r in verify_rows({"gemm": 1.5})]
    assert verify_cost.plot(rows, tmp_path / "verify_cost.png") == tmp_path / "verify_cost.png"
    assert drawn == [({("column-major", "gemv-panels"): [1.0, 2.0, 4.0], "roofline": [1.0] * 3}, 3.5),
                     ({("column-major", "gemm"): [1.0, 1.5, 2.25], "roofline": [1.0] * 3}, None)]


@pytest.mark.filterwarnings("ignore:No artists with labels")
def test_replot_redraws_a_committed_run_from_its_csv_with_the_compiled_kernel(tmp_path, monkeypatch):
    (tmp_path / "verify_cost.csv").write_bytes((figures.VERIFY_RUN / "verify_cost.csv").read_bytes())
    drawn = []
    monkeypatch.setattr(verify_cost, "verify_axes", lambda ax, curves, m_star: drawn.append((curves, m_star)))
    monkeypatch.setattr(verify_cost, "measure", None)  # --replot times nothing
    assert verify_cost.main(["--replot", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "verify_cost.png").read_bytes()[:4] == b"\x89PNG"
    large = verify_curves("random:gpt2-large", 2, figures.VERIFY_RUN)[0]
    assert len(drawn) == 4 and drawn[-1][0] == large and ("column-major", "compiled-panels") in large
    assert all(float(m_star) > 1 for _, m_star in drawn)

"""bench.report: the README's Performance section and bench/results/README.md's tables, generated from one run's
folder; the speedup model set beside each measured row; the introduction's figures and the drafters' targets."""

import json
import shutil

import pytest

from bench import common
from bench.common import RESULTS
from bench.report import (END, README, RESULTS_README, ROOT, START, drafter_targets, found, headline, main, rewrite,
                          section, shown, source, speedup_model_check)

from conftest import run_python

RUN = RESULTS / "run_all-xeon-spr"  # the newest whole run_all.sh run, the one README quotes


def test_report_reads_old_and_new_result_names_alike(tmp_path):
    """Results written before the kernels were named (strategy rows/panels, layouts C/panel) report like new ones."""
    meta = {"date": "2026-01-01 00:00 UTC", "machine": "m", "load_average_1min_at_start": "0.5"}
    names = {("C", "rows"): ("row-major", "gemv-rows"), ("C", "gemm"): ("row-major", "gemm"),
             ("panel", "panels"): ("column-major", "gemv-panels"),
             ("panel", "panels-gemm"): ("column-major", "gemm-panels")}
    old_rows, new_rows = [], []
    for i, ((layout, strategy), (new_layout, kernel)) in enumerate(names.items()):
        figures = {"model": "random:gpt2", "threads": 1, "t1_ms": 10 + i, "v5": 1.5 + i, "roofline_v5": 1.0}
        old_rows.append({"layout": layout, "strategy": strategy, **figures})
        new_rows.append({"layout": new_layout, "kernel": kernel, **figures})
    old, new = tmp_path / "old", tmp_path / "new"
    for folder, rows in ((old, old_rows), (new, new_rows)):
        folder.mkdir()
        common.write_table(folder, "verify_cost_summary", rows, meta, "Verify cost summary")
    assert section(old).replace(shown(old), shown(new)) == section(new)  # each names its own folder
    # columns: gemv-panels, gemv-rows (row-major), gemm (row-major); gemm-panels is not reported
    assert "| gpt2 | 12.00 | 10.00 | 11.00 | 3.50 | 1.50 | 2.50 | 1.00 |" in section(new)


def test_speedup_model_check_applies_the_library_model_to_each_row(tmp_path):
    """Each row's own alpha, gamma, c and v go through npspec.decode.evaluate.predicted_speedup; cost_only uses the row's
    measured tokens per round. Pinned on two hand-made rows whose answers are known."""
    rows = [{"target": "t", "draft": "d", "acceptance": "real", "a": "", "gamma": 1, "alpha": 0.5,
             "tokens_per_round": 1.5, "speedup": 0.9, "c": 0.5, "v": 1.0},  # 1.5 / (1 * 0.5 + 1) = 1
            {"target": "t", "draft": "d", "acceptance": "controlled", "a": 0.7, "gamma": 4, "alpha": 1.0,
             "tokens_per_round": 4.0, "speedup": 2.0, "c": 0.25, "v": 1.5}]  # 5 / 2.5 = 2; measured 4 / 2.5
    common.write_table(tmp_path, "speedup", rows, {"date": "d"}, "t")
    one, two = speedup_model_check(tmp_path)
    assert (one["model"], one["cost_only"], one["measured"]) == (1.0, 1.0, 0.9)
    assert (two["model"], two["cost_only"], two["gamma"], two["a"]) == (2.0, 1.6, 4, "0.7")
    assert one["measured_vs_fastest"] is None and one["model_vs_fastest"] is None  # the file names no fastest


def test_speedup_model_check_compares_the_model_with_the_speedup_over_the_targets_own_plain_decoding(tmp_path):
    """The model's c and v are over the target's own one-token forward: it is compared with speedup_vs_target_ar,
    and scaled by ar / fastest before it is set beside the speedup over the fastest plain decoding."""
    rows = [{"target": "t", "draft": "d", "acceptance": "real", "a": "", "gamma": 1, "alpha": 0.5,
             "tokens_per_round": 1.5, "c": 0.5, "v": 1.0, "ar_tok_s": 8.0, "fastest_ar_tok_s": 10.0,
             "spec_tok_s": 9.0, "speedup": 0.9, "speedup_vs_target_ar": 1.125}]  # model 1.5 / 1.5 = 1
    common.write_table(tmp_path, "speedup", rows, {"date": "d"}, "t")
    (one,) = speedup_model_check(tmp_path)
    assert (one["model"], one["measured"], one["measured_vs_fastest"], one["model_vs_fastest"]) == (1.0, 1.125, 0.9, 0.8)


def test_report_rewrites_only_between_markers():
    text = f"intro\n{START}\nold\n{END}\noutro\n"
    assert rewrite(text, "new") == f"intro\n{START}\nnew\n{END}\noutro\n"
    with pytest.raises(ValueError, match="markers"):
        rewrite("no markers here", "new")


def test_readme_performance_section_is_generated_from_committed_results():
    """README quotes only figures bench/ wrote: its section must equal bench.report's headline of the one run's folder
    the section names, and bench/results/README.md's part every table of that same run."""
    text = README.read_text(encoding="utf-8")
    folder = source(text)
    assert folder is not None and folder.is_dir() and folder.parent == RESULTS, folder
    assert rewrite(text, headline(folder)) == text, "README.md is stale: run python -m bench.report"
    full = RESULTS_README.read_text(encoding="utf-8")
    assert rewrite(full, section(folder)) == full, "bench/results/README.md is stale: run python -m bench.report"
    assert run_python("-m", "bench.report", "--check").returncode == 0


def test_readme_keeps_the_headline_and_the_results_readme_every_table():
    """README's part: the one command and the speedup table; the results' README: every table of the run too."""
    short, full = headline(RUN), section(RUN)
    for part in (short, full):
        assert "npspec generate --target random:gpt2-large" in part and "| target / draft | acceptance |" in part
        assert "Hardware: " in part
    for table in ("Plain (AR) greedy decoding", "Verify cost v(5)", "Drafting strategies", "Token trees against",
                  "Block against token verification", "RSD (`--verify rsd`", "format 2: read into place"):
        assert table in full and table not in short, table
    assert "`bench/results/README.md`" in short and "`bench/results/README.md`" not in full  # no self-reference


def test_report_names_the_folder_it_read_and_reads_it_again(tmp_path):
    """The section says which folder it came from, repository-relative, and `source` finds that folder in it; a
    section that names none names no run."""
    body = headline(RUN)
    assert "`python -m bench.report --results bench/results/run_all-xeon-spr`" in body
    assert "`bench/results/run_all-xeon-spr/compare.json`" in body  # each file by its own path
    assert "`bench/results/run_all-xeon-spr/verification_chain_paired.md`" in section(RUN)
    assert source(f"{START}\n{body}\n{END}") == RUN and source("no folder named") is None
    assert shown(ROOT / "README.md") == "README.md" and shown(tmp_path / "x.md") == "bench/" "results/x.md"
    assert found(RUN, "speedup.csv") == RUN / "speedup.csv" and found(RUN, "nothing.csv") is None
    r = run_python("-m", "bench.report", "--check", "--results", tmp_path / "missing")
    assert r.returncode == 2 and "no such folder" in r.stderr, r.stderr


def test_report_writes_both_parts_and_check_finds_either_stale(tmp_path, capsys):
    """main rewrites the README's headline and the results' README's tables from one folder, names both, and --check
    exits 1 while either part is stale; a README that names no folder needs --results."""
    run = tmp_path / "run_all-test"
    shutil.copytree(RUN, run)
    readme, full = tmp_path / "README.md", tmp_path / "FULL.md"
    for path in (readme, full):
        path.write_text(f"intro\n{START}\nold\n{END}\noutro\n", encoding="utf-8")
    paths = ["--readme", str(readme), "--results-readme", str(full)]
    with pytest.raises(SystemExit):
        main(paths)  # the README names no folder yet
    assert main([*paths, "--check", "--results", str(run)]) == 1
    assert main([*paths, "--results", str(run)]) == 0
    assert capsys.readouterr().out == f"wrote {readme}\nwrote {full}\n"
    assert readme.read_text(encoding="utf-8") == rewrite(f"intro\n{START}\n{END}\noutro\n", headline(run))
    paths += ["--results", str(run)]  # (the README names it by its own name only: it is outside the repository)
    assert main([*paths, "--check"]) == 0
    full.write_text(full.read_text(encoding="utf-8").replace("Hardware:", "Machine:"), encoding="utf-8")
    assert main([*paths, "--check"]) == 1 and "FULL.md" in capsys.readouterr().err


def test_drafter_targets_are_judged_from_the_rows():
    row = dict(target="random:gpt2-large", schedule="constant", a="0.7")
    controlled = [dict(row, strategy="ngram", gamma="2", speedup="1.4", tok_s="14"),
                  dict(row, strategy="ngram", gamma="4", speedup="1.6", tok_s="16"),
                  dict(row, strategy="ngram", gamma="4", schedule="heuristic", speedup="1.5", tok_s="15.5")]
    cost = [{"n_ctx": "256", "lookup_share": "0.01"}, {"n_ctx": "1024", "lookup_share": ""}]
    (s1, ok1, m1), (s2, ok2, m2), (s3, ok3, m3) = drafter_targets(controlled, cost)
    assert ok1 and "1.60x at gamma 4" in m1 and ok2 and "0.97" in m2 and ok3 and "256" in s3
    controlled[2]["tok_s"] = "15"  # 15 / 16 < 0.95
    assert not drafter_targets(controlled, cost)[1][1]


def test_readme_introduction_says_when_it_pays_with_committed_figures():
    """README tells a newcomer first when speculative decoding pays on a CPU, quoting only figures bench/ committed
    (bench/results/: the newest run, speedups over the fastest plain decoding), and the command
    it gives is one npspec generate accepts."""
    readme = README.read_text(encoding="utf-8")
    intro = readme[:readme.index("## Quick start")]
    assert "pays only when the target streams its weights" in intro and "fits in the CPU's" in intro
    run = source(readme)  # the run README's Performance section quotes
    assert f"`{shown(run / 'speedup.md')}`" in intro
    rows, _ = common.read_table(run / "speedup.csv")

    def speedup_of(target, draft, a, gamma):
        [row] = [r for r in rows if (r["target"], r["draft"], r["a"], r["gamma"]) == (target, draft, a, gamma)]
        assert float(row["fastest_ar_tok_s"]) >= float(row["ar_tok_s"])  # over the fastest plain decoding
        return f"{float(row['speedup']):.2f}x"

    for figure in (speedup_of("random:gpt2-large", "random:distilgpt2", "0.7", "3"),
                   speedup_of("random:gpt2-large", "random:distilgpt2", "0.9", "4"),
                   speedup_of("random:gpt2-medium", "random:distilgpt2", "0.7", "3"),
                   speedup_of("shipped target", "shipped draft", "", "3")):
        assert figure in intro, figure
    compare = json.loads((run / "compare.json").read_text())["result"]["compare"]
    assert f"{compare['speedup']:.2f}x" in intro
    [command] = [line for line in intro.splitlines() if line.startswith("npspec generate")]
    assert "--simulate-acceptance" in command and "--compare" in command
    options = run_python("-m", "npspec.generate", "--help").stdout
    assert all(word in options for word in command.split() if word.startswith("--"))

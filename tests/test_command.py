"""The `npspec` command (npspec.cli.main): its subcommands are the modules' own commands, `--version`, exit statuses,
the console script setup.cfg declares, and `npspec bench`'s messages when the benchmarks cannot run.
(The non-editable install's `npspec` script: tests/test_install.py.)"""

import configparser
import json

import numpy as np
import pytest

import npspec
from npspec.cli import main as cli
from npspec.sources.files import load_model

from conftest import ROOT, run_python
from test_cli import CONVERT, GENERATE, offline_env

NPSPEC = ("-m", "npspec.cli")
GREEDY = ["ROMEO:", "--json", "--temperature", "0", "--max-new-tokens", "12", "--gamma", "3"]


def test_the_console_script_is_cli_main():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    scripts = [line.split("=") for line in cfg["options.entry_points"]["console_scripts"].split("\n") if line]
    assert [[k.strip(), v.strip()] for k, v in scripts] == [["npspec", "npspec.cli.main:main"]]
    assert cfg["metadata"]["version"] == npspec.__version__


def test_version():
    r = run_python(*NPSPEC, "--version")
    assert (r.returncode, r.stdout) == (0, f"npspec {npspec.__version__}\n")


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_generate_is_python_m_npspec_generate():
    short, long = run_python(*NPSPEC, "generate", *GREEDY), run_python(*GENERATE, *GREEDY)
    assert short.returncode == long.returncode == 0, short.stderr
    a, b = json.loads(short.stdout), json.loads(long.stdout)
    assert a["ids"] == b["ids"] and a["text"] == b["text"] and len(a["ids"]) == 12


def test_convert_is_python_m_npspec_convert(tmp_path):
    src = ROOT / "tests" / "data" / "reference" / "hf"
    short = run_python(*NPSPEC, "convert", src, tmp_path / "short", env=offline_env(tmp_path))
    long = run_python(*CONVERT, src, tmp_path / "long", env=offline_env(tmp_path))
    assert short.returncode == long.returncode == 0, short.stderr
    a, b = (load_model(tmp_path / name) for name in ("short", "long"))
    assert a.metadata == b.metadata and np.array_equal(a.params["wte"], b.params["wte"])


@pytest.mark.parametrize("argv, status, says", [
    ([], 2, "required: command"),
    (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    (["generate", "--gamma", "abc"], 2, "invalid integer value: 'abc'"),  # argparse's status passes through
    (["generate", "--gamma", "-1"], 1, "error: gamma must be an integer >= 0"),
    (["convert", "/no/such/dir", "out"], 1, "error: source /no/such/dir is not a directory"),
    (["bench", "nosuch"], 2, "unknown benchmark 'nosuch'"),
])
def test_exit_status_and_message(argv, status, says, tmp_path, capfd):
    assert cli.main(argv) == status
    err = capfd.readouterr().err
    assert says in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["generate", "--gamma", "abc"], ["generate", "--no-such-option"],
                                  ["generate", "--verify", "nosuch"], ["convert"], ["nosuch"]])
def test_a_usage_error_is_one_line_that_points_at_help(argv, capfd):
    assert cli.main(argv) == 2
    out, err = capfd.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("npspec") and ": error: " in err
    assert err.rstrip().endswith("--help` lists the options"), err


@pytest.mark.parametrize("argv, usage", [((*NPSPEC, "generate"), "usage: npspec generate "),
                                         ((*NPSPEC, "convert"), "usage: npspec convert "),
                                         (GENERATE, "usage: python -m npspec.generate "),
                                         (CONVERT, "usage: npspec convert ")])
def test_help_names_the_command_as_it_was_typed(argv, usage):
    # `npspec generate --help` printed "usage: python -m npspec.generate"
    r = run_python(*argv, "--help")
    assert r.returncode == 0 and r.stdout.startswith(usage), r.stdout[:80]


def test_help_lists_the_commands_and_exit_statuses(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "{generate,convert,bench}" in out and all(str(code) in out for code in cli.EXIT_CODES)


def test_bench_outside_a_source_tree_says_what_to_do(tmp_path, capsys):
    assert cli.bench(["report"], root=tmp_path) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "source tree" in err and "pip install -e '.[bench]'" in err


def test_bench_without_the_extra_says_what_to_install(capsys):
    assert cli.bench(["verify-cost"], root=ROOT, extra_installed=False) == 1
    assert "the bench extra is not installed; run pip install -e '.[bench]'" in capsys.readouterr().err


def test_bench_runs_the_benchmark_module():
    pytest.importorskip("matplotlib")
    r = run_python(*NPSPEC, "bench", "verify-cost", "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: python -m bench.verify_cost")

"""What the CLI (python -m npspec.generate) prints: the --trace records in --json, accepted drafts in
colour on a terminal (and never when piped, with --no-color or with NO_COLOR set), the note of a slow compile
(faked: SlowNjit), the API function kept next to the CLI module, and the shipped pair's --compare figures README quotes.

Terminals are real: a child process (conftest.run_python) points its stdout at a pseudo-terminal,
runs the CLI's main, and hands back what the terminal received.
"""

import functools
import io
import logging
import json
import re
import time

import numpy as np
import pytest

import npspec
import npspec.cli.generate
from npspec.kernels.compiled import build, kernel
from npspec.kernels.probe import Choice, measure_all
from npspec.cli.generate import GREEN, RESET, build_parser, run
from npspec.kernels.registry import REGISTRY
from npspec.sources import load

from conftest import ROOT, run_python, tiny_model
from model_files import saved

ARGS = ["ROMEO:", "--max-new-tokens", "40", "--seed", "4", "--temperature", "0.8"]
ESCAPE = re.compile(r"\x1b\[[0-9;]*m")

ON_A_TERMINAL = """
import os, pty, sys
master, slave = pty.openpty()
saved = os.dup(1)
os.dup2(slave, 1)  # stdout is now the terminal
os.close(slave)
from npspec.cli.generate import main
rc = main(sys.argv[1:])
sys.stdout.flush()
os.dup2(saved, 1)  # closes the terminal's last slave end: reading the master ends with EIO
chunks = []
while True:
    try:
        chunk = os.read(master, 4096)
    except OSError:
        break
    if not chunk:
        break
    chunks.append(chunk)
sys.stdout.buffer.write(b"".join(chunks))
sys.exit(rc)
"""


def on_a_terminal(*argv, no_color=None):
    """The text a pseudo-terminal receives from `python -m npspec.generate *argv` (newlines as "\\n"),
    with NO_COLOR set to `no_color` (None: unset)."""
    proc = run_python("-c", ON_A_TERMINAL, *argv, env={"NO_COLOR": no_color}, text=False)
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")
    return proc.stdout.decode("utf-8", "replace").replace("\r\n", "\n")  # the terminal writes \n as \r\n


def cli(argv, out):
    """Run the CLI in this process, writing to `out`; returns its Generation."""
    return run(build_parser().parse_args(argv), out=out, err=io.StringIO())


def test_trace_in_json():
    out = io.StringIO()
    cli(ARGS + ["--json", "--trace", "--gamma", "3"], out)
    obj = json.loads(out.getvalue())
    ids, trace, stats = obj["ids"], obj["trace"], obj["stats"]
    rebuilt = []
    for rec in trace:  # each round: the accepted drafts, then the corrected or bonus id
        assert 0 <= rec["accepted"] <= len(rec["drafted"]) <= 3
        rebuilt += rec["drafted"][: rec["accepted"]] + ([rec["token"]] if rec["token"] is not None else [])
    assert rebuilt == ids and len(trace) == stats["rounds"]
    assert len(stats["acceptance_by_position"]) == 3
    for rate, a, t in zip(stats["acceptance_by_position"], stats["accepted_by_position"], stats["tested_by_position"]):
        assert rate == a / t if t else np.isnan(rate)  # JSON carries NaN where nothing was tested
    out2 = io.StringIO()
    cli(ARGS + ["--json", "--gamma", "3"], out2)
    assert "trace" not in json.loads(out2.getvalue()) and json.loads(out2.getvalue())["ids"] == ids


def test_colour_marks_accepted_drafts_on_a_terminal(tmp_path):
    text = on_a_terminal(*ARGS)
    plain = io.StringIO()
    gen = cli(ARGS + ["--html", str(tmp_path / "rounds.html")], plain)  # the same run, piped: its trace (kept for
    # the page) says which tokens were drafts
    assert GREEN in text and RESET in text
    assert ESCAPE.sub("", text) == plain.getvalue()  # colour adds nothing but escapes
    green = "".join(re.findall(re.escape(GREEN) + "(.*?)" + re.escape(RESET), text, flags=re.S))
    accepted = [i for r in gen.trace for i in r["drafted"][: r["accepted"]]]
    assert green == load(None, "target").tokenizer.decode(accepted)  # exactly the accepted draft tokens are green
    assert "\x1b[" not in plain.getvalue()  # piped: plain


@pytest.mark.parametrize("how", ["--no-color", "NO_COLOR"])
def test_colour_can_be_turned_off(how):
    if how == "--no-color":
        text = on_a_terminal(*ARGS, "--no-color")
    else:
        text = on_a_terminal(*ARGS, no_color="1")
    assert "\x1b[" not in text and text.startswith("ROMEO:")


def test_importing_the_cli_keeps_the_api_function():
    # the CLI module is npspec.cli.generate; the API function has its own name, so importing one never hides the other
    assert callable(npspec.generate_text) and npspec.cli.generate.__name__ == "npspec.cli.generate"


# --- the note of a slow compile ------------------------------------------------------------------------


class SlowNjit:
    """numba.njit's shape, njit(**options)(f) -> a callable, whose functions run as plain Python and take `seconds`
    more on their first call, as a function numba compiles does."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __call__(self, **options):
        def jit(f):
            first = [True]

            def compiled_f(*args):
                if first:
                    time.sleep(self.seconds)
                    first.clear()
                return f(*args)
            return compiled_f
        return jit


@pytest.fixture
def slow_compile(monkeypatch):
    """compiled-panels built anew in this process (one thread), each function's compile faked at twice NOTE_SECONDS."""
    if not REGISTRY["compiled-panels"].available():
        pytest.skip("the registry offers compiled-panels with numba (the fast extra) only")
    build.product_build.cache_clear()
    monkeypatch.setattr(build, "NOTE_SECONDS", 0.05)
    monkeypatch.setattr(kernel, "compiled_product", functools.partial(build.compiled_product, njit=SlowNjit(0.1)))
    yield
    build.product_build.cache_clear()  # the next build is numba's again


def test_a_slow_compile_of_a_kernel_given_by_name_says_so(tmp_path, slow_compile):
    out, err = io.StringIO(), io.StringIO()
    argv = ["--target", str(saved(tmp_path / "m")), "--gamma", "0", "--target-kernel", "compiled-panels",
            "--threads", "1", "--max-new-tokens", "2"]
    assert npspec.cli.generate.main(argv, out=out, err=err) == 0, err.getvalue()
    assert "npspec: kernel compiled-panels: compiled in " in err.getvalue()  # 9.3 s used to pass in silence


def test_a_slow_compile_in_the_kernel_probe_says_so(slow_compile, caplog):
    caplog.set_level(logging.INFO, logger="npspec")
    measure_all([Choice("compiled-panels", 1)], tiny_model(), (1,), lambda *args, **kw: 0.0)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("kernel compiled-panels: compiled in ")]
    assert said, caplog.records  # the first fast run's compile, timed by the probe


# --- what README says --compare prints on the shipped pair ----------------------------------------------


def test_readme_states_the_shipped_pairs_measured_speedups_with_their_conditions():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    intro = " ".join(readme[:readme.index("## Quick start")].split())
    assert "cannot gain at all" not in readme  # a 2-core AMD EPYC gained 1.27x (and the machine 1.64x)
    runs = ROOT / "bench" / "results" / "shipped-compare-epyc"
    assert "`bench/results/shipped-compare-epyc/README.md`" in intro and "AMD EPYC" in intro and "load average" in intro
    for name, options in (("compare_default", "with its defaults"), ("compare_greedy_gamma3", "--temperature 0 --gamma 3")):
        c = json.loads((runs / f"{name}.json").read_text())["compare"]
        quoted = f"{c['speedup']:.2f}x ({min(c['speedups']):.2f}x to {max(c['speedups']):.2f}x)"
        assert quoted in intro and c["repeats"] == 5 and options in intro, quoted

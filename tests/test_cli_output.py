"""What the CLI (python -m npspec.generate) prints: the --trace records in --json, accepted drafts in
colour on a terminal (and never when piped, with --no-color or with NO_COLOR set), and the API
function kept next to the CLI module.

Terminals are real: a child process (conftest.run_python) points its stdout at a pseudo-terminal,
runs the CLI's main, and hands back what the terminal received.
"""

import io
import json
import re

import numpy as np
import pytest

import npspec
import npspec.cli.generate
from npspec.cli.generate import GREEN, RESET, build_parser, run
from npspec.sources import load

from conftest import run_python

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
    # the CLI module is npspec.cli.generate (npspec.generate runs it); the API function has its own name, so importing
    # one never hides the other
    assert callable(npspec.generate_text) and npspec.cli.generate.__name__ == "npspec.cli.generate"

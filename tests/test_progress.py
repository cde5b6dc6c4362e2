"""Progress bars (npspec.sources.progress): who decides (the commands, from --quiet, NPSPEC_QUIET, TQDM_DISABLE, --json and
whether stderr is a terminal), what the library reports (every byte of building, converting and loading, per
tensor), and what a user sees: bars on a terminal, none when piped.

Terminals are real: a child process points its stderr at a pseudo-terminal of 120 columns, runs the command's
main and hands back what the terminal received (npspec.sources.progress.DELAY is set to 0 there, so the tiny models'
quick work shows its bars too).
"""

import io
import math

import pytest

from npspec.sources import progress
from npspec.sources.files import load_model
from npspec.model.tensors import tensor_shapes
from npspec.sources.huggingface import convert, read_hf_tensors
from npspec.sources import SHAPES, load

from conftest import ROOT, run_python
from test_cli import offline_env

HF = ROOT / "tests" / "data" / "reference" / "hf"
BAR_MARKS = ("%|", "\u2588", "B/s")  # what a tqdm bar writes: the bar's edge and blocks, a rate

ON_A_TERMINAL = """
import fcntl, os, pty, struct, sys, termios, threading
master, slave = pty.openpty()
fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))  # tqdm draws nothing 0 columns wide
saved = os.dup(2)
os.dup2(slave, 2)  # stderr is now the terminal
os.close(slave)
chunks = []

def drain():
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            return
        if not chunk:
            return
        chunks.append(chunk)

reader = threading.Thread(target=drain)
reader.start()
import npspec.sources.progress
npspec.sources.progress.DELAY = 0
from npspec.cli.generate import main
rc = main(sys.argv[1:])
sys.stderr.flush()
os.dup2(saved, 2)  # closes the terminal's last slave end: reading the master ends with EIO
reader.join()
sys.stdout.buffer.write(b"".join(chunks))
sys.exit(rc)
"""
TINY = ["--target", "random:tiny", "--draft", "random:tiny-draft", "--max-new-tokens", "4", "Hi"]


class Recorder:
    """A bar factory that keeps what each bar was told: [desc, total, unit, [updates]]."""

    def __init__(self):
        self.bars = []

    def __call__(self, desc, total, unit="B"):
        record = [desc, total, unit, []]
        self.bars.append(record)

        class Bar(progress.NoBar):
            def update(self, n=1):
                record[3].append(n)

        return Bar()


@pytest.mark.parametrize("quiet, env, tty, shown", [
    (False, {}, True, True),
    (True, {}, True, False),  # --quiet
    (False, {"NPSPEC_QUIET": "1"}, True, False),
    (False, {"NPSPEC_QUIET": "0"}, True, True),  # a false value is no request
    (False, {"TQDM_DISABLE": "1"}, True, False),
    (False, {"TQDM_DISABLE": "true"}, True, False),
    (False, {}, False, False),  # stderr piped or redirected to a file
])
def test_who_decides(quiet, env, tty, shown):
    stream = io.StringIO()
    stream.isatty = lambda: tty
    assert progress.show_progress(quiet, stream, env) is shown


def test_a_closed_or_missing_stream_shows_nothing():
    closed = io.StringIO()
    closed.close()
    assert progress.show_progress(False, closed, {}) is False and progress.show_progress(False, None, {}) is False


def test_building_converting_and_loading_report_every_byte(tmp_path):
    rec = Recorder()
    model = load("random:tiny", cache_dir=tmp_path, progress=rec)
    entry = model.source.rsplit("/", 1)[1]
    descs = [b[0] for b in rec.bars]
    assert descs == ["random weights (seed 0)", f"loading {entry}"]  # written as drawn; format 2: no relayout
    for desc, total, unit, updates in rec.bars:
        assert unit == "B" and sum(updates) == total > 0, desc  # each bar ends full
    shapes = tensor_shapes(SHAPES["tiny"])
    assert rec.bars[0][1] == rec.bars[1][1] == model.n_bytes == 4 * sum(map(math.prod, shapes.values()))
    assert len(rec.bars[0][3]) == len(rec.bars[1][3]) == len(shapes)  # one step a tensor
    again = Recorder()
    load("random:tiny", cache_dir=tmp_path, progress=again)  # cached: only the load
    assert [b[0] for b in again.bars] == descs[1:]


def test_conversion_advances_per_tensor(tmp_path):
    rec = Recorder()
    convert(HF, tmp_path / "out", progress=rec)
    reading, hashing, writing = rec.bars
    assert reading[0] == "reading model.safetensors" and hashing[0] == "sha256 of model.safetensors"
    assert sum(hashing[3]) == hashing[1] == (HF / "model.safetensors").stat().st_size
    assert len(reading[3]) == len(read_hf_tensors(HF / "model.safetensors"))  # one step a tensor
    assert sum(reading[3]) == reading[1] == (HF / "model.safetensors").stat().st_size - \
        int.from_bytes((HF / "model.safetensors").read_bytes()[:8], "little") - 8  # every data byte
    assert load_model(tmp_path / "out").n_bytes == reading[1]  # the reference file is float32 without extras
    assert writing[0] == "writing model.safetensors" and sum(writing[3]) == writing[1] == reading[1]
    assert len(writing[3]) == len(reading[3])  # one step a tensor


def on_a_terminal(tmp_path, *argv, **env):
    r = run_python("-c", ON_A_TERMINAL, *argv, env=offline_env(tmp_path, **env), text=False)
    assert r.returncode == 0, r.stdout.decode("utf-8", "replace")
    return r.stdout.decode("utf-8", "replace")


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_json_shows_bars_on_a_terminal_too(tmp_path):
    terminal = on_a_terminal(tmp_path, *TINY, "--json")  # stdout holds the JSON; the bars are stderr's (they were off)
    assert "%|" in terminal and "loading tiny-seed0" in terminal, terminal


def test_bars_on_a_terminal_none_when_piped(tmp_path):
    terminal = on_a_terminal(tmp_path, *TINY)
    assert "%|" in terminal and "B/s" in terminal, terminal  # (tiny work ends before a block is drawn)
    assert "random weights (seed 0)" in terminal and "loading tiny-seed0" in terminal
    piped = run_python("-m", "npspec.generate", *TINY, env=offline_env(tmp_path / "other"))
    assert piped.returncode == 0, piped.stderr
    assert "npspec: converting" in piped.stderr  # the same work was done...
    assert not any(mark in piped.stderr + piped.stdout for mark in BAR_MARKS), piped.stderr  # ...without a bar


@pytest.mark.slow  # four whole commands, 5 s or more each: CI's second step
@pytest.mark.parametrize("extra, env", [(["--quiet"], {}), (["--json", "--quiet"], {}), ([], {"NPSPEC_QUIET": "1"}),
                                        ([], {"TQDM_DISABLE": "1"})],
                         ids=["--quiet", "--json --quiet", "NPSPEC_QUIET", "TQDM_DISABLE"])
def test_no_bars_on_a_terminal_when_asked(tmp_path, extra, env):
    terminal = on_a_terminal(tmp_path, *TINY, *extra, **env)
    assert "npspec: converting" in terminal and not any(mark in terminal for mark in BAR_MARKS), terminal

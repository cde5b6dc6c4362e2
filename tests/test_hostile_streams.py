"""Hostile streams and environments: a full stdout, a closed stdin or stderr, thread counts past any CPU, a
variable that is not ASCII digits, paths the OS refuses, a model whose logits overflow. Each is one line on stderr
(never on stdout), exit status 1 or 2, no traceback, and bounded memory.
"""

import io
import os
import subprocess
import sys

import pytest

from npspec.cli import main as cli, generate, harness, inputs
from npspec.decode import Options, SamplingParams, prepare
from npspec.decode.drafters import ModelDrafter
from npspec.sources.files import save_converted
from npspec.sources.init import init_tensors
from npspec.kernels.workers import THREADS_PER_CPU, check_threads
from npspec.sources import load

from conftest import ROOT
from model_files import SMALL, TOKENIZER, saved

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def run(argv, stdout=subprocess.PIPE, close=()):
    """This interpreter running `argv` with the descriptors in `close` closed (0: stdin, 2: stderr)."""
    return subprocess.run([sys.executable, *argv], stdout=stdout, stderr=subprocess.PIPE, text=True, env=ENV,
                          cwd=ROOT, timeout=300, preexec_fn=lambda: [os.close(fd) for fd in close])


def assert_one_line(r, *phrases, status=1):
    assert r.returncode == status and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and all(p in r.stderr for p in phrases), r.stderr


@needs_dev_full
@pytest.mark.parametrize("argv", [["-m", "npspec.cli", "--help"], ["-m", "npspec.cli", "--version"],
                                  ["-m", "npspec.cli", "generate", "--help"], ["-m", "npspec.cli.convert", "--help"],
                                  ["-m", "npspec.cli", "bench", "--help"], ["-m", "npspec.testing", "--help"],
                                  ["-m", "npspec.testing", "vectors", "-"]])
def test_help_and_version_to_a_full_disk_are_an_error(argv):
    with open("/dev/full", "w") as full:
        r = run(argv, stdout=full)
    assert_one_line(r, "No space left on device")  # used to exit 0 (argparse drops the OSError)


@needs_dev_full
@pytest.mark.parametrize("argv, status", [
    (["-m", "npspec.cli", "generate", "--max-new-tokens", "3", "--kernel-probe", "off"], 0),  # /dev/full: used to be 1
    (["-m", "npspec.generate", "--gamma", "-1"], 1), (["-m", "npspec.cli.convert", "no/such/dir", "out"], 1),
    (["-m", "npspec.cli", "generate", "--no-such-option"], 2)], ids=["done", "error", "convert", "usage"])
def test_a_full_or_closed_stderr_never_changes_the_exit_status(argv, status, tmp_path):
    for how in ("full", "closed"):
        with open("/dev/full", "w") as full:
            r = subprocess.run([sys.executable, *argv], stdout=subprocess.PIPE, stderr=full, text=True, cwd=ROOT,
                               env={**ENV, "NPSPEC_CACHE": str(tmp_path)}, timeout=300,
                               preexec_fn=(lambda: os.close(2)) if how == "closed" else None)
        assert r.returncode == status, (how, r.returncode)
        assert r.stdout.startswith("ROMEO:") if status == 0 else r.stdout == "", (how, r.stdout)


def test_a_closed_stdin_is_one_line():
    r = run(["-m", "npspec.generate", "-"], close=(0,))
    assert r.stdout == ""
    assert_one_line(r, "stdin is closed")


def test_the_kit_with_stderr_closed_prints_nothing_on_stdout(tmp_path):
    for argv in (["-m", "npspec.testing"], ["-m", "npspec.testing", "vectors"],  # argparse's usage errors
                 ["-m", "npspec.testing", "vectors", str(tmp_path / "no" / "such" / "dir.json")]):  # an error
        r = subprocess.run([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=ENV,
                           cwd=ROOT, timeout=300, preexec_fn=lambda: os.close(2))
        assert r.returncode in (1, 2) and r.stdout == b"", (argv, r.stdout)  # both used to reach stdout


def test_bench_lists_the_benchmarks_bench_holds():
    names = cli.bench_commands(ROOT)
    assert "primitives" in names and "common" not in names and "report" in names  # primitives used to be refused
    assert set(names) == {p.stem for p in (ROOT / "bench").glob("*.py") if '__name__ == "__main__"' in p.read_text()}
    out = io.StringIO()
    assert cli.bench(["--help"], out=out, err=io.StringIO()) == 0 and "primitives" in out.getvalue()


# --- thread counts -------------------------------------------------------------------------------------


def test_thread_counts_are_bounded_by_the_cpus():
    assert check_threads(THREADS_PER_CPU * 2, cpus=2) == 128
    with pytest.raises(ValueError, match=r"at most 128 \(64 per CPU; this process may use 2\), got 129"):
        check_threads(129, cpus=2)
    with pytest.raises(ValueError, match="--threads: the thread count must be at most"):
        inputs.thread_count(10 ** 9, environ={}, cpus=2)  # used to allocate 3.8 GB of locks


def test_load_with_10_to_the_12_threads_answers_at_once(tmp_path):
    with pytest.raises(ValueError, match="the thread count must be at most"):
        load("random:tiny", cache_dir=tmp_path, threads=10 ** 12)  # used to give no answer in 60 s


@pytest.mark.parametrize("value", ["²", "٣", "1e3", "-2", " "])
def test_npspec_num_threads_that_is_not_ascii_digits_names_the_variable(value):
    with pytest.raises(ValueError, match="NPSPEC_NUM_THREADS=.* is not a positive integer"):
        inputs.thread_count(None, environ={"NPSPEC_NUM_THREADS": value}, cpus=2)  # "²" used to reach int()


# --- paths the OS refuses ------------------------------------------------------------------------------


def generate_error(*argv):
    out, err = io.StringIO(), io.StringIO()
    status = generate.main(list(argv), out=out, err=err)
    assert out.getvalue() == "" and err.getvalue().count("\n") == 1 and "Traceback" not in err.getvalue()
    return status, err.getvalue()


def test_a_too_long_target_path_names_the_path_not_stdout(tmp_path):
    status, err = generate_error("--target", str(tmp_path / ("x" * 300)))
    assert status == 1 and "File name too long" in err and "stdout" not in err and str(tmp_path) in err


def test_a_target_under_an_unknown_user_is_one_line():
    status, err = generate_error("--target", "~nouser-npspec/x")
    assert status == 1 and "cannot expand ~nouser-npspec" in err  # a RuntimeError traceback before


def test_html_under_an_unknown_user_is_one_line():
    status, err = generate_error("--html", "~nouser-npspec/round.html")
    assert status == 1 and "cannot expand ~nouser-npspec" in err


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's overflow warnings, raised in this process
@pytest.mark.parametrize("role", ["target", "draft"])
def test_a_model_whose_logits_overflow_prints_nothing_before_the_error(tmp_path, role):
    t = init_tensors(SMALL, 1)
    t["ln_f.weight"][:] = 3e38  # finite, so loading passes; the head's products overflow to inf
    save_converted(tmp_path / "inf", t, SMALL, "test", None, TOKENIZER)
    pair = ["--target", tmp_path / "inf", "--gamma", "0"] if role == "target" else \
        ["--target", saved(tmp_path / "ok"), "--draft", tmp_path / "inf", "--draft-kernel", "gemv-panels"]
    status, err = generate_error(*map(str, pair), "--target-kernel", "gemm-blocks", "--max-new-tokens", "4")
    assert status == 1 and "logits hold NaN or +inf" in err  # the prompt used to be on stdout first


# --- progress on stderr for the long, silent runs ------------------------------------------------------


class Bars:
    """A bar factory (npspec.sources.progress's protocol) that records each bar's description, total and updates."""

    def __init__(self):
        self.bars = []

    def __call__(self, desc, total, unit="B"):
        record = [desc, total, unit, 0]
        self.bars.append(record)

        class Bar:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def update(self, n=1):
                record[3] += n

        return Bar()


def test_simulate_acceptance_shows_its_reference_run(tiny, notes):
    job = prepare(tiny, ModelDrafter(tiny), [1, 2, 3], Options(6, 4, SamplingParams(0.0)))
    bars = Bars()
    _, reference = harness.simulated(job, 0.5, 0, bars)
    assert reference[:3] == [1, 2, 3] and len(reference) == 3 + 6  # the prompt, then the target's greedy ids
    assert notes() and notes()[0].startswith("SIMULATED acceptance")
    assert bars.bars == [["--simulate-acceptance: the target's greedy reference", 6, "tok", 6]]  # silent before

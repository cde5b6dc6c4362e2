"""python -m npspec.generate and python -m npspec.convert, run as a user would."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT


def run(*args, stdin=None, module="npspec.generate"):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, input=stdin,
                          cwd=ROOT, timeout=300)


def test_default_run_streams_text_and_summary():
    r = run("--max-new-tokens", "20")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ROMEO:") and len(r.stdout) > len("ROMEO:") + 10
    assert "\x1b[" not in r.stdout  # piped output is plain
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("20 new tokens") and "alpha" in line and "tokens/round" in line and "tokens/s" in line


def test_json_and_stdin_prompt():
    r = run("-", "--json", "--max-new-tokens", "8", "--seed", "3", stdin="JULIET:\n")
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert set(obj) == {"text", "ids", "stats"} and len(obj["ids"]) == 8
    for key in ("new_tokens", "rounds", "drafted", "accepted", "rejected", "alpha", "draft_acceptance",
                "tokens_per_round", "target_forwards", "draft_forwards", "seconds", "tokens_per_s", "stop_reason"):
        assert key in obj["stats"]
    again = json.loads(run("-", "--json", "--max-new-tokens", "8", "--seed", "3", stdin="JULIET:\n").stdout)
    assert again["ids"] == obj["ids"]  # same seed, same output


@pytest.mark.parametrize("args, msg", [
    (["--max-new-tokens", "0"], "max-new-tokens"),
    (["--gamma", "-1"], "gamma"),
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "1.5"], "top_p"),
    (["--top-k", "-2"], "top_k"),
    (["--target", "/nonexistent/model"], "not an existing directory"),
    (["x" * 2000], "context"),
])
def test_bad_input_is_one_clean_line(args, msg):
    r = run(*args, "--max-new-tokens", "4") if "--max-new-tokens" not in args else run(*args)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and msg in r.stderr
    assert r.stderr.startswith("npspec.generate: error:")


def test_convert_cli_errors(tmp_path):
    r = run(str(tmp_path / "missing"), str(tmp_path / "out"), module="npspec.convert")
    assert r.returncode == 1 and "not a directory" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_json_is_strict_when_nothing_was_drafted():
    r = run("--json", "--gamma", "0", "--max-new-tokens", "3")
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert obj["stats"]["alpha"] is None and obj["stats"]["rounds"] == 3


def test_prompt_is_not_printed_before_a_bad_option_is_refused():
    for args in (["--temperature", "nan"], ["--top-p", "0"], ["--seed", "-1"], ["y" * 3000]):
        r = run(*args)
        assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr


def test_non_utf8_stdin_is_one_clean_line():
    r = subprocess.run([sys.executable, "-m", "npspec.generate", "-"], input=b"ROMEO\xff\xfe:", capture_output=True,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 1 and b"not valid UTF-8" in r.stderr and b"Traceback" not in r.stderr


def test_huge_gamma_is_clamped_not_allocated():
    r = run("--json", "--gamma", "999999999", "--max-new-tokens", "5", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)["stats"]
    assert stats["new_tokens"] == 5 and len(stats["acceptance_by_position"]) == 4


def test_piping_into_a_closed_reader_stops_quietly():
    p = subprocess.Popen([sys.executable, "-m", "npspec.generate", "--max-new-tokens", "200"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader leaves before the first write, like `| head -c 0`
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 141 and "Traceback" not in err and err == ""


def test_a_bad_thread_count_is_refused_before_any_output():
    import os

    env = {**os.environ, "NPSPEC_NUM_THREADS": "zero"}
    r = subprocess.run([sys.executable, "-m", "npspec.generate", "--max-new-tokens", "4"], capture_output=True,
                       text=True, cwd=ROOT, timeout=300, env=env)
    assert r.returncode != 0 and r.stdout == ""
    assert "NPSPEC_NUM_THREADS='zero' is not a positive integer" in r.stderr

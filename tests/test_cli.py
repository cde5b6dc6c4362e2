"""python -m npspec.generate and npspec convert, run as a user would.

Output streams to stdout, a summary to stderr; every refusal is one line `<prog>: error: ...`,
exit status 1, no traceback, nothing on stdout and nothing written to npspec's cache. Runs that
could touch a cache get their own temporary caches and no network (`offline_env`).
`offline_env`, `assert_one_clean_line` and `cache_entries` are shared with test_files_*.py,
test_convert.py and test_sources.py, which import them from here.
"""

import io
import json
import os
import re

import pytest

from npspec.cli.inputs import cpu_count, prompt_byte_limit, read_prompt, thread_count
from npspec.cli.report import summary
from npspec.kernels.registry import REGISTRY, names

from conftest import installed
from npspec.sources import load
from npspec.decode import Stats

from conftest import ROOT, run_python

GENERATE = ("-m", "npspec.generate")
CONVERT = ("-m", "npspec.cli.convert")


def offline_env(tmp_path, **extra):
    """Variables for a subprocess that never touches the user's caches: no hub access, Hugging Face and npspec
    caches in `tmp_path` ("hf", "npspec"), one BLAS thread. `extra` adds or (value None) removes variables."""
    env = {k: None for k in os.environ if k.startswith(("HF_", "NPSPEC_"))}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hf"), HF_HOME=str(tmp_path / "hf_home"),
               NPSPEC_CACHE=str(tmp_path / "npspec"), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def assert_one_clean_line(r, *phrases, prog="npspec.generate"):
    """Exit status 1, no traceback, and one error line holding every phrase (only a conversion's progress note may
    come before it)."""
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    *notes, error = r.stderr.strip().splitlines()
    assert error.startswith(f"{prog}: error: "), r.stderr
    assert all(n.startswith("npspec: converting ") for n in notes), r.stderr
    for phrase in phrases:
        assert phrase in error, (phrase, error)


def cache_entries(tmp_path):
    """Every file in the npspec cache of offline_env(tmp_path) but its lock files."""
    root = tmp_path / "npspec"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".locks" not in p.parts
                  and p.is_file()) if root.exists() else []


def greedy_ids(*args, env=None):
    r = run_python(*GENERATE, "--json", "--temperature", "0", "--max-new-tokens", "24", *args, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["ids"]


# --- runs that succeed -------------------------------------------------------------------------------


def test_default_run_streams_text_and_summary():
    r = run_python(*GENERATE, "--max-new-tokens", "20")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ROMEO:") and len(r.stdout) > len("ROMEO:") + 10
    assert "\x1b[" not in r.stdout  # piped output is plain
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("20 new tokens") and "alpha" in line and "tokens/round" in line and "tokens/s" in line


def test_json_and_stdin_prompt():
    args = ("-", "--json", "--max-new-tokens", "8", "--seed", "3")
    r = run_python(*GENERATE, *args, stdin="JULIET:\n")
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert set(obj) == {"text", "ids", "stats"} and len(obj["ids"]) == 8
    for key in ("new_tokens", "rounds", "drafted", "accepted", "rejected", "alpha", "draft_acceptance",
                "tokens_per_round", "target_forwards", "draft_forwards", "seconds", "tokens_per_s", "stop_reason"):
        assert key in obj["stats"]
    again = json.loads(run_python(*GENERATE, *args, stdin="JULIET:\n").stdout)
    assert again["ids"] == obj["ids"]  # same seed, same output


def test_json_is_strict_when_nothing_was_drafted():
    r = run_python(*GENERATE, "--json", "--gamma", "0", "--max-new-tokens", "3")
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert obj["stats"]["alpha"] is None and obj["stats"]["rounds"] == 3


def test_huge_gamma_is_clamped_not_allocated():
    r = run_python(*GENERATE, "--json", "--gamma", "999999999", "--max-new-tokens", "5", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)["stats"]
    assert stats["new_tokens"] == 5 and len(stats["acceptance_by_position"]) == 4


def test_piping_into_a_closed_reader_stops_quietly():
    # stdout is a pipe whose reader left before the first write, like `| head -c 0`
    code = ("import os, runpy, sys; r, w = os.pipe(); os.close(r); os.dup2(w, 1); "
            "sys.argv = ['npspec.generate', '--max-new-tokens', '200', '--kernel-probe', 'off']; "
            "runpy.run_module('npspec.generate', run_name='__main__')")
    r = run_python("-c", code)
    assert r.returncode == 141 and "Traceback" not in r.stderr and r.stderr == ""


# --- threads and kernels -----------------------------------------------------------------------------


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_thread_count_never_changes_the_output(tmp_path):
    sampled = ("--json", "--max-new-tokens", "12", "--seed", "5")
    outs = [run_python(*GENERATE, *sampled, *args, env=env) for args, env in (
        (("--threads", "1"), None), (("--threads", "3"), None), ((), {"NPSPEC_NUM_THREADS": "2"}),
        (("--threads", "2"), {"NPSPEC_NUM_THREADS": "zero"}))]  # the option wins over the variable
    assert all(r.returncode == 0 for r in outs), [r.stderr for r in outs]
    assert len({tuple(json.loads(r.stdout)["ids"]) for r in outs}) == 1


@pytest.mark.parametrize("args, env, message", [
    (["--threads", "0"], None, "--threads must be >= 1, got 0"),
    (["--threads", "-3"], None, "--threads must be >= 1, got -3"),
    ([], {"NPSPEC_NUM_THREADS": "zero"}, "NPSPEC_NUM_THREADS='zero' is not a positive integer"),
    ([], {"NPSPEC_NUM_THREADS": "0"}, "NPSPEC_NUM_THREADS='0' is not a positive integer"),
    ([], {"NPSPEC_NUM_THREADS": "-1"}, "NPSPEC_NUM_THREADS='-1' is not a positive integer"),
    ([], {"NPSPEC_NUM_THREADS": "1.5"}, "NPSPEC_NUM_THREADS='1.5' is not a positive integer"),
])
def test_a_bad_thread_count_is_refused_before_any_output(args, env, message):
    r = run_python(*GENERATE, "--max-new-tokens", "4", *args, env=env)
    assert_one_clean_line(r, message)
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1


def test_thread_count_reads_the_option_then_the_variable_then_the_cpus():
    assert thread_count(5, {"NPSPEC_NUM_THREADS": "3"}) == 5
    assert thread_count(None, {"NPSPEC_NUM_THREADS": "3"}, cpus=4) == 3
    assert thread_count(None, {}) == thread_count(None, {"NPSPEC_NUM_THREADS": ""}) == cpu_count() >= 1
    for bad in ("many", "0", "-2"):
        with pytest.raises(ValueError, match=f"NPSPEC_NUM_THREADS='{bad}' is not a positive integer"):
            thread_count(None, {"NPSPEC_NUM_THREADS": bad})
    with pytest.raises(ValueError, match="--threads must be >= 1"):
        thread_count(0, {})


def test_a_thread_variable_above_the_cpus_is_capped_with_a_note(notes):
    # NPSPEC_NUM_THREADS=1000 started 137 threads
    assert thread_count(None, {"NPSPEC_NUM_THREADS": "1000"}, cpus=2) == 2
    assert notes() == ["NPSPEC_NUM_THREADS=1000 is more than the 2 CPUs this process may use; using 2"]
    assert thread_count(None, {"NPSPEC_NUM_THREADS": "2"}, cpus=2) == 2 and len(notes()) == 1
    assert thread_count(3, {}, cpus=2) == 3  # an explicit --threads is used as given
    r = run_python(*GENERATE, "--max-new-tokens", "4", env={"NPSPEC_NUM_THREADS": "1000"})
    assert r.returncode == 0 and "npspec.generate: note: NPSPEC_NUM_THREADS=1000 is more than the " in r.stderr


CLI_KERNELS = [k for k in names(cli=True, codes=False) if REGISTRY[k].available()]


@pytest.mark.parametrize("target_kernel", [  # the NumPy panels' two (tests/test_kernels.py covers them too): slow
    pytest.param(*p.values, marks=[*p.marks] + ([pytest.mark.slow] if p.values[0] in ("gemv-rows", "gemv-panels")
                                                else []))
    for p in installed([k for k in names(cli=True, codes=False) if REGISTRY[k].invariant])])
def test_invariant_target_kernels_give_greedy_decodings_output(target_kernel):
    # with a batch-invariant target, greedy speculative output is the target's own greedy output,
    # whichever product the draft uses
    plain = greedy_ids("--gamma", "0", "--target-kernel", target_kernel)
    for draft_kernel in CLI_KERNELS:
        assert greedy_ids("--target-kernel", target_kernel, "--draft-kernel", draft_kernel) == plain, draft_kernel


@pytest.mark.parametrize("kernel", [k for k in names(cli=True) if not REGISTRY[k].invariant])
def test_other_target_kernels_run(kernel):
    ids = greedy_ids("--target-kernel", kernel)
    assert len(ids) == 24 and all(0 <= i < 2048 for i in ids)


def test_an_unknown_kernel_is_a_usage_error():
    for option in ("--target-kernel", "--draft-kernel"):
        r = run_python(*GENERATE, option, "gemv")
        assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
        assert f"argument {option}: invalid choice: 'gemv'" in r.stderr and all(k in r.stderr for k in CLI_KERNELS)
        assert "gemm-panels" not in r.stderr  # the bench's kernel


# --- refusals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, phrases", [
    (["--max-new-tokens", "0"], ["max_new_tokens must be an integer >= 1, got 0"]),
    (["--max-new-tokens", "-5"], ["max_new_tokens must be an integer >= 1, got -5"]),
    (["--gamma", "-1"], ["gamma must be an integer >= 0 (0 = no drafting), got -1"]),
    (["--temperature", "-1"], ["temperature must be a finite number >= 0"]),
    (["--temperature", "nan"], ["temperature must be a finite number >= 0"]),
    (["--top-p", "1.5"], ["top_p must be in (0, 1]"]),
    (["--top-p", "0"], ["top_p must be in (0, 1]"]),
    (["--top-p", "nan"], ["top_p must be in (0, 1]"]),
    (["--top-k", "-2"], ["top_k must be an integer >= 0"]),
    (["--seed", "-1"], ["--seed must be >= 0, got -1"]),
    (["x" * 2000], ["the prompt has 2000 tokens but the context holds 256"]),
    (["--target", "/nonexistent/model"], ["'/nonexistent/model' is not an existing directory"]),
    (["--draft", "./no/such/dir"], ["'./no/such/dir' is not an existing directory"]),
    (["--target", "bogus"], ["unknown model 'bogus'", "random:<shape>", "gpt2-large", "org/name"]),
    (["--target", "random:gpt3"], ["unknown random shape 'gpt3'", "random:gpt2-xl", "random:tiny"]),
    # options that would do nothing (issue 15, item 11): each was accepted silently
    (["--gamma", "0", "--draft", "/nonexistent"], ["--gamma 0 is plain decoding, with no drafter, so --draft would do "
                                                   "nothing: give --gamma >= 1 or drop it"]),
    (["--gamma", "0", "--tree", "2,2"], ["so --tree would do nothing"]),
    (["--gamma", "0", "--tree-budget", "8"], ["so --tree-budget would do nothing"]),
    (["--gamma", "0", "--draft-p-min", "0.5"], ["so --draft-p-min would do nothing"]),
    (["--gamma", "0", "--gamma-schedule", "heuristic"], ["so --gamma-schedule heuristic would do nothing"]),
    (["--gamma", "0", "--draft", "ngram", "--tree", "2"], ["--draft ngram needs --gamma >= 1"]),
    (["--compare", "--gamma", "0"], ["so --compare would do nothing"]),  # compared plain decoding with itself
    (["--simulate-acceptance", "0.7"], ["--simulate-acceptance steers greedy proposals only: add --temperature 0"]),
    (["--simulate-acceptance", "nan", "--temperature", "0"], ["--simulate-acceptance is a probability"]),
    (["--simulate-acceptance", "-0.1", "--temperature", "0"], ["give a number in [0, 1], got -0.1"]),
    (["--simulate-acceptance", "0.7", "--temperature", "0", "--draft", "ngram"], ["steers a draft model's chain"]),
    (["--simulate-acceptance", "0.7", "--temperature", "0", "--tree", "2,2"], ["steers a draft model's chain"]),
    (["--simulate-acceptance", "0.7", "--gamma", "0"], ["so --simulate-acceptance would do nothing"]),
    (["--trace"], ["--trace adds a record per round to --json's output: add --json"]),
    (["--compare-repeats", "3"], ["--compare-repeats repeats --compare's decodings: add --compare or drop it"]),
    (["--compare", "--compare-repeats", "0"], ["--compare-repeats must be >= 1, got 0"]),
    (["--target", "random:tiny", "--tree", "2,2"], ["--tree needs a drafter", "add --draft SPEC"]),
    (["--target", "random:tiny", "--compare", "--draft-p-min", "0.5"], ["--draft-p-min, --compare need a drafter"]),
    # a prompt that leaves no room for a new token (item 12): it ran, and printed "0 new tokens ... alpha nan"
    (["x" * 256], ["the prompt has 256 tokens but the context holds 256", "no room for a new token"]),
    (["x" * 20000], ["the prompt is over 14,336 bytes, more than the context can hold"]),
])
def test_bad_options_and_names_are_one_clean_line(tmp_path, args, phrases):
    r = run_python(*GENERATE, *args, *(["--max-new-tokens", "2"] if "--max-new-tokens" not in args else []),
                   env=offline_env(tmp_path))
    assert_one_clean_line(r, *phrases)
    assert len(r.stderr.strip().splitlines()) == 1
    assert r.stdout == ""  # the prompt is not echoed before a refusal
    assert cache_entries(tmp_path) == []


def test_a_huge_stdin_prompt_is_refused_without_reading_it_all():
    # an 11 MB prompt used to be tokenized in full (8 s, 2 GB) before being refused
    r = run_python(*GENERATE, "-", stdin="x" * 3_000_000)
    assert_one_clean_line(r, "the prompt on stdin is over 14,336 bytes, more than the context can hold")
    assert r.stdout == ""
    limit = prompt_byte_limit(load(None, "target").tokenizer, 256)
    stdin = io.BytesIO(b"x" * 10 * limit)
    with pytest.raises(ValueError, match="over"):
        read_prompt("-", limit, stdin)
    assert stdin.tell() == limit + 1  # read no further than the limit
    assert read_prompt("-", limit, io.BytesIO(b"x" * limit)) == "x" * limit


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_a_foreign_target_without_draft_decodes_plainly_with_a_note(tmp_path):
    # random:tiny has GPT-2's tokenizer: it used to be paired with the shipped draft and fail on "different tokenizers"
    r = run_python(*GENERATE, "--target", "random:tiny", "hi", "--max-new-tokens", "3", "--json",
                   env=offline_env(tmp_path))
    assert r.returncode == 0, r.stderr
    note = [line for line in r.stderr.splitlines() if "note:" in line]
    assert note == ["npspec.generate: note: no --draft for the target random:tiny, so it decodes plainly (the shipped "
                    "draft is the shipped target's); add --draft SPEC or --draft ngram to decode speculatively"]
    stats = json.loads(r.stdout)["stats"]
    assert stats["new_tokens"] == stats["rounds"] == 3 and stats["drafted"] == 0
    shipped = run_python(*GENERATE, "--target", ROOT / "weights" / "shakespeare" / "target", "--json",
                         "--max-new-tokens", "3", "--temperature", "0")
    assert "note:" not in shipped.stderr and json.loads(shipped.stdout)["stats"]["drafted"] > 0  # its own draft


def test_the_summary_prints_a_dash_for_a_ratio_with_nothing_to_count():
    # it printed "alpha nan" with --gamma 0, where --json prints null
    r = run_python(*GENERATE, "--gamma", "0", "--max-new-tokens", "3")
    assert r.returncode == 0 and "3 new tokens in 3 rounds, alpha -, 1.00 tokens/round" in r.stderr
    assert summary(Stats(stop_reason="interrupted")) == \
        "0 new tokens in 0 rounds, alpha -, - tokens/round, - tokens/s (stop: interrupted)"
    assert summary(Stats(new_tokens=1, rounds=1, stop_reason="eos")).startswith("1 new token in 1 round, alpha -")


def test_a_denormal_temperature_leaks_no_warning():
    # --kernel-probe off: a first run at these verify rows would add the probe's note (a line of its own)
    r = run_python(*GENERATE, "--temperature", "1e-320", "--max-new-tokens", "4", "--kernel-probe", "off")
    assert r.returncode == 0 and "Warning" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_non_utf8_stdin_is_one_clean_line():
    r = run_python(*GENERATE, "-", stdin=b"ROMEO\xff\xfe:", text=False)
    assert r.returncode == 1 and b"not valid UTF-8" in r.stderr and b"Traceback" not in r.stderr
    assert r.stdout == b""


def test_debug_shows_the_traceback():
    r = run_python(*GENERATE, "--max-new-tokens", "0", "--debug")
    assert r.returncode != 0 and "Traceback" in r.stderr and "max_new_tokens must be an integer >= 1" in r.stderr


def test_spec_help_names_the_forms():
    r = run_python(*GENERATE, "--help")
    assert r.returncode == 0
    assert "random:<shape>" in r.stdout and "org/name" in r.stdout


# --- npspec convert ------------------------------------------------------------------------


def test_convert_cli_missing_source(tmp_path):
    r = run_python(*CONVERT, tmp_path / "missing", tmp_path / "out")
    assert_one_clean_line(r, "not a directory", prog="npspec.convert")
    assert not (tmp_path / "out").exists()


def test_convert_cli_unwritable_out_dir(tmp_path):
    from npspec.sources.huggingface import write_hf_checkpoint
    from npspec.model.gpt2 import GPT2Config
    from npspec.sources.init import init_tensors

    config = GPT2Config(n_vocab=2048, n_ctx=16, n_embd=8, n_head=2, n_layer=1, eos_token_id=0)
    src = write_hf_checkpoint(tmp_path / "hf", init_tensors(config, 3), config)
    (src / "tokenizer.json").write_text((ROOT / "weights" / "shakespeare" / "target" / "tokenizer.json").read_text())
    (tmp_path / "file").write_text("")
    r = run_python(*CONVERT, src, tmp_path / "file" / "out")
    assert_one_clean_line(r, f"{tmp_path / 'file'} is a file, not a directory", "choose another OUT_DIR",
                          prog="npspec.convert")
    assert r.stderr.startswith("npspec.convert: error: cannot create")


# --- the README's table of messages ------------------------------------------------------------------


def test_bad_input_table_is_in_readme():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Troubleshooting"):]
    for phrase in ("has no model.safetensors", "not a readable safetensors file", "missing tensor", "the lock file",
                   "is not divisible by n_head", "unknown model", "not in the local Hugging Face cache",
                   "draft vocabulary", "different tokenizers", "the prompt has",
                   "max_new_tokens must be an integer >= 1", "cannot write npspec's cache",
                   "--gamma 0 is plain decoding, with no drafter", "needs a drafter", "--trace adds a record",
                   "no room for a new token", "the prompt on stdin is over", "cannot write --html",
                   "is more than the", "decodes plainly", "(stop: interrupted)", "must be a number",
                   "prompt_ids must be a 1-D sequence", "rollback's length must be an integer",
                   "p or q holds NaN or an infinity"):
        assert phrase in section, phrase



def test_readme_synopsis_names_every_option():
    from npspec.cli import convert
    from npspec.decode import RULES
    from npspec.cli.options import build_parser
    readme = (ROOT / "README.md").read_text()
    synopsis = readme[readme.index("npspec generate [PROMPT"):readme.index("npspec bench NAME")]
    generate, convert_ = synopsis.split("npspec convert")
    for part, parser in ((generate, build_parser()), (convert_, convert.build_parser("npspec convert"))):
        options = {o for a in parser._actions for o in a.option_strings if o.startswith("--")} - {"--help"}
        assert options <= set(re.findall(r"--[a-z][a-z-]*", part)), options  # --verify and --force were missing
    assert f"[--verify {'|'.join(RULES)}]" in generate


@pytest.mark.parametrize("role", ["target", "draft"])
def test_a_kernel_options_help_says_the_probe_chooses_its_default(role):
    from npspec.cli.options import build_parser
    from npspec.kernels.registry import role_candidates
    [action] = [a for a in build_parser()._actions if a.dest == f"{role}_kernel"]
    text = " ".join(action.help.split())
    assert f"the fastest of {', '.join(role_candidates(role))} on this machine, as timed by --kernel-probe" in text
    assert "compiled-panels with the fast extra" not in text  # the draft's used to name it the default

"""Hostile command lines for the decoding options: huge sizes, options that cannot apply, run as a user would.

Each case runs `python -m npspec.generate` in a subprocess whose address space is capped (RLIMIT_AS, MEMORY_CAP):
a size that allocates without a bound fails there with a MemoryError traceback instead of the one-line error.
Every refusal is exit status 1, one line `npspec.generate: error: ...`, nothing on stdout. Caches are temporary
(test_cli.offline_env). Numbers are read by one rule, ASCII only (npspec.cli.console.integer and number).
"""

import io
import os
import re
import resource
import subprocess
import sys

import pytest

from npspec.cli.console import parse
from npspec.decode.drafters import MAX_NGRAM
from npspec.cli.inputs import thread_count
from npspec.cli.options import build_parser, checked
from npspec.sources.quantize import parse_scheme
from npspec.decode.rules.trees import MAX_TREE_NODES
from npspec.kernels.registry import REGISTRY

from conftest import ROOT
from test_cli import assert_one_clean_line, offline_env

MEMORY_CAP = 2 * 1024 ** 3  # bytes of address space: np.eye(50257) alone asks for 18.8 GiB
TINY_PAIR = ("--target", "random:tiny", "--draft", "random:tiny-draft")  # GPT-2's vocabulary, tiny layers


def capped_generate(tmp_path, *args):
    """Run `python -m npspec.generate args` with at most MEMORY_CAP bytes of address space; the CompletedProcess."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))

    full_env = {k: v for k, v in {**os.environ, **offline_env(tmp_path)}.items() if v is not None}
    return subprocess.run([sys.executable, "-m", "npspec.generate", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=full_env, timeout=120, preexec_fn=cap)


@pytest.mark.parametrize("args, phrases", [
    (("--draft", "ngram", "--ngram-max", 10 ** 12), (f"--ngram-max) is at most {MAX_NGRAM}", "got 1000000000000")),
    (("--draft", "ngram", "--ngram-min", MAX_NGRAM + 1, "--ngram-max", MAX_NGRAM + 1), (f"at most {MAX_NGRAM}",)),
    (("--tree", "1000000,1000000"), (f"more than {MAX_TREE_NODES} nodes", "smaller --tree")),
    (("--tree", "9" * 26), (f"more than {MAX_TREE_NODES} nodes",)),
    (("--tree", "1000000"), (f"more than {MAX_TREE_NODES} nodes",)),  # it used to propose nothing, silently
    (("--tree", ",".join(["2"] * 10000)), ("10000 levels", f"more than {MAX_TREE_NODES} nodes")),
    (("--tree-budget", MAX_TREE_NODES + 1), (f"--tree-budget must be >= 1 and at most {MAX_TREE_NODES}",)),
], ids=["ngram-max", "ngram-min", "tree-wide", "tree-huge-int", "tree-one-level", "tree-deep", "tree-budget"])
def test_a_size_past_its_bound_is_one_line_before_anything_loads(tmp_path, args, phrases):
    r = capped_generate(tmp_path, *args)
    assert_one_clean_line(r, *phrases)
    assert r.stdout == ""


@pytest.mark.parametrize("args, phrases", [
    (("--draft", "ngram", "--draft-kernel", "gemm"), ("--draft-kernel", "--draft ngram has no model")),
    (("--draft-kernel", "dequant-panels"), ("--draft-kernel dequant-panels", "holds float32 weights", "int8-g64:")),
    (("--gamma", 0, "--draft-kernel", "gemv-rows"), ("--draft-kernel would do nothing",)),
], ids=["ngram", "float-draft", "no-drafter"])
def test_a_draft_kernel_that_would_do_nothing_is_refused(tmp_path, args, phrases):
    r = capped_generate(tmp_path, *args, "--max-new-tokens", 4)
    assert_one_clean_line(r, *phrases)
    assert r.stdout == ""


@pytest.mark.skipif(not REGISTRY["compiled-quant"].available(), reason="compiled-quant needs the fast extra (numba)")
def test_a_codes_kernel_for_a_float_target_names_the_target_option(tmp_path):
    # it said "kernel='compiled-quant' ... or drop kernel='compiled-quant'", the library's words, not the command's
    r = capped_generate(tmp_path, "--target-kernel", "compiled-quant", "--max-new-tokens", 4)
    assert_one_clean_line(r, "--target-kernel compiled-quant reads a quantized target's int codes", "holds float32",
                          "--target int8-g64:SPEC", "or drop --target-kernel compiled-quant")
    assert r.stdout == ""


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_the_quantized_draft_still_takes_the_dequantizing_kernel(tmp_path):
    r = capped_generate(tmp_path, "--draft", "int8-g64:self", "--draft-kernel", "dequant-panels", "--temperature", 0,
                        "--max-new-tokens", 4, "--json")
    assert r.returncode == 0, r.stderr
    assert '"ids"' in r.stdout


@pytest.mark.slow  # long (>10 s): CI's second step
def test_a_dynamic_tree_at_temperature_above_0_on_gpt2s_vocabulary_runs_in_bounded_memory(tmp_path):
    # its one-hot q rows came from np.eye(n_vocab): 18.8 GiB for GPT-2's 50257 ids
    r = capped_generate(tmp_path, *TINY_PAIR, "--tree-budget", 8, "--temperature", 0.8, "--max-new-tokens", 3,
                        "--json", "--trace")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and '"tree"' in r.stdout


@pytest.mark.slow  # long (>10 s): CI's second step
def test_a_tree_at_the_node_bound_is_accepted_and_runs(tmp_path):
    # (a tree larger than a small context is refused too: test_hostile_prompts, with the API)
    r = capped_generate(tmp_path, "--tree", f"{MAX_TREE_NODES // 2},1", "--temperature", 0, "--max-new-tokens", 2)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ROMEO:")


def test_every_number_a_command_reads_is_ascii_only():
    """int() and float() also read other scripts' digits: --gamma ٣ and --top-k １２ were taken while
    NPSPEC_NUM_THREADS=٣ was refused. Every option that reads a number now refuses them (a usage error, status 2)."""
    numeric = [a for a in build_parser()._actions if a.type is not None]
    assert {"--gamma", "--top-k", "--temperature", "--tree", "--ngram-max"} <= {a.option_strings[0] for a in numeric}
    for action in numeric:
        for digits in ("٣", "１２", "٠.٥"):
            err = io.StringIO()
            args, status = parse(build_parser(err=err), [action.option_strings[0], digits], err, "npspec.generate")
            assert status == 2 and f"'{digits}'" in err.getvalue(), (action.option_strings, digits, args)
        args, status = parse(build_parser(), [action.option_strings[0], "3"], None, "npspec.generate")
        assert status is None and getattr(args, action.dest) in (3, (3,)), action.option_strings  # ASCII: read
    for value in ("١٢", "１２"):
        with pytest.raises(ValueError, match="NPSPEC_NUM_THREADS=.* is not a positive integer"):
            thread_count(None, environ={"NPSPEC_NUM_THREADS": value}, cpus=2)
    assert thread_count(None, environ={"NPSPEC_NUM_THREADS": " 2 "}, cpus=4) == 2


def test_readme_states_the_policy_bounds():
    table = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"at most {MAX_NGRAM} (a policy, `npspec.decode.drafters.MAX_NGRAM`" in table
    assert f"At most {MAX_TREE_NODES} nodes (a policy, `npspec.decode.rules.trees.MAX_TREE_NODES`" in table


@pytest.mark.parametrize("args, says", [
    (("--gamma", "0", "--verify", "traversal"), "--gamma 0 is plain decoding, with no drafter, so --verify traversal "
                                                 "would do nothing"),
    (("--gamma", "0", "--verify", "rsd"), "so --verify rsd would do nothing"),
    (("--target", "random:tiny", "--verify", "exact-match"), "--verify exact-match needs a drafter")])
def test_a_rule_with_nothing_to_verify_is_refused_before_anything_loads(args, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        checked(build_parser().parse_args(list(args)))


@pytest.mark.parametrize("scheme", ["int\u0668-ch", "int\u0664-g\u0666\u0664", "int4-g\uff1064"])
def test_a_scheme_reads_ascii_digits_only(scheme):
    with pytest.raises(ValueError, match="unknown quantization scheme"):
        parse_scheme(scheme)

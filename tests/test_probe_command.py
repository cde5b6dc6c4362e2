"""The kernel probe as npspec.load and the command use it (one npspec.kernels.probe.choose_kernels call each).

The command-line tests time the shipped pair for real, and check only when and where the choice is stored, never
which kernel wins.
"""

import io
import json

import pytest

from npspec.cli.generate import main
from npspec.cli.kernel_choice import verify_rows
from npspec.cli.harness import plain_label
from npspec.decode import Options, SamplingParams, prepare
from npspec.decode.drafters import ModelDrafter, TreeDrafter
from npspec.kernels import probe
from npspec.kernels.registry import REGISTRY, role_candidates
from npspec.sources import choices as choice
from npspec.sources import load

from conftest import tiny_model


def test_the_target_is_probed_at_its_own_verify_rows(tiny):
    # npspec generate times the target at the rows its rounds multiply: gamma + 1 for a chain, every node and the root
    # for a tree, one for plain decoding; a gamma clamped by max_new_tokens is the clamped one's
    def job(drafter, gamma, new=20):
        return prepare(tiny, drafter, [1, 2, 3], Options(new, gamma, SamplingParams(0.0)))
    assert [verify_rows(job(ModelDrafter(tiny), g)) for g in (1, 3, 6)] == [2, 4, 7]
    assert verify_rows(job(ModelDrafter(tiny), 6, new=3)) == 3  # gamma clamped to max_new_tokens - 1 = 2
    assert verify_rows(job(None, 4)) == verify_rows(job(ModelDrafter(tiny), 0)) == 1
    assert verify_rows(job(TreeDrafter(tiny, (3, 2), "top-k"), 4)) == 1 + 3 + 3 * 2  # the tree's depth, not gamma's
    assert verify_rows(job(TreeDrafter(tiny, (3, 2), "top-k"), 1)) == 1 + 3  # cut at gamma's depth


def test_load_chooses_each_roles_kernel_unless_one_is_given(tmp_path):
    target = load(None, "target", cache_dir=tmp_path, probe="off")
    assert target.kernel == role_candidates("target")[0]
    assert load(None, "target", cache_dir=tmp_path, kernel="gemv-rows").kernel == "gemv-rows"
    with pytest.raises(ValueError, match="kernel probe mode"):
        load(None, "draft", cache_dir=tmp_path, probe="sometimes")
    assert tiny_model().kernel == "gemm-blocks"  # a Model built directly: registry.STATIC_DEFAULT


def test_load_gives_a_role_the_cached_prefill_of_its_chosen_kernel_and_none_with_probe_off(tmp_path, notes):
    """The kernel's choice and its prefill's, stored as a probe would have: load reads both and measures nothing."""
    off = load(None, "draft", cache_dir=tmp_path, probe="off")
    assert off.prefill_rows == 0 and not (tmp_path / choice.CACHE_FILE).exists()
    path = tmp_path / choice.CACHE_FILE
    candidates = role_candidates("draft")
    kernel = candidates[-1]
    choice.store_choice(path, choice.machine_key("draft", candidates, [probe.model_shapes(off)], 1),
                        {"kernel": kernel, "threads": 1})
    choice.store_choice(path, choice.machine_key("prefill", [kernel], [probe.model_shapes(off)], 1,
                                                 rows=probe.PREFILL_LENGTHS), {"prefill_rows": 16})
    before = len(notes())
    model = load(None, "draft", cache_dir=tmp_path)
    assert (model.kernel, model.threads, model.prefill_rows) == (kernel, 1, 16) and notes()[before:] == []


def generate(*args):
    """(exit status, the --json stats or stderr) of a short greedy run of the shipped pair at 2 threads."""
    out, err = io.StringIO(), io.StringIO()
    status = main(["--temperature", "0", "--max-new-tokens", "3", "--json", "--quiet", "--threads", "2", *args],
                  out=out, err=err)
    return status, (json.loads(out.getvalue())["stats"] if status == 0 else err.getvalue())


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_the_command_probes_only_once_every_check_has_passed_and_as_kernel_probe_says(tmp_path, monkeypatch):
    # the shipped pair loads in place, so the probe's choices.json is the one file the cache can gain
    monkeypatch.setenv("NPSPEC_CACHE", str(tmp_path))
    path = tmp_path / choice.CACHE_FILE
    status, message = generate("x" * 2000)  # refused by the prompt check, after both models loaded
    assert status == 1 and "the prompt has 2000 tokens" in message and not path.exists()
    for mode in ("off", "bypass"):
        status, stats = generate("--kernel-probe", mode)
        assert status == 0 and not path.exists()
    assert all(stats[f"{role}_kernel"] in role_candidates(role) for role in ("target", "draft"))
    off = generate("--kernel-probe", "off")[1]
    assert [off["target_kernel"], off["draft_kernel"]] == [role_candidates(r)[0] for r in ("target", "draft")]
    assert (off["target_prefill_rows"], off["draft_prefill_rows"]) == (0, 0)  # unmeasured: every prefill a GEMM
    status, stats = generate()  # cached: each role with more than one candidate measured once and stored
    stored = [(json.loads(key), r) for key, r in choice.read_choices(path).items()]
    records = {}
    for key, r in [(key, r) for key, r in stored if key["role"] != "prefill"]:
        records.setdefault(key["role"], set()).add((r["kernel"], r["threads"]))
    assert status == 0 and records["target"] == {(stats["target_kernel"], stats["target_threads"])}
    assert (stats["draft_kernel"], stats["draft_threads"]) in records["draft"]  # a record per thread pool timed
    pools = {REGISTRY[k].pool for k in role_candidates("draft")} & {REGISTRY[k].pool for k in role_candidates("target")}
    assert len(records["draft"]) == len(pools)  # 2 threads and 1: always timed
    if REGISTRY[stats["target_kernel"]].pool in pools:  # both roles on one kind of thread
        assert REGISTRY[stats["draft_kernel"]].pool == REGISTRY[stats["target_kernel"]].pool
    prefills = {(*key["candidates"], key["threads"], r["prefill_rows"]) for key, r in stored if key["role"] == "prefill"}
    assert all((f"{stats[f'{role}_kernel']}/{REGISTRY[stats[f'{role}_kernel']].version}", stats[f"{role}_threads"],
                stats[f"{role}_prefill_rows"]) in prefills for role in ("target", "draft"))  # each model's, as chosen
    status, given = generate("--target-kernel", "gemv-rows", "--draft-kernel", "gemm")
    assert (given["target_kernel"], given["draft_kernel"]) == ("gemv-rows", "gemm")


def test_the_command_says_when_it_measures_on_stderr_as_before(tmp_path, monkeypatch):
    """The probe's notes reach the command's stderr through the "npspec" logger, one "npspec: " line each."""
    monkeypatch.setenv("NPSPEC_CACHE", str(tmp_path))
    out, err = io.StringIO(), io.StringIO()
    assert main(["--temperature", "0", "--max-new-tokens", "2", "--quiet", "--threads", "2", "--kernel-probe", "bypass",
                 "--draft-kernel", "gemm", "x"], out=out, err=err) == 0
    lines = [line for line in err.getvalue().splitlines() if "timing" in line]  # (a compile may be announced too)
    assert len(lines) == 2 and lines[0].startswith("npspec: timing the target's kernels ") \
        and "beside its draft (gemm)" in lines[0]
    assert lines[1].startswith("npspec: timing prompts of ")


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_a_draft_model_the_job_does_not_use_is_neither_measured_nor_made_a_drafter(tmp_path, monkeypatch):
    """--max-new-tokens 1 clamps gamma to 0: the job drops its drafter, the draft is not probed, the target is timed
    alone, and decoding runs (a drafter rebuilt from no draft model raised TypeError)."""
    monkeypatch.setenv("NPSPEC_CACHE", str(tmp_path))
    out, err = io.StringIO(), io.StringIO()
    status = main(["--temperature", "0", "--max-new-tokens", "1", "--json", "--quiet", "x"], out=out, err=err)
    assert status == 0, err.getvalue()
    stats = json.loads(out.getvalue())["stats"]
    records = [json.loads(key) for key in choice.read_choices(tmp_path / choice.CACHE_FILE)]
    assert stats["draft_kernel"] is None and stats["draft_prefill_rows"] is None
    assert sorted((r["role"], r["partner"]) for r in records) == [("prefill", None), ("target", None)]


def test_a_plain_decoding_is_named_by_its_kernel_and_by_its_threads_when_they_differ_from_those_asked_for():
    model = tiny_model().with_kernel("gemv-panels", 2)
    assert plain_label(model, 2) == "gemv-panels"
    assert plain_label(model, 4) == "gemv-panels at 2 threads"
    assert plain_label(model.with_kernel("gemv-panels", 1), 2) == "gemv-panels at 1 thread"

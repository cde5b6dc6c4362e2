"""npspec.testing.zoo: the bug zoo, every class of lossy sampler the engines shipped, as the kit names it.

BUGS holds one Bug per class: its name (the name the kit's reports print), what it does, the engines and issues
that shipped it, the checks that catch it. A finding of a class carries `named(name)`, "[bug class NAME, shipped in ENGINES]"; `named(name)` is the suffix a finding of that
class carries; `zoo_table()` renders BUGS as README's table (tests/test_readme.py keeps the two equal). Imports
nothing from npspec: probes, rounds and blocks read it.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Bug:
    """One class of sampler bug: name (as reports print it), what it does, shipped (engine and issue, "" for a
    textbook slip), checks (the kit's checks that catch it)."""

    name: str
    what: str
    shipped: str
    checks: str


BUGS = [
    Bug("uniform-reused", "one uniform drives two draws (the draft's noise reused by the test or the recovery)",
        "vLLM 47386", "check_sampler, check_round"),
    Bug("constant-uniform", "a hard-coded test uniform (u = 0 keeps every draft the target can emit)",
        "vllm-ascend 13766", "check_sampler, check_round"),
    Bug("non-strict-test", "u <= p/q: u = 0 keeps a draft the target gives probability 0",
        "SGLang 35771, 35788", "check_sampler, check_round"),
    Bug("p-unwarped", "warping applied to the draft's row only (the target's p unwarped)",
        "vLLM 10198", "check_round"),
    Bug("argmax-draft", "a greedy proposal reported with its softmax q",
        "transformers 32867, rtp-llm 1311, xLLM 2175", "check_sampler, check_round"),
    Bug("q-unwarped", "q is not the row the draft was sampled from (top-k draft, unwarped q)",
        "transformers 47932", "check_sampler (50,257 ids), check_round"),
    Bug("precision-mismatch", "the draft sampled from bf16 probabilities, scored with float32 ones",
        "DeepSpec 31", "check_round (uniforms at CDF cells' edges)"),
    Bug("bonus-from-draft", "the bonus token drawn from the draft's row, not the target's",
        "rtp-llm 1295", "check_round"),
    Bug("rows-off-by-one", "draft i tested against the target's row of the next position",
        "TensorRT-LLM 15098", "check_round"),
    Bug("block-token-test", "block verification with the token-wise test and the token rule's residual",
        "vllm-ascend 7807/7808", "check_block_rule"),
    Bug("block-q-one", "block verification taking q = 1 with a cumulative product (n-gram drafts)",
        "vllm-ascend 7603/7839", "check_block_rule"),
    Bug("placeholder-id", "a -1 placeholder or an id outside the vocabulary used as a draft or token",
        "vLLM 50939", "check_sampler, check_round, check_block_rule"),
    Bug("inputs-mutated", "the caller's arrays (logits, p, q, uniforms) written in place",
        "vllm-ascend 2881", "check_sampler, check_round, check_block_rule"),
    Bug("no-residual", "after a rejection the correction drawn from p, not norm(max(0, p - q))",
        "", "check_sampler, check_round"),
]

BY_NAME = {b.name: b for b in BUGS}


def named(name):
    """The suffix a finding of class `name` carries: ' [bug class NAME, shipped in ENGINES]' ('' for no class)."""
    bug = BY_NAME.get(name)
    if bug is None:
        return ""
    return f" [bug class {name}" + (f", shipped in {bug.shipped}]" if bug.shipped else "]")


def zoo_table():
    """BUGS as a Markdown table: class, what it does, engine and issue, the checks that catch it, what the report
    says."""
    rows = ["| class | what it does | shipped in | caught by | the report says |", "|---|---|---|---|---|"]
    for b in BUGS:
        rows.append(f"| `{b.name}` | {b.what} | {b.shipped or '(textbook)'} | {b.checks} | `{named(b.name).strip()}` |")
    return "\n".join(rows)

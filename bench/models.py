"""The models the benchmarks run (the shipped pair, in-memory random GPT-2 shapes) and the prompts they run on.

A name is "shipped:target", "shipped:draft" or "random:<shape>" with a shape of
npspec.sources.SHAPES (gpt2, gpt2-medium, gpt2-large, distilgpt2, ...). Random models are built in
memory with npspec.sources.random_model (gpt2-large: 3.1e9 bytes of float32; build at most two
large ones at a time). Every Model stores its block matrices column-major; `row_major` gives
the file's row-major layout for comparisons that call npspec.model.gpt2.gpt2 directly.

Prompts are PROMPT_LENGTH tokens: for the shipped pair, slices at fixed offsets of the
validation part of its training text (`validation_prompts`); for random weights, the start of
RANDOM_PROMPT in GPT-2's tokenizer, which every random model has (`random_prompt`).
"""

import gc

import numpy as np

from npspec.decode.evaluate import fixed_prompts, split_corpus
from npspec.kernels.layout import block_linears
from npspec.kernels.probe import choose_kernels
from npspec.sources import SHIPPED_PAIR, choice_store, gpt2_tokenizer, load, random_model, shipped_dir

PROMPT_LENGTH = 16
RANDOM_PROMPT = "The quick brown fox jumps over the lazy dog, and then the dog chases the fox around the"


def get(name, seed=0, role="target", threads=1, partner=None):
    """The Model called `name` (see the module docstring), decoding with `role`'s kernel and `threads`.

    role: "target" or "draft": the kernel is the role's, chosen as npspec.sources.load chooses it
    (npspec.kernels.probe.choose_kernels: measured once per machine, with its threads); a shipped model's role is its
    name's.
    threads: the kernel's worker threads. partner: None, or the draft Model a random target decodes beside (its
    kernel is then timed in rounds with it, as `npspec generate` does).
    Raises ValueError for another name.
    """
    if name.startswith("shipped:"):
        return load(None, name.split(":", 1)[1], threads=threads)
    if name.startswith("random:"):
        model = random_model(name.split(":", 1)[1], seed=seed, threads=threads)
        if role == "draft":
            return choose_kernels(None, model, threads, choice_store(), roles=("draft",)).draft.model
        return choose_kernels(model, partner, threads, choice_store(), roles=("target",)).target.model
    raise ValueError(f"unknown benchmark model {name!r}: use shipped:target, shipped:draft or random:<shape>")


def validation_ids(tokenizer, part=1):
    """The validation part of the shipped pair's training text (npspec.decode.evaluate.split_corpus), as ids of `tokenizer`.

    part=0: the training part instead (what calibration may read: bench.quantized's AWQ).
    """
    text = (shipped_dir(f"{SHIPPED_PAIR}/target").parent / "input.txt").read_text(encoding="utf-8")
    return tokenizer.encode(split_corpus(text)[part]).ids


def validation_prompts(val_ids, n):
    """n prompts of PROMPT_LENGTH ids at evenly spaced offsets of `val_ids` (npspec.decode.evaluate.fixed_prompts)."""
    return fixed_prompts(val_ids, n=n, length=PROMPT_LENGTH)


def random_prompt():
    """The prompt of the random-weight runs: the first PROMPT_LENGTH ids of RANDOM_PROMPT in GPT-2's tokenizer
    (the tokenizer of every random model)."""
    return gpt2_tokenizer().encode(RANDOM_PROMPT).ids[:PROMPT_LENGTH]


def row_major(params):
    """A copy of the parameter tree whose block matrices are stored row-major (C order), as in the file.

    Every other array is shared, not copied. Memory: one more copy of the block matrices
    (gpt2-large: 2.9e9 bytes); drop it as soon as it has been timed.
    """
    tree = _copy_tree(params)
    for lin in block_linears(tree):
        lin["w"] = np.ascontiguousarray(lin["w"])
    return tree


def column_major(params):
    """A copy of the parameter tree whose block matrices are column-major float32 arrays, which every kernel reads:
    a matrix a compiled kernel's Model holds packed (npspec.kernels.compiled.Packed) unpacked, the others shared."""
    tree = _copy_tree(params)
    for lin in block_linears(tree):
        if not isinstance(lin["w"], np.ndarray):
            lin["w"] = np.asarray(lin["w"])
    return tree


def _copy_tree(tree):
    """The nested dicts and lists of a parameter tree copied; the arrays themselves shared."""
    if isinstance(tree, dict):
        return {k: _copy_tree(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_copy_tree(v) for v in tree]
    return tree


def matrix_bytes(model):
    """Bytes a one-token forward streams from memory: every weight matrix plus the tied head `wte` (bytes).

    Excludes `wpe` (one row read per token), biases and layer-norm vectors (under 0.1%).
    """
    return model.params["wte"].nbytes + sum(lin["w"].nbytes for lin in block_linears(model.params))


def matmul_flops(model, m, n_past):
    """float32 operations of a forward over m new tokens after n_past cached ones (FLOPs).

    2 per multiply-add: the matrices and the head (2 * m * matrix parameters) plus attention
    (scores and weighted sum: 4 * d per query-key pair, query i seeing n_past + i + 1 keys).
    """
    c = model.config
    keys = m * n_past + m * (m + 1) // 2
    return 2 * m * matrix_bytes(model) // 4 + 4 * c.n_embd * keys * c.n_layer


def release():
    """Free the memory of models the caller has dropped (large random shapes)."""
    gc.collect()

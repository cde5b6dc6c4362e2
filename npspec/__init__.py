"""npspec: speculative decoding (Leviathan et al. 2023; Chen et al. 2023) on a NumPy GPT-2.

    import npspec
    target, draft = npspec.load(role="target"), npspec.load(role="draft")   # the shipped pair
    out = npspec.generate_text(target, "ROMEO:", draft=draft, gamma=4, temperature=0, max_new_tokens=64)
    print(out.text, out.stats.alpha)

The wings, from the math up (each imports only those before it; tests/test_layout.py checks): kernels (the
products and their batch-invariance contract, the probe that picks a role's), model (GPT-2's forward, the KV cache,
Model), decode (the round, the loop, the drafters, every acceptance rule), sources (SPECs, the cache, the file
format, Hugging Face conversion, quantized files), cli (the `npspec` command), testing (the conformance kit).
This file re-exports the API; notes go to the "npspec" logger (silent unless configured).
"""

import logging
import sys

from .cli.startup import exit_on_interrupt_while_starting

exit_on_interrupt_while_starting(getattr(sys, "orig_argv", sys.argv))  # a command's imports: Ctrl-C, one line

from dataclasses import dataclass  # noqa: E402 (after the handler: these imports are the slow part)

import numpy as np  # noqa: E402

from .sources import progress  # noqa: E402
from .decode import Generation, GenerationInterrupted, Stats, speculative_generate  # noqa: E402
from .decode.checks import check_target  # noqa: E402
from .decode.drafters import DynamicTreeDrafter, ModelDrafter, NgramDrafter, TreeDrafter  # noqa: E402
from .sources.errors import CheckpointError  # noqa: E402
from .sources.files import load_model  # noqa: E402
from .model.gpt2 import ContextOverflowError, GPT2Config, KVCache  # noqa: E402
from .model.model import Model  # noqa: E402
from .decode.sampling import check_integer  # noqa: E402
from .sources import load, random_model  # noqa: E402
from .decode.text import encode_prompt  # noqa: E402

__version__ = "0.1.0"

logging.getLogger("npspec").addHandler(logging.NullHandler())  # a library user sees notes once they configure logging


@dataclass
class TextGeneration(Generation):
    """A Generation plus its decoded `text` (new text only, prompt excluded)."""

    text: str = ""


def generate_text(target, prompt, draft=None, gamma=4, max_new_tokens=64, temperature=0.8, top_k=0, top_p=0.95, seed=0,
                  gamma_schedule="constant", verify="token"):
    """Generate text after `prompt` (a str) with `target`; with a `draft` and gamma > 0, speculatively.
    draft: a Model, a drafter (npspec.decode.drafters: NgramDrafter, ModelDrafter(model, p_min), ...), or None.
    gamma_schedule: "constant" or "heuristic" (npspec.decode.schedule.next_gamma). verify: a name of
    npspec.decode.rules.RULES (the acceptance rule, --verify's).
    (Not named `generate`: that name is the CLI module, `python -m npspec.generate`.)
    Returns a TextGeneration: `ids` (new ids), `text` (their decoding), `stats`. The same
    seed, models, prompt and options give the same output. See speculative_generate for the
    errors raised (a seed that is not an integer >= 0: TypeError or ValueError naming it; a target that is not a
    model: TypeError, checked before the prompt is encoded).
    """
    check_target(target)
    check_integer(seed, "seed", 0, " (np.random.default_rng's)")
    ids = encode_prompt(target.tokenizer, prompt, target.config.eos_token_id)
    gen = speculative_generate(target, draft, ids, max_new_tokens, gamma=gamma if draft is not None else 0,
                               temperature=temperature, top_k=top_k, top_p=top_p, rng=np.random.default_rng(seed),
                               gamma_schedule=gamma_schedule, verify=verify)
    return TextGeneration(gen.ids, gen.stats, gen.trace, target.tokenizer.decode(gen.ids))


__all__ = ["CheckpointError", "ContextOverflowError", "DynamicTreeDrafter", "GPT2Config", "Generation",
           "GenerationInterrupted", "KVCache", "Model", "ModelDrafter",
           "NgramDrafter", "Stats", "TextGeneration", "TreeDrafter", "generate_text", "load", "load_model", "progress",
           "random_model", "speculative_generate"]

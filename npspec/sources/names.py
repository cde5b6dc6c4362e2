"""The one registry of model names: the GPT-2 family's shapes and hub repositories, and tiny test shapes
(`random:<name>` builds any; a name with a repository downloads too). Imports npspec.model.gpt2 only.
"""

from dataclasses import dataclass

from ..model.gpt2 import GPT2Config


@dataclass(frozen=True)
class Name:
    """A model name: its shape (`config`) and, for a released checkpoint, its hub repository id (`hub`)."""

    config: GPT2Config
    hub: str | None = None


# Radford et al. 2019, Table 2; distilgpt2: Sanh et al. 2019. "tiny" shapes exist only as random: models.
_GPT2 = dict(n_vocab=50257, n_ctx=1024, eos_token_id=50256)
NAMES = {
    "gpt2": Name(GPT2Config(n_embd=768, n_head=12, n_layer=12, **_GPT2), "openai-community/gpt2"),
    "gpt2-medium": Name(GPT2Config(n_embd=1024, n_head=16, n_layer=24, **_GPT2), "openai-community/gpt2-medium"),
    "gpt2-large": Name(GPT2Config(n_embd=1280, n_head=20, n_layer=36, **_GPT2), "openai-community/gpt2-large"),
    "gpt2-xl": Name(GPT2Config(n_embd=1600, n_head=25, n_layer=48, **_GPT2), "openai-community/gpt2-xl"),
    "distilgpt2": Name(GPT2Config(n_embd=768, n_head=12, n_layer=6, **_GPT2), "distilbert/distilgpt2"),
    "tiny": Name(GPT2Config(n_embd=64, n_head=4, n_layer=2, **_GPT2)),
    "tiny-draft": Name(GPT2Config(n_embd=32, n_head=2, n_layer=1, **_GPT2)),
}
SHAPES = {name: n.config for name, n in NAMES.items()}  # every name: random:<name> builds it
HUB_NAMES = {name: n.hub for name, n in NAMES.items() if n.hub}  # the names with a hub repository

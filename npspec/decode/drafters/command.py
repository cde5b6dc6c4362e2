"""How a drafter without a draft model joins the command line: a Command, registered once in
npspec.decode.drafters.COMMANDS. `npspec generate --draft WORD` then builds it; the command adds its options,
refuses them without `--draft WORD`, and calls its check before any model loads. Imports nothing of npspec.
"""

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A drafter's command-line face.

    word: the `--draft` word; about: a few words for --draft's help and messages ("prompt lookup, no draft
    model"); certain: why model options (--draft-p-min, --tree) do not apply to it; options: (flag, argparse
    keyword arguments) pairs, each with default None (None = not given); check(args): raise ValueError, one line,
    for a bad value of its options; build(args, target): the Drafter for a loaded target (its config's n_vocab
    and eos_token_id).
    """

    word: str
    about: str
    certain: str
    options: tuple
    check: Callable
    build: Callable

    def given(self, args):  # -> list[str]
        """The flags of its options that `args` (argparse's namespace) sets."""
        return [flag for flag, _ in self.options if getattr(args, flag.lstrip("-").replace("-", "_")) is not None]

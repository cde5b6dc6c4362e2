"""How a drafter without a draft model joins the command line: a Command, registered once in
npspec.decode.drafters.COMMANDS; `npspec generate --draft WORD` adds its options, checks and builds it. Its check and
build take its options' values as keyword arguments, never the CLI's argparse namespace. Imports nothing of npspec.
"""

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A drafter's command-line face: word (the `--draft` word), about (a few words for the help), certain (why
    model options such as --draft-p-min do not apply), options ((flag, argparse keyword arguments) pairs, each
    default None = not given), check(**values) (ValueError, one line, for a bad value), build(target, **values)
    (the Drafter for a loaded target). values: {name: value}, one per option, named as in `names`."""

    word: str
    about: str
    certain: str
    options: tuple
    check: Callable
    build: Callable

    @property
    def names(self):  # -> list[str]: "--ngram-min" -> "ngram_min", argparse's dest
        return [flag.lstrip("-").replace("-", "_") for flag, _ in self.options]

    def given(self, values):  # {name: value} -> list[str]
        """The flags of its options whose value is not None."""
        return [flag for (flag, _), name in zip(self.options, self.names) if values.get(name) is not None]

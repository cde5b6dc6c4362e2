"""How a drafter without a draft model joins the command line (`--draft WORD`): a Command, registered once in
npspec.decode.drafters.COMMANDS. Imports nothing of npspec."""

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A drafter's command-line face: word (for --draft), about (for the help), certain (why model options do not
    apply), options ((flag, argparse keyword arguments) pairs, default None = not given), check(**values) (ValueError,
    one line), build(target, **values) -> its Drafter; values: {name: value} for its `names`."""

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

"""Prompt lookup (n-gram) drafting (Saxena 2023; transformers' prompt_lookup_num_tokens; vLLM's ngram) and its
command-line face (--draft ngram, --ngram-min, --ngram-max), registered in npspec.decode.drafters.COMMANDS.
Imports npspec.decode's sampling and types."""

from ..sampling import check_count, check_integer
from ..types import BaseDrafter, Proposal
from .command import Command

WORD = "ngram"  # the --draft word (a directory of that name: ./ngram)
MAX_NGRAM = 64  # policy: the longest n-gram NgramDrafter matches (--ngram-max); README's option table says it


class NgramDrafter(BaseDrafter):
    """Propose up to gamma ids that followed the latest earlier occurrence of the last n ids, n from ngram_max down
    to ngram_min (llama.cpp's 1..4), cut after the first EOS; no match, no proposal. Deterministic (q None). An index
    per n: O((ngram_max - ngram_min + 1) ngram_max) per id, no scan. ValueError for sizes outside [1, MAX_NGRAM],
    ngram_min > ngram_max, n_vocab < 1 or eos_token_id outside [0, n_vocab) (TypeError for a non-integer)."""

    source = WORD

    def __init__(self, n_vocab, eos_token_id=None, ngram_min=1, ngram_max=4):
        check_ngram_sizes(ngram_min, ngram_max)
        check_integer(n_vocab, "NgramDrafter's n_vocab", 1, " (the target's vocabulary: target.config.n_vocab)")
        if eos_token_id is not None:
            check_integer(eos_token_id, "NgramDrafter's eos_token_id", 0, " or None (target.config.eos_token_id)")
            if eos_token_id >= n_vocab:
                raise ValueError(f"NgramDrafter's eos_token_id ({eos_token_id}) is not an id of its vocabulary of "
                                 f"{n_vocab}; pass target.config.eos_token_id")
        self.n_vocab, self.eos = int(n_vocab), eos_token_id
        self.sizes = range(ngram_max, ngram_min - 1, -1)
        self.ids, self.index = [], {n: {} for n in self.sizes}

    def __repr__(self):
        return f"NgramDrafter(ngram_min={self.sizes[-1]}, ngram_max={self.sizes[0]})"

    def start(self, prompt_ids):  # [n_prompt] ids
        self.ids, self.index = [], {n: {} for n in self.sizes}

    def _append(self, ids):  # index the n-grams ending before each new position
        for token in ids:
            end = len(self.ids)  # the n-gram seq[end - n:end] is followed by `token`
            for n in self.sizes:
                if end >= n:
                    self.index[n][tuple(self.ids[end - n:end])] = end
            self.ids.append(int(token))

    def lookup(self, seq, gamma):  # list[int], int -> list[int]
        """The ids proposed after seq (the latest match's continuation)."""
        if len(seq) < len(self.ids) or seq[len(self.ids) - 1:len(self.ids)] != self.ids[-1:]:
            self.rollback(0)  # not the sequence it indexed: start over
        self._append(seq[len(self.ids):])
        for n in self.sizes:
            if len(seq) > n:
                end = self.index[n].get(tuple(seq[len(seq) - n:]))
                if end is not None:
                    return cut_after(seq[end:end + gamma], self.eos)
        return []

    def propose(self, seq, gamma, u, sampling):  # -> Proposal (deterministic: q None)
        return Proposal.chain(self.lookup(seq, gamma))

    def rollback(self, length):
        """Forget indexed ids from `length` on (rebuilds the index: O(length); the loop never needs it)."""
        if length < len(self.ids):
            ids = self.ids[:length]
            self.start(ids)
            self._append(ids)


def cut_after(ids, eos):  # list[int] -> list[int]
    return ids[:ids.index(eos) + 1] if eos is not None and eos in ids else list(ids)


def ngram_scan(seq, gamma, ngram_min=1, ngram_max=4, eos=None):  # list[int] -> list[int]
    """NgramDrafter's proposal by a plain O(len(seq) ngram_max) scan: the reference its index is tested against."""
    for n in range(ngram_max, ngram_min - 1, -1):
        if len(seq) > n:
            key = list(seq[len(seq) - n:])
            for end in range(len(seq) - 1, n - 1, -1):  # latest first; end < len(seq): something follows
                if list(seq[end - n:end]) == key:
                    return cut_after(list(seq[end:end + gamma]), eos)
    return []


def check_ngram_sizes(ngram_min, ngram_max):
    """ValueError unless both are integers in [1, MAX_NGRAM] and ngram_min <= ngram_max."""
    for name, v in (("ngram_min", ngram_min), ("ngram_max", ngram_max)):
        check_count(v, f"{name} (--{name.replace('_', '-')})")
        if v > MAX_NGRAM:
            raise ValueError(f"{name} (--{name.replace('_', '-')}) is at most {MAX_NGRAM}, the longest n-gram npspec "
                             f"matches (each is indexed at every position), got {v}; give a smaller size such as 4")
    if ngram_min > ngram_max:
        raise ValueError(f"ngram_min ({ngram_min}) is larger than ngram_max ({ngram_max}); "
                         "give --ngram-min <= --ngram-max")


def sizes(ngram_min=None, ngram_max=None):  # -> (ngram_min, ngram_max)
    return 1 if ngram_min is None else ngram_min, 4 if ngram_max is None else ngram_max


def check_options(ngram_min=None, ngram_max=None):
    check_ngram_sizes(*sizes(ngram_min, ngram_max))


def build(target, ngram_min=None, ngram_max=None):  # -> NgramDrafter
    return NgramDrafter(target.config.n_vocab, target.config.eos_token_id, *sizes(ngram_min, ngram_max))


COMMAND = Command(
    WORD, "prompt lookup, no draft model", "its proposals are certain",
    (("--ngram-min", dict(type=int, default=None, metavar="N",
                          help="with --draft ngram: the shortest n-gram to match (default 1)")),
     ("--ngram-max", dict(type=int, default=None, metavar="N",
                          help=f"with --draft ngram: the longest n-gram to match, tried first (default 4, at most "
                               f"{MAX_NGRAM})"))),
    check_options, build)

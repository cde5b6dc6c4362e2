"""npspec.testing.doubles: stand-ins to drive npspec's loop on a table (TableModel, ScriptedRng).

Imports numpy and npspec.model.gpt2.
"""

from dataclasses import dataclass

import numpy as np

from ..model.gpt2 import ContextOverflowError, tree_paths


class ScriptedRng:
    """Stands in for np.random.Generator in speculative_generate: random(n) hands out the next n scripted uniforms,
    records n in `sizes`, and raises AssertionError when the script runs out."""

    def __init__(self, values):
        self.values, self.sizes = [float(v) for v in values], []

    def random(self, n):
        self.sizes.append(n)
        out, self.values = self.values[:n], self.values[n:]
        assert len(out) == n, f"the script ran out: {n} uniforms asked, {len(out)} left"
        return np.array(out)


@dataclass(frozen=True)
class TableConfig:
    """The config fields npspec's loop reads: n_vocab, n_ctx, eos_token_id."""

    n_vocab: int
    n_ctx: int
    eos_token_id: int | None = None


class TableCache:
    """A 'cache' holding the ids fed so far; `length` and O(1)-style `rollback(n)` as KVCache."""

    def __init__(self, n_ctx):
        self.ids = []
        self.n_ctx = n_ctx

    @property
    def length(self):
        return len(self.ids)

    def rollback(self, length):
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll the cache back to {length}: it holds {self.length} positions")
        del self.ids[length:]

    def keep(self, rows, start):
        """KVCache.keep: the ids at positions `rows` move to `start, ...`; the cache ends there."""
        kept = [self.ids[int(r)] for r in rows]
        del self.ids[start:]
        self.ids.extend(kept)


class TableModel:
    """Stands in for npspec.model.model.Model, with logits(seq) -> `[n_vocab]` after the ids seq: forward, prefill and
    forward_tree return float32 `[n_new, n_vocab]`, raise ContextOverflowError past n_ctx and count in `calls`."""

    def __init__(self, logits, n_vocab, n_ctx=64, eos_token_id=None):
        self.logits = logits
        self.config = TableConfig(n_vocab, n_ctx, eos_token_id)
        self.tokenizer = None
        self.source = "table"
        self.calls = 0

    @classmethod
    def from_table(cls, table, n_vocab, n_ctx=64, eos_token_id=None):
        """A TableModel whose softmax is `table` (a row of Fractions or floats): logits = log(prob), -inf at 0."""
        def logits(seq):
            row = np.array([float(v) for v in table(seq)])
            with np.errstate(divide="ignore"):
                return np.log(row)
        return cls(logits, n_vocab, n_ctx, eos_token_id)

    def new_cache(self):
        return TableCache(self.config.n_ctx)

    def forward(self, ids, cache):  # [n_new] -> [n_new, n_vocab] float32
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        if cache.length + len(ids) > self.config.n_ctx:
            raise ContextOverflowError(
                f"{cache.length} cached + {len(ids)} new positions exceed n_ctx={self.config.n_ctx}")
        self.calls += 1
        rows = []
        for i in ids:
            cache.ids.append(i)
            rows.append(np.asarray(self.logits(tuple(cache.ids)), dtype=np.float32))
        return np.array(rows, dtype=np.float32).reshape(len(ids), self.config.n_vocab)

    def prefill(self, ids, cache):  # [n_new] -> [n_new, n_vocab] float32
        return self.forward(ids, cache)

    def forward_tree(self, ids, parents, cache):  # [n_new], [n_new] -> [n_new, n_vocab] float32
        """Model.forward_tree: row i's logits after the cached ids and its path (npspec.model.gpt2.tree_paths)."""
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        if cache.length + len(ids) > self.config.n_ctx:
            raise ContextOverflowError(
                f"{cache.length} cached + {len(ids)} new positions exceed n_ctx={self.config.n_ctx}")
        self.calls += 1
        rows = [np.asarray(self.logits(tuple(cache.ids + [ids[r] for r in path])), dtype=np.float32)
                for path in tree_paths(parents)]
        cache.ids.extend(ids)
        return np.array(rows, dtype=np.float32).reshape(len(ids), self.config.n_vocab)

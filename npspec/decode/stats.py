"""What a generation did: Stats (npspec's counts and vLLM's speculative-decoding metrics, with merge() for pooling
runs), the Generation (new ids, stats, trace), the trace record of a round (from its npspec.decode.types.Outcome),
and GenerationInterrupted. Imports the standard library only.
"""

from dataclasses import asdict, dataclass, field, fields


@dataclass
class Stats:
    """What a generation did. Times in seconds (prefill included, model loading excluded).

    Besides npspec's own counts, vLLM's speculative-decoding metrics (vllm v1/spec_decode/metrics.py)
    so figures compare across engines: num_drafts (rounds with at least one proposed token),
    num_draft_tokens (tokens proposed), num_accepted_tokens, mean_acceptance_length
    (1 + accepted / num_drafts) and acceptance_rate_by_position (accepted at position i / num_drafts).
    """

    new_tokens: int = 0
    rounds: int = 0
    drafted: int = 0  # draft tokens proposed, cut after an accepted EOS
    accepted: int = 0  # drafts kept
    rejected: int = 0  # drafts tested and rejected (at most one per round)
    target_forwards: int = 0
    draft_forwards: int = 0
    seconds: float = 0.0
    seconds_draft: float = 0.0
    seconds_verify: float = 0.0
    stop_reason: str = ""  # "eos", "max_new_tokens", "context", or "interrupted" (GenerationInterrupted)
    tested_by_position: list = field(default_factory=list)  # [max k] drafts tested at position i+1
    accepted_by_position: list = field(default_factory=list)  # [max k] drafts kept at position i+1
    proposal_lengths: list = field(default_factory=list)  # [max k + 1] rounds that proposed k tokens, k = 0, 1, ...

    @property
    def alpha(self):
        """Per-token acceptance of the drafts actually tested: accepted / (accepted + rejected)."""
        tested = self.accepted + self.rejected
        return self.accepted / tested if tested else float("nan")

    @property
    def draft_acceptance(self):
        """accepted / drafted."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def tokens_per_round(self):
        return self.new_tokens / self.rounds if self.rounds else float("nan")

    @property
    def tokens_per_s(self):
        return self.new_tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def seconds_other(self):
        return self.seconds - self.seconds_draft - self.seconds_verify

    @property
    def acceptance_by_position(self):
        """[max k] accepted / tested at each draft position 1, 2, ... (nan where none was tested)."""
        return [a / t if t else float("nan") for a, t in zip(self.accepted_by_position, self.tested_by_position)]

    @property
    def rounds_without_proposal(self):
        """Rounds in which the drafter proposed nothing (plain target steps)."""
        return self.proposal_lengths[0] if self.proposal_lengths else 0

    @property
    def num_drafts(self):
        """vLLM's num_drafts: rounds with at least one proposed token."""
        return self.rounds - self.rounds_without_proposal

    @property
    def num_draft_tokens(self):
        """vLLM's num_draft_tokens: every proposed token (sum of the proposal lengths)."""
        return sum(k * n for k, n in enumerate(self.proposal_lengths))

    @property
    def num_accepted_tokens(self):
        """vLLM's num_accepted_tokens: drafts kept (= accepted)."""
        return self.accepted

    @property
    def mean_acceptance_length(self):
        """vLLM's mean_acceptance_length: 1 + accepted / num_drafts, the tokens a round with a proposal emits on average."""
        return 1 + self.accepted / self.num_drafts if self.num_drafts else float("nan")

    @property
    def acceptance_rate_by_position(self):
        """[max k] vLLM's per-position acceptance rate: drafts kept at position i / num_drafts."""
        return [a / self.num_drafts if self.num_drafts else float("nan") for a in self.accepted_by_position]

    def record_round(self, proposed, tested, accepted):
        """Count one round: k proposed, the first `tested` of them tested, `accepted` of those kept."""
        grow = max(proposed, tested) - len(self.tested_by_position)
        self.tested_by_position += [0] * grow
        self.accepted_by_position += [0] * grow
        self.proposal_lengths += [0] * (proposed + 1 - len(self.proposal_lengths))
        self.proposal_lengths[proposed] += 1
        for i in range(tested):
            self.tested_by_position[i] += 1
            self.accepted_by_position[i] += i < accepted
        self.accepted += accepted
        self.rejected += tested - accepted
        self.rounds += 1

    def merge(self, other):
        """Add another generation's counts, seconds and per-position lists to these (pooling runs: npspec.decode.evaluate,
        bench.drafters). stop_reason becomes "mixed" unless both are the same. Returns self."""
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, list):
                width = max(len(a), len(b))
                setattr(self, f.name, [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(width)])
            elif f.name == "stop_reason":
                self.stop_reason = a if a == b else "mixed"
            else:
                setattr(self, f.name, a + b)
        return self

    @classmethod
    def pooled(cls, stats):
        """One Stats summing `stats` (an iterable of Stats; merge). stop_reason: theirs if all agree, else "mixed"."""
        stats = list(stats)
        total = cls(stop_reason=stats[0].stop_reason if stats else "")
        for s in stats:
            total.merge(s)
        return total

    def as_dict(self):
        d = asdict(self)
        for key in ("alpha", "draft_acceptance", "tokens_per_round", "tokens_per_s", "seconds_other",
                    "acceptance_by_position", "rounds_without_proposal", "num_drafts", "num_draft_tokens",
                    "num_accepted_tokens", "mean_acceptance_length", "acceptance_rate_by_position"):
            d[key] = getattr(self, key)
        return d


@dataclass
class Generation:
    """The result of a generation: the new ids `[new_tokens]` (EOS included) and the Stats."""

    ids: list
    stats: Stats
    trace: list = field(default_factory=list)


class GenerationInterrupted(KeyboardInterrupt):
    """Ctrl-C (KeyboardInterrupt) during speculative_generate. `generation`: what was emitted before it, by whole
    rounds (a round cut short emits nothing), with stats.stop_reason "interrupted". A KeyboardInterrupt, so code
    that stops on Ctrl-C still does."""

    def __init__(self, generation):
        super().__init__("interrupted")
        self.generation = generation


def trace_record(outcome):
    """One round's `--trace` record (see npspec.decode.loop.speculative_generate) from its Outcome: a chain round's
    drafted ids with p(d_i), q(d_i) and u_i of each (u None at temperature 0); a tree round's kept path as
    "drafted" and its nodes as "tree", with p, q and u None."""
    ids, k = outcome.proposal.ids, outcome.drafted
    tree = outcome.tree
    record = {"drafted": [int(ids[i]) for i in outcome.path] if tree else [int(x) for x in ids[:k]],
              "accepted": outcome.accepted, "token": outcome.token, "proposed": outcome.proposed,
              "gamma": outcome.gamma, "p": None, "q": None, "u": None,
              "seconds_draft": outcome.seconds_draft, "seconds_verify": outcome.seconds_verify}
    if tree:
        record["tree"] = {"ids": [int(x) for x in ids], "parents": list(outcome.proposal.parents)}
    else:
        record.update(p=outcome.p_drafts[:k].tolist(), q=outcome.q_drafts[:k].tolist(),
                      u=None if outcome.u_tests is None else outcome.u_tests[:k].tolist())
    return record

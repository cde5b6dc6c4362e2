"""What a generation did: Stats (npspec's counts and vLLM's metrics, merge to pool runs), Generation, the trace
record of a round and GenerationInterrupted. Imports the standard library only."""

from dataclasses import asdict, dataclass, field, fields


@dataclass
class Stats:
    """What a generation did; seconds include the prefill, not loading. vLLM's metrics (v1/spec_decode/metrics.py):
    num_drafts (rounds with a proposal), num_draft_tokens, num_accepted_tokens, mean_acceptance_length (1 + accepted /
    num_drafts), acceptance_rate_by_position (kept at position i / num_drafts)."""

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
        """Per-token acceptance of the drafts tested: accepted / (accepted + rejected)."""
        tested = self.accepted + self.rejected
        return self.accepted / tested if tested else float("nan")

    @property
    def draft_acceptance(self):
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
        """[max k] accepted / tested at draft positions 1, 2, ... (nan where none was tested)."""
        return [a / t if t else float("nan") for a, t in zip(self.accepted_by_position, self.tested_by_position)]

    @property
    def rounds_without_proposal(self):
        return self.proposal_lengths[0] if self.proposal_lengths else 0

    @property
    def num_drafts(self):
        return self.rounds - self.rounds_without_proposal

    @property
    def num_draft_tokens(self):
        return sum(k * n for k, n in enumerate(self.proposal_lengths))

    @property
    def num_accepted_tokens(self):
        return self.accepted

    @property
    def mean_acceptance_length(self):
        return 1 + self.accepted / self.num_drafts if self.num_drafts else float("nan")

    @property
    def acceptance_rate_by_position(self):
        return [a / self.num_drafts if self.num_drafts else float("nan") for a in self.accepted_by_position]

    def record_round(self, proposed, tested, accepted):
        """Count a round: `proposed` candidates, the first `tested` tested, `accepted` kept."""
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
        """Add another generation's counts, seconds and per-position lists; stop_reason "mixed" unless equal; self."""
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
        """One Stats summing an iterable of Stats (merge)."""
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
    """A generation's new ids `[new_tokens]` (EOS included), its Stats and its trace."""

    ids: list
    stats: Stats
    trace: list = field(default_factory=list)


class GenerationInterrupted(KeyboardInterrupt):
    """Ctrl-C (a KeyboardInterrupt) in a generation: `generation`, its completed rounds (stop_reason "interrupted")."""

    def __init__(self, generation):
        super().__init__("interrupted")
        self.generation = generation


def trace_record(outcome):
    """A round's trace record (README's --trace): drafted (cut after an accepted EOS; a tree's kept path), accepted,
    token, proposed, gamma, seconds_draft, seconds_verify; a chain's p, q (each draft's warped probabilities) and u (its
    uniform, None at temperature 0); a tree's "tree" (ids, parents), with p, q, u None."""
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

"""npspec.testing.lossy: what a LOSSY acceptance rule costs, exactly: the total variation from the target's law.

lossiness(rule) enumerates one round as check_rule does (token rules `rule(p, q, x) -> (a, r)`, block rules with
block=True, tree verifiers with tree=) and returns the exact TV distance per case (Fractions where the rule's outputs are). The lossy rules here
are stated as probabilities for the kit to measure; npspec never runs them (notes/derivation.md, claim 14):
typical_acceptance_rule (Medusa, Cai et al. 2024, section 3.3.1), relaxed_topk_rule, no_residual_rule (DIAGNOSES'
"no-residual"). Imports npspec.testing.blocks, .oracle and .trees.
"""

import math
from dataclasses import dataclass, field
from fractions import Fraction

from .blocks import block_round_distribution
from .oracle import (_nonzero, constant_table, round_distribution, sequence_distribution, small_cases,
                     total_variation)
from .trees import tree_round_distribution


@dataclass
class Lossiness:
    """lossiness's result: tv, the largest TV over the cases, at (p, q, gamma); by_case [(p, q, gamma, tv)]."""

    tv: object
    p: object = None
    q: object = None
    gamma: int | None = None
    by_case: list = field(default_factory=list)

    @property
    def mean(self):
        """The mean TV over by_case (exact for Fractions)."""
        return sum(tv for *_, tv in self.by_case) / len(self.by_case)


def lossiness(rule, cases=None, gammas=(1, 2), prompt=(0,), eos=None, block=False, tree=None):
    """The exact TV between one round of `rule` (continued by the target to gamma + 1 ids) and the target's own law,
    on each (p, q) of cases (rows or tables; default small_cases()) and gamma. block: a block rule; tree: (expander
    factory, branching), rule a tree verifier (trees.multi_candidate's signature), gammas unused (the depth is
    len(branching)). 0 exactly for a lossless rule stated in Fractions. Returns a Lossiness; ValueError if no case."""
    out = Lossiness(Fraction(0))
    for p, q in (small_cases() if cases is None else cases):
        pt = p if callable(p) else constant_table(p)
        qt = q if callable(q) else constant_table(q)
        for gamma in ((len(tree[1]),) if tree else gammas):
            want = _nonzero(sequence_distribution(pt, prompt, gamma + 1, eos))
            if tree:
                got = tree_round_distribution(pt, tree[0](qt, tuple(tree[1])), prompt, gamma, eos, rule)
            else:
                got = (block_round_distribution(pt, qt, prompt, gamma, eos, rule) if block
                       else _nonzero(round_distribution(pt, qt, prompt, gamma, eos, rule)))
            tv = total_variation(want, got)
            out.by_case.append((p, q, gamma, tv))
            if tv > out.tv or out.p is None:
                out.tv, out.p, out.q, out.gamma = tv, p, q, gamma
    if not out.by_case:
        raise ValueError("lossiness: no case was given (cases or gammas empty)")
    return out


def _argmax_row(p):
    best = max(range(len(p)), key=lambda i: (p[i], -i))  # ties to the lower id
    return [Fraction(int(i == best)) for i in range(len(p))]


def typical_threshold(p, threshold=0.09, alpha=0.3):
    """Medusa's typical-acceptance threshold min(threshold, alpha * exp(-H(p))), H with its code's log(p + 1e-5),
    in float64 (a float)."""
    entropy = -sum(float(v) * math.log(float(v) + 1e-5) for v in p)
    return min(threshold, alpha * math.exp(-entropy))


def typical_acceptance_rule(threshold=0.09, alpha=0.3):
    """Medusa's typical acceptance (Cai et al. 2024, section 3.3.1; defaults those of Medusa's code, and vLLM V0's
    alpha = sqrt(threshold)) as a rule: keep x iff p(x) > typical_threshold(p), else the target's argmax (vLLM V0's
    TypicalAcceptanceSampler). Exact Fractions out; the comparison is made in float64."""
    def rule(p, q, x):
        keep = Fraction(p[x]) > Fraction(typical_threshold(p, threshold, alpha))
        return (Fraction(1), list(p)) if keep else (Fraction(0), _argmax_row(p))
    return rule


def relaxed_topk_rule(k=2):
    """A relaxed top-k acceptance: keep x iff it is among the target row's k most likely ids (ties to the lower id),
    else a sample of p, as if the draft had not been there."""
    def rule(p, q, x):
        top = sorted(range(len(p)), key=lambda i: (-p[i], i))[:k]
        return (Fraction(int(x in top)), [Fraction(v) for v in p])
    return rule


def no_residual_rule(p, q, x):
    """DIAGNOSES' "no-residual" as a rule: min(1, p(x) / q(x)), then p instead of norm(max(0, p - q))."""
    return min(1, Fraction(p[x]) / Fraction(q[x])), [Fraction(v) for v in p]

"""python -m bench.gap: each verifier's exact distance from the optimum, and each lossy rule's exact cost. No timing.

Three tables, exact fractions (small vocabularies, so the figures do not depend on the machine):
  * gap_node: a node of k = 2, 3 drafts, P(a draft is kept) under each lossless tree rule (npspec.testing.gap
    GAP_RULES) against the optimal-transport ceiling of its own drafts (i.i.d. or without replacement).
  * gap_tree: whole static trees and chains, E[drafts kept] in one round against the tree's ceiling
    (npspec.testing.gap.tree_ot_bound); chains add block verification and its joint bound.
  * lossiness: the exact total variation of lossy rules from the target's law (npspec.testing.lossy): Medusa's
    typical acceptance at its defaults, relaxed top-k acceptance, the "no-residual" mistake; the token rule for 0.
--quick runs fewer cases; --threads is unused (nothing is timed).
"""

import datetime
import platform
from fractions import Fraction as F

from npspec.testing import blocks, constant_table, leviathan_rule, random_table
from npspec.testing.gap import node_gap, tree_gap
from npspec.testing.lossy import lossiness, no_residual_rule, relaxed_topk_rule, typical_acceptance_rule

from . import common

NODE_CASES = [  # name, p row, q row
    ("Sun et al.'s two tokens", [F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)]),
    ("RSD below its drafts' ceiling", [F(2, 3), F(1, 3), F(0)], [F(1, 3)] * 3),
    ("three tokens, reversed", [F(1, 2), F(1, 3), F(1, 6)], [F(1, 6), F(1, 3), F(1, 2)]),
    ("three tokens, one shared", [F(1, 2), F(1, 4), F(1, 4)], [F(1, 4), F(1, 4), F(1, 2)]),
]
TREES = [(1, 1), (1, 1, 1), (2, 1), (2, 2), (3, 1)]
TOKEN_CASE = ([F(1, 2), F(1, 3), F(1, 6)], [F(1, 6), F(1, 3), F(1, 2)])
LOSSY = [  # name, rule
    ("token rule (lossless)", leviathan_rule),
    ("Medusa typical acceptance, threshold 0.09, alpha 0.3", typical_acceptance_rule(0.09, 0.3)),
    ("relaxed top-1 (keep the target's argmax, else sample p)", relaxed_topk_rule(1)),
    ("relaxed top-2", relaxed_topk_rule(2)),
    ("no-residual (DIAGNOSES: sample p after a rejection)", no_residual_rule),
]


def _frac(v):
    return f"{v}" if v.denominator > 1 else f"{v.numerator}"


def node_rows(cases, ks):
    rows = []
    for name, p, q in common.steps(cases, "node cases"):
        for k in ks:
            for rule, kept, bound in node_gap(p, q, k):
                rows.append({"case": name, "p": _row(p), "q": _row(q), "k": k, "rule": rule, "kept": _frac(kept),
                             "ceiling": _frac(bound), "gap": _frac(bound - kept), "kept / ceiling": float(kept / bound)})
    return rows


def _row(r):
    return "(" + ", ".join(_frac(F(v)) for v in r) + ")"


def tree_cases(quick):
    sun = NODE_CASES[0]
    out = [(sun[0], constant_table(sun[1]), constant_table(sun[2]))]
    for s in range(1 if quick else 2):
        out.append((f"random 3-token tables, seed {s}", random_table(3, seed=s), random_table(3, seed=1000 + s)))
    return out


def tree_rows(cases, trees):
    rows = []
    for name, p, q in common.steps(cases, "tree cases"):
        for branching in trees:
            for rule, kept, bound in tree_gap(p, q, branching):
                rows.append({"case": name, "tree": ",".join(map(str, branching)), "rule": rule, "kept": _frac(kept),
                             "ceiling": _frac(bound), "gap": _frac(bound - kept), "kept / ceiling": float(kept / bound)})
    return rows


def lossy_rows(quick):
    rows, contexts = [], blocks.context_cases(2 if quick else 8)
    p, q = TOKEN_CASE
    for name, rule in common.steps(LOSSY, "lossy rules"):
        small = lossiness(rule, gammas=(1,) if quick else (1, 2))
        ctx = lossiness(rule, cases=contexts, gammas=(2,))
        one = lossiness(rule, cases=[TOKEN_CASE], gammas=(1,))
        kept = sum(F(q[x]) * rule(p, q, x)[0] for x in range(len(q)) if q[x])
        rows.append({"rule": name, "worst TV, small cases": _frac(small.tv), "at p": _row(small.p),
                     "at q": _row(small.q), "at gamma": small.gamma, "mean TV, small cases": float(small.mean),
                     "worst TV, context tables": float(ctx.tv), f"TV at p {_row(p)}, q {_row(q)}": _frac(one.tv),
                     "P(draft kept) there": _frac(kept)})
    return rows


def main(argv=None):
    run = common.command_line("bench.gap", __doc__, argv, threads=("1", "1"), many=False)
    run.meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "command": run.meta["command"], "python": platform.python_version(), "numpy": run.meta["numpy"]}
    quick = run.args.quick
    tables = [
        common.Table("gap_node", node_rows(NODE_CASES[:2] if quick else NODE_CASES, (2,) if quick else (2, 3)),
                     "One node of k drafts: P(a draft is kept), exactly, against the optimal-transport ceiling of "
                     "its drafts", "Every rule is at or below its ceiling (tests/test_gap.py)."),
        common.Table("gap_tree", tree_rows(tree_cases(quick), TREES[:3] if quick else TREES),
                     "Whole trees: E[drafts kept] in one round, exactly, against the tree's ceiling",
                     "tree is the branching per level; a chain (all 1) adds block verification, whose ceiling is the "
                     "joint bound."),
        common.Table("lossiness", lossy_rows(quick),
                     "Lossy rules: the exact total variation of one round from the target's law",
                     "small cases: npspec.testing.small_cases() (2 and 3 tokens), gamma 1 and 2; context tables: "
                     "blocks.context_cases(), gamma 2. npspec runs none of the lossy rules."),
    ]
    return common.finish(run, tables)


if __name__ == "__main__":
    raise SystemExit(main())

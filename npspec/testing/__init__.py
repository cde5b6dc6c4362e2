"""npspec.testing: a conformance kit for speculative-decoding samplers, yours or npspec's.

A sampler is correct when its output has exactly the target's law. By exact enumeration: oracle (a rule stated as
probabilities: check_rule), blocks (whole-block verifiers), trees and multidraft (tree rounds, RSD), traversal
(whole trees, leaves up), drafting (check_drafter); gap (each rule against the optimal-transport ceiling of a tree),
lossy (lossiness: a lossy rule's exact TV); black box: probes (check_sampler), rounds (check_round); zoo (BUGS, the
bug classes engines shipped, each finding naming its class; zoo_table() is README's table); vectors (the laws as
JSON: `python -m npspec.testing vectors OUT.json`); doubles (TableModel, ScriptedRng), strategies (hypothesis),
usage (KitUsageError).
Callbacks are not time-limited: a check calls them in the caller's thread and one that never returns hangs it (a
sampler drawing uniforms forever is stopped: UniformsExhausted). Bound it with a test timeout, a subprocess or a
repeating main-thread alarm raising a BaseException (a callback's Exception is reported as a finding). This file re-exports.
"""

from .blocks import (BLOCK_DIAGNOSES, BLOCK_PROBES, acceptance_rate, block_distribution, block_drafter_distribution,  # whole blocks
                     block_probes, block_round_distribution, block_verification_rule, check_block_rule, cumprod_rule,
                     exact_match_rule, expected_accepted, function_rule, joint_bound, token_block_rule)
from .doubles import ScriptedRng, TableCache, TableConfig, TableModel
from .drafting import (DrafterError, DrafterReport, check_drafter, confident_drafter, ngram_drafter, object_drafter,
                       one_hot)
from .gap import GAP_RULES, node_gap, tree_gap, tree_law, tree_ot_bound
from .lossy import (Lossiness, lossiness, no_residual_rule, relaxed_topk_rule, typical_acceptance_rule,
                    typical_threshold)
from .multidraft import node_acceptance, ot_bound, tree_expected_accepted, without_replacement_expander
from .oracle import (Round, RuleError, RuleReport, SpeculativePath, check_rule, constant_table, drafter_distribution,
                     drafter_paths, leviathan_rule, model_table, npspec_rule, random_table, round_distribution,
                     sequence_distribution, small_cases, speculative_distribution, speculative_paths, table_drafter,
                     total_variation, truncate)
from .probes import (ACCEPT_PROBES, MISS_BOUND, ONE_BELOW, STATISTICAL_CASES, Finding, SamplerReport, Uniforms,
                     check_sampler, chi2_sf, chi_square, npspec_sampler, probe_acceptance, probe_proposal,
                     probe_uniforms, statistical_check)
from .traversal import (traversal_decisions, traversal_expected_accepted, traversal_outcomes,
                        traversal_round_distribution, traversal_round_outcomes, whole_trees)
from .rounds import (DIAGNOSES, GPT2_VOCAB, ROUND_CASES, STATISTICAL_ROUNDS, RoundReport, check_round, npspec_round,
                     realistic_logits, round_laws, round_rows, round_statistics)
from .strategies import logits_rows, probability_pairs, probability_vectors
from .zoo import BUGS, Bug, zoo_table
from .usage import MAX_OUTCOMES, MAX_UNIFORMS_PER_CALL, KitUsageError, UniformsExhausted

__all__ = [
    # oracle
    "Round", "RuleError", "RuleReport", "SpeculativePath", "check_rule", "constant_table", "leviathan_rule",
    "model_table", "npspec_rule", "random_table", "round_distribution", "sequence_distribution", "small_cases",
    "speculative_distribution", "speculative_paths", "total_variation", "truncate", "drafter_distribution",
    "drafter_paths", "table_drafter",
    # drafting
    "DrafterError", "DrafterReport", "check_drafter", "confident_drafter", "ngram_drafter", "object_drafter", "one_hot",
    # probes
    "ACCEPT_PROBES", "MISS_BOUND", "ONE_BELOW", "STATISTICAL_CASES", "Finding", "SamplerReport", "Uniforms",
    "check_sampler", "chi2_sf", "chi_square", "npspec_sampler", "probe_acceptance", "probe_proposal",
    "probe_uniforms", "statistical_check",
    # zoo
    "BUGS", "Bug", "zoo_table",
    # rounds
    "DIAGNOSES", "GPT2_VOCAB", "ROUND_CASES", "STATISTICAL_ROUNDS", "RoundReport", "check_round", "npspec_round",
    "realistic_logits", "round_laws", "round_rows", "round_statistics",
    # doubles
    "ScriptedRng", "TableCache", "TableConfig", "TableModel",
    # strategies
    "logits_rows", "probability_pairs", "probability_vectors",
    # usage
    "KitUsageError", "MAX_OUTCOMES", "MAX_UNIFORMS_PER_CALL", "UniformsExhausted",
    # blocks: verifiers that decide a whole block of drafts (block verification, npspec.decode.rules), exactly
    "BLOCK_DIAGNOSES", "BLOCK_PROBES", "acceptance_rate", "block_distribution", "block_drafter_distribution", "block_probes",
    "block_round_distribution", "block_verification_rule", "check_block_rule", "cumprod_rule", "exact_match_rule", "expected_accepted",
    "function_rule", "joint_bound", "token_block_rule",
    # multidraft: children drawn without replacement (RSD), the optimal-transport bound
    "node_acceptance", "ot_bound", "tree_expected_accepted", "without_replacement_expander",
    # traversal: traversal verification (Weng et al. 2025) of whole drafted trees, exactly
    "traversal_decisions", "traversal_expected_accepted", "traversal_outcomes", "traversal_round_distribution",
    "traversal_round_outcomes", "whole_trees",
    # gap: each lossless tree rule's exact E[kept] against the ceiling of its drafts (claim 14)
    "GAP_RULES", "node_gap", "tree_gap", "tree_law", "tree_ot_bound",
    # lossy: the exact TV of a lossy rule from the target's law; lossy rules the kit measures, npspec never runs
    "Lossiness", "lossiness", "no_residual_rule", "relaxed_topk_rule", "typical_acceptance_rule", "typical_threshold",
]

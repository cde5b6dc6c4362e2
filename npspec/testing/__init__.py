"""npspec.testing: a conformance kit for speculative-decoding samplers, yours or npspec's.

A sampler is correct when its output has exactly the target's distribution. `oracle` checks a
rule stated as probabilities by exact enumeration (check_rule), `probes` checks a black-box
sampler with injected uniforms and chi-square tests (check_sampler), `rounds` a whole black-box round
(gamma drafts, their tests, the correction or bonus) on rows that differ by position, up to GPT-2's
vocabulary (check_round), `drafting` checks a drafter
(npspec.decode.drafters) by exact enumeration (check_drafter), `trees` enumerates a token-tree round
(npspec.trees), `doubles` holds the
stand-ins that drive npspec's loop on a table (TableModel, ScriptedRng), and `strategies` the
hypothesis strategies. The submodules import numpy and npspec's core modules, never each other
(drafting builds on oracle, rounds on probes; nor hypothesis, until a strategy is built); this file only re-exports
them. `vectors` (built on `oracle`) exports the exact laws as data: `python -m npspec.testing vectors OUT.json`.
`usage` holds the argument checks and bounds every check shares (KitUsageError, MAX_OUTCOMES); every
submodule may import it.

Callbacks are not time-limited: every check calls the rule, sampler, round or drafter it is given in the caller's
thread, and one that never returns hangs the check (a sampler that draws uniforms forever is the one hang the kit
stops: UniformsExhausted). The caller bounds the check: a test timeout, a subprocess it can kill, or an alarm in
the main thread raising an exception that is not an Exception (the kit reports a callback's Exception as a finding
and calls the next case). A per-call limit is not offered: a Python thread cannot be stopped from outside, and a
signal works in the main thread only.
"""

from .blocks import (BLOCK_PROBES, block_distribution, block_drafter_distribution, block_probes,  # whole blocks
                     block_round_distribution, block_verification_rule, check_block_rule, expected_accepted,
                     function_rule, joint_bound, token_block_rule)
from .doubles import ScriptedRng, TableCache, TableConfig, TableModel
from .drafting import (DrafterError, DrafterReport, check_drafter, confident_drafter, ngram_drafter, object_drafter,
                       one_hot)
from .multidraft import node_acceptance, ot_bound, tree_expected_accepted, without_replacement_expander
from .oracle import (Round, RuleError, RuleReport, SpeculativePath, check_rule, constant_table, drafter_distribution,
                     drafter_paths, leviathan_rule, model_table, npspec_rule, random_table, round_distribution,
                     sequence_distribution, small_cases, speculative_distribution, speculative_paths, table_drafter,
                     total_variation, truncate)
from .probes import (ACCEPT_PROBES, MISS_BOUND, ONE_BELOW, STATISTICAL_CASES, Finding, SamplerReport, Uniforms,
                     check_sampler, chi2_sf, chi_square, npspec_sampler, probe_acceptance, probe_proposal,
                     statistical_check)
from .rounds import (DIAGNOSES, GPT2_VOCAB, ROUND_CASES, STATISTICAL_ROUNDS, RoundReport, check_round, npspec_round,
                     realistic_logits, round_laws, round_rows, round_statistics)
from .strategies import logits_rows, probability_pairs, probability_vectors
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
    "statistical_check",
    # rounds
    "DIAGNOSES", "GPT2_VOCAB", "ROUND_CASES", "STATISTICAL_ROUNDS", "RoundReport", "check_round", "npspec_round",
    "realistic_logits", "round_laws", "round_rows", "round_statistics",
    # doubles
    "ScriptedRng", "TableCache", "TableConfig", "TableModel",
    # strategies
    "logits_rows", "probability_pairs", "probability_vectors",
    # usage
    "KitUsageError", "MAX_OUTCOMES", "MAX_UNIFORMS_PER_CALL", "UniformsExhausted",
    # blocks: verifiers that decide a whole block of drafts (block verification, npspec.rules), exactly
    "BLOCK_PROBES", "block_distribution", "block_drafter_distribution", "block_probes", "block_round_distribution",
    "block_verification_rule", "check_block_rule", "expected_accepted", "function_rule", "joint_bound",
    "token_block_rule",
    # multidraft: children drawn without replacement (RSD), the optimal-transport bound
    "node_acceptance", "ot_bound", "tree_expected_accepted", "without_replacement_expander",
]

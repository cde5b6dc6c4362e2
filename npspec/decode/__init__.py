"""npspec.decode: the speculative round and the loop around it, one room per job.

    types       SamplingParams and Options (validated once), Proposal, Outcome, and the protocols a drafter
                (Drafter) and a model (Forwarder, TreeForwarder, HiddenForwarder) implement
    acceptance  the acceptance rules, a registry name -> Rule (the API's verify=, the CLI's --verify)
    round       propose -> verify -> accept -> roll back, four named calls; every round a tree
    schedule    round_gamma, next_gamma, tree_depth
    stats       Stats (with merge), Generation, the trace record, GenerationInterrupted
    checks      every option, pair, prompt and proposal check, each called once
    loop        prepare (the checks) + decode (the rounds) = speculative_generate
    drafters    one file per drafter: model, ngram, tree, controlled
Imports run one way: drafters -> types -> acceptance, schedule; loop -> round -> checks -> types. The package
reaches models only through its protocols: it imports npspec.decode.sampling, npspec.decode.text, npspec.decode.rules.trees and the math's
error (npspec.model.gpt2.ContextOverflowError), never npspec.model.model, npspec.sources.files or npspec.sources.
"""

from .rules import RULES, SIBLINGS, Rule, accept, get_rule
from .loop import Job, as_drafter, decode, prepare, speculative_generate
from .schedule import SCHEDULES, next_gamma, round_gamma, tree_depth
from .stats import Generation, GenerationInterrupted, Stats
from .types import (BaseDrafter, Drafter, Forwarder, HiddenForwarder, Options, Outcome, Proposal, SamplingParams,
                    TreeForwarder)

__all__ = ["BaseDrafter", "Drafter", "Forwarder", "Generation", "GenerationInterrupted", "HiddenForwarder", "Job",
           "Options", "Outcome", "Proposal", "RULES", "Rule", "SCHEDULES", "SIBLINGS", "SamplingParams", "Stats",
           "TreeForwarder", "accept", "as_drafter", "decode", "get_rule", "next_gamma", "prepare", "round_gamma",
           "speculative_generate", "tree_depth"]

"""npspec.decode: the speculative round and the loop around it, one room per job: types, rules/ (every acceptance
rule), round (propose -> verify -> accept -> roll back), schedule, stats, checks, loop (speculative_generate),
drafters/, sampling, text, evaluate. Its output is exactly the target's law (notes/derivation.md). Imports numpy,
tokenizers and npspec.model.gpt2's ContextOverflowError; it reaches models only through its protocols."""

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

"""Controlled acceptance for the bench: the steered drafters live in npspec.decode.drafters.controlled (where
`--simulate-acceptance` uses ControlledDraft too); this module names them for bench.speedup, bench.drafters and
bench.trees. ControlledDraft steers a draft model's chain, ControlledLookup n-gram lookup, ControlledTree token trees:
each proposal is the target's greedy token with probability a.
"""

from npspec.decode.drafters import ControlledDraft, ControlledLookup, ControlledTree

__all__ = ["ControlledDraft", "ControlledLookup", "ControlledTree"]

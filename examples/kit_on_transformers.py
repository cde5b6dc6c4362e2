"""The conformance kit (npspec.testing) on someone else's sampler: transformers' `_speculative_sampling`.

Run: python examples/kit_on_transformers.py   (needs torch and transformers: the `oracle` extra)

transformers' assisted generation verifies draft tokens with
`transformers.generation.utils._speculative_sampling(candidate_input_ids, candidate_logits,
candidate_length, new_logits)`. It draws its acceptance uniforms with `torch.rand_like` and its
replacement token with `torch.multinomial`; this wrapper routes both through the kit's `uniform()`
(the first uniform is the acceptance test's u, the next one the replacement's, sampled by inverse
CDF), hands it the kit's p and q themselves in float64 (Tensor.softmax is the identity during the
call, so no rounding moves a probe off its boundary), and prints the kit's report. transformers'
code runs as it is. Then the whole round (`kit.check_round`): gamma drafts drawn from the warped q,
_speculative_sampling given all gamma q rows and the gamma + 1 target rows (GPT-2's 50,257 ids, rows
that differ by position), its acceptance uniforms the kit's u[gamma:2 gamma], its multinomial the
kit's u[2 gamma]. tests/test_kit.py runs this file.
"""

import sys
from unittest import mock

import numpy as np

try:
    import torch
    import transformers
    from transformers.generation.utils import _speculative_sampling
except ImportError as e:
    print(f"skipped: this example needs torch and transformers ({e}); pip install -e '.[oracle]'")
    sys.exit(0)

from npspec import testing as kit
from npspec.decode.sampling import warp


def inverse_cdf(probs, u):  # [1, V] -> [1, 1]: the first id whose cumulative mass exceeds u * total
    cdf = probs[0].cumsum(0)
    return torch.searchsorted(cdf, u * cdf[-1], right=True).clamp(max=len(cdf) - 1).reshape(1, 1)


class KitRandomness:
    """While active: torch.rand_like and torch.multinomial draw from `self.uniform` (the kit's), and
    Tensor.softmax returns its input, so _speculative_sampling is handed p and q themselves (exact rows)."""

    uniform = None
    tests = None  # a round's acceptance uniforms, handed out by rand_like as one tensor

    def rand_like(self, t):
        if self.tests is not None:
            return torch.from_numpy(self.tests).reshape(t.shape).to(t.dtype)
        return torch.full_like(t, self.uniform())

    def multinomial(self, probs, num_samples=1, *args, **kwargs):
        if not (torch.isfinite(probs).all() and (probs >= 0).all() and probs.sum() > 0):
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")  # as torch's
        return inverse_cdf(probs.reshape(1, -1), self.uniform())

    def __enter__(self):
        self.patches = [mock.patch.object(torch, "rand_like", self.rand_like),
                        mock.patch.object(torch, "multinomial", self.multinomial),
                        mock.patch.object(torch.Tensor, "softmax", lambda t, dim=-1: t)]
        for patch in self.patches:
            patch.start()
        return self

    def __exit__(self, *exc):
        for patch in self.patches:
            patch.stop()


RANDOMNESS = KitRandomness()


def propose(logits, uniform):
    """The draft side: q = softmax(logits) in float64, x ~ q by inverse CDF with the kit's uniform."""
    q = np.exp(logits - np.max(logits))
    q = q / q.sum()
    return int(inverse_cdf(torch.from_numpy(q)[None], uniform())), q


def accept(x, p, q, uniform):
    """One draft x (gamma = 1), verified by _speculative_sampling: (accepted, token)."""
    RANDOMNESS.uniform = uniform
    tokens, n_matches = _speculative_sampling(
        torch.tensor([[x]]), torch.from_numpy(q)[None, None], 1, torch.from_numpy(np.stack([p, p]))[None])
    return (True, x) if int(n_matches) == 1 else (False, int(tokens[0, -1]))


def round_fn(draft_logits, target_logits, u, warping):
    """A whole round: gamma drafts from the warped q with u[:gamma], then _speculative_sampling on all of them."""
    gamma = len(draft_logits) - 1
    q, p = warp(draft_logits, **warping), warp(target_logits, **warping)  # the kit's warping convention
    drafts = [int(inverse_cdf(torch.from_numpy(q[i])[None], float(u[i]))) for i in range(gamma)]
    RANDOMNESS.tests, RANDOMNESS.uniform = u[gamma:2 * gamma], iter([float(u[2 * gamma])]).__next__
    try:
        tokens, n_matches = _speculative_sampling(torch.tensor([drafts]), torch.from_numpy(q[:gamma])[None], gamma,
                                                  torch.from_numpy(p)[None])
    finally:
        RANDOMNESS.tests = None
    return drafts, int(n_matches), int(tokens[0, -1])


def main():
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: _speculative_sampling")
    with RANDOMNESS:
        report = kit.check_sampler(propose, accept, n_samples=2000)
        print(report)
        print("the whole round, on GPT-2's vocabulary (kit.check_round):")
        print(kit.check_round(round_fn, trials=6))
    return 0


if __name__ == "__main__":
    sys.exit(main())

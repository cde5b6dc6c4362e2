"""The model: GPT-2's forward as small pure functions (gpt2), its tensors by name (tensors), and `Model`, weights
plus the kernel its forwards use (model). Float32 end to end; the forward returns logits for every new position,
`[n_new, n_vocab]`; no I/O, no RNG. Imports numpy and npspec.kernels only.
"""

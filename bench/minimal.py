"""The "what 100 lines of NumPy do" reference row: a minimal GPT-2 greedy decoder, for bench.speedup's AR table.

Plain `x @ w + b` products (BLAS decides everything: one GEMV per product for one token, its own
threads), a preallocated KV cache, one-token steps, argmax. No kernel choice, no batch
invariance, no sampling: the fastest plain decoding a NumPy user would write first, measured in
the same run as npspec's own decoders so that no speedup is quoted against a slower baseline.
It reads a Model's parameter tree (npspec.model.gpt2's layout) and shares nothing else with npspec.
"""

import time

import numpy as np


def layer_norm(x, g, b, eps=1e-5):  # [1, d] -> [1, d]
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return g * (x - mean) / np.sqrt(var + eps) + b


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.float32(0.7978845608) * (x + np.float32(0.044715) * x ** 3)))


class MinimalDecoder:
    """Greedy decoding of `model` (an npspec Model: only `params` and `config` are read), one token per forward."""

    def __init__(self, model):
        self.p, c = model.params, model.config
        self.n_head, self.d_head = c.n_head, c.n_embd // c.n_head
        self.k = np.zeros((c.n_layer, c.n_head, c.n_ctx, self.d_head), np.float32)
        self.v = np.zeros_like(self.k)
        self.t = 0

    def step(self, token):  # int -> [n_vocab] float32 logits
        p, h, dh, t = self.p, self.n_head, self.d_head, self.t
        x = p["wte"][token][None] + p["wpe"][t][None]  # [1, d]
        for i, blk in enumerate(p["h"]):
            a = layer_norm(x, **blk["ln_1"])
            qkv = a @ blk["attn"]["c_attn"]["w"] + blk["attn"]["c_attn"]["b"]
            q, k, v = (z.reshape(h, 1, dh) for z in np.split(qkv[0], 3))
            self.k[i, :, t], self.v[i, :, t] = k[:, 0], v[:, 0]
            scores = q @ self.k[i, :, : t + 1].transpose(0, 2, 1) / np.float32(np.sqrt(dh))  # [h, 1, t+1]
            e = np.exp(scores - scores.max(-1, keepdims=True))
            heads = (e / e.sum(-1, keepdims=True)) @ self.v[i, :, : t + 1]  # [h, 1, dh]
            x = x + heads.reshape(1, -1) @ blk["attn"]["c_proj"]["w"] + blk["attn"]["c_proj"]["b"]
            m = layer_norm(x, **blk["ln_2"])
            x = x + gelu(m @ blk["mlp"]["c_fc"]["w"] + blk["mlp"]["c_fc"]["b"]) @ blk["mlp"]["c_proj"]["w"] \
                + blk["mlp"]["c_proj"]["b"]
        self.t += 1
        return (layer_norm(x, **p["ln_f"]) @ p["wte"].T)[0]

    def generate(self, prompt, n_new):  # list[int], int -> (list[int] [n_new], seconds of the n_new steps)
        """Feed the prompt one token at a time, then decode n_new tokens greedily; the time counts decoding only."""
        self.t = 0
        for token in prompt[:-1]:
            self.step(token)
        token, ids = prompt[-1], []
        t0 = time.perf_counter()
        for _ in range(n_new):
            token = int(np.argmax(self.step(token)))
            ids.append(token)
        return ids, time.perf_counter() - t0

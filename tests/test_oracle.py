"""npspec against Hugging Face transformers' GPT2LMHeadModel on the shipped training checkpoints.

Needs the `oracle` extra (torch, transformers); CI installs it, so CI always runs these.
"""

import numpy as np
import pytest

from conftest import SHIPPED

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.oracle


@pytest.mark.parametrize("name", ["target", "draft"])
def test_logits_match_transformers(shipped, val_ids, name):
    model = shipped[0] if name == "target" else shipped[1]
    hf = transformers.GPT2LMHeadModel.from_pretrained(SHIPPED / "checkpoints" / name).eval()
    ids = np.array(val_ids[: model.config.n_ctx])
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids)[None]).logits[0].numpy()
    ours = model.forward(ids, model.new_cache(), invariant=False)
    assert ours.shape == ref.shape == (len(ids), model.config.n_vocab) and ours.dtype == np.float32
    # bound relative to the logits' scale: float32 with different summation orders
    scale = np.abs(ref).max()
    assert np.abs(ours - ref).max() <= 1e-5 * scale
    # and the one-token cached path
    cache = model.new_cache()
    model.forward(ids[:100], cache, invariant=False)
    step = np.concatenate([model.forward(ids[i : i + 1], cache) for i in range(100, 110)])
    assert np.abs(step - ref[100:110]).max() <= 1e-5 * scale


def test_greedy_ids_and_text_match_transformers(shipped):
    target = shipped[0]
    hf = transformers.GPT2LMHeadModel.from_pretrained(SHIPPED / "checkpoints" / "target").eval()
    from npspec.speculative import speculative_generate

    prompt = target.tokenizer.encode("KING RICHARD III:\n").ids
    ours = speculative_generate(target, shipped[1], prompt, 32, gamma=4, temperature=0).ids
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False,
                          pad_token_id=target.config.eos_token_id, eos_token_id=None)
    theirs = out[0, len(prompt):].tolist()
    assert ours == theirs
    assert target.tokenizer.decode(ours) == target.tokenizer.decode(theirs)

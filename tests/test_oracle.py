"""npspec against Hugging Face transformers' GPT2LMHeadModel, at three levels (as minGPT's import test):
  1. logits: `max |npspec - transformers| <= RTOL * max |transformers|` on the prefill path, the verify
     (row) path and the one-token cached path, the last two bit-identical;
  2. greedy ids over N_NEW new tokens are identical, with gamma 0 and with a draft;
  3. decoded text is identical: transformers' tokenizer on its ids == npspec's TextStreamer fed round by
     round, as the CLI streams it.
Cases marked `oracle` run transformers (the oracle extra; CI installs it): a tiny family of checkpoints
written both ways users meet them (`save_pretrained`: `transformer.` prefix, float32/float16/bfloat16; the
hub's gpt2 file: no prefix, the old `attn.bias`/`attn.masked_bias` buffers), GPT-2's full-size shapes with
the tensors `random:gpt2` holds, and the shipped pair's training checkpoints. Without torch, the stored
reference (tests/data/make_reference.py wrote transformers' outputs next to its checkpoint) still checks
levels 1-3. (The real GPT-2 against transformers' published outputs: tests/test_reference.py, marked hub.)
"""

import importlib.util
import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from npspec.sources.huggingface import convert
from npspec.sources.files import load_model
from npspec.model.tensors import tensor_shapes
from npspec.model.gpt2 import GPT2Config
from npspec.sources.init import init_tensors, init_tensors_varied
from npspec.model.model import leaves
from npspec.sources import SHAPES, load
from npspec.sources.cache import RANDOM_SEED
from npspec.decode import speculative_generate
from npspec.decode.text import TextStreamer

from conftest import ROOT, SHIPPED

try:
    import torch
    import transformers
except ImportError:  # the oracle extra is missing: the stored reference still runs
    torch = transformers = None

_spec = importlib.util.spec_from_file_location("make_reference", ROOT / "tests" / "data" / "make_reference.py")
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)  # no torch needed: the script imports it inside its functions


def oracle(test):
    """Mark a test that runs transformers; without the oracle extra it is skipped, saying so."""
    needs = pytest.mark.skipif(transformers is None, reason="needs the oracle extra: pip install -e '.[oracle]'")
    return pytest.mark.oracle(needs(test))


# Two float32 forwards that sum in different orders (BLAS vs torch, GEMM vs row by row) differ by
# rounding only. Measured here (x86_64, OpenBLAS, torch 2.13 CPU): at most 4.6e-6 of max |logit| on
# the tiny shapes (large weights) and 1.1e-6 at GPT-2's shapes; the bound is 10x above that. Small
# formula errors land above it: with npspec's GELU temporarily swapped for the erf form (BERT's, not
# GPT-2's) the tiny cases were off by 8e-5 to 5e-4, and ignoring layer_norm_epsilon failed the 1e-3 case.
RTOL = ref.RTOL  # 5e-5
N_NEW = 32
TOKENIZERS = {"gpt2": ROOT / "weights" / "gpt2" / "tokenizer.json",
              "shakespeare": SHIPPED / "target" / "tokenizer.json"}
EOS = {"gpt2": 50256, "shakespeare": 0}  # <|endoftext|> in each tokenizer
PROMPTS = {"gpt2": "The dog", "shakespeare": "ROMEO:\n"}


@dataclass(frozen=True)
class Case:
    """One checkpoint: shape, tokenizer (a key of TOKENIZERS), `layout` ("save_pretrained" or "hub"), stored dtype."""
    name: str
    n_vocab: int
    n_ctx: int
    n_embd: int
    n_head: int
    n_layer: int
    tokenizer: str
    layout: str
    dtype: str
    layer_norm_epsilon: float = 1e-5

    @property
    def config(self):
        return GPT2Config(self.n_vocab, self.n_ctx, self.n_embd, self.n_head, self.n_layer, self.layer_norm_epsilon,
                          EOS[self.tokenizer])


TINY = [
    Case("v2048-h4-l2-e32-prefix-f32", 2048, 64, 32, 4, 2, "shakespeare", "save_pretrained", "float32"),
    # a padded vocabulary (ids 2048..2099 have no token: decoding drops them), 3 heads of 16
    Case("v2100-h3-l3-e48-noprefix-f32", 2100, 48, 48, 3, 3, "shakespeare", "hub", "float32"),
    Case("v50257-h8-l1-e64-prefix-f16", 50257, 40, 64, 8, 1, "gpt2", "save_pretrained", "float16"),
    # one head, four layers, a layer-norm epsilon that matters at this scale
    Case("v50257-h1-l4-e24-noprefix-f16-eps1e-3", 50257, 48, 24, 1, 4, "gpt2", "hub", "float16", 1e-3),
    Case("v2048-h2-l2-e16-prefix-bf16", 2048, 48, 16, 2, 2, "shakespeare", "save_pretrained", "bfloat16"),
]


class Pair:
    """One checkpoint as transformers sees it (`hf`, with its tokenizer) and as npspec runs it (`np`)."""

    def __init__(self, src, model=None, out=None):
        self.src = Path(src)
        self.hf, info = transformers.GPT2LMHeadModel.from_pretrained(
            self.src, dtype=torch.float32, output_loading_info=True)
        self.hf.eval()
        assert not info["missing_keys"] and not info["mismatched_keys"], info  # every weight was read
        assert all(k.endswith(("attn.bias", "attn.masked_bias")) for k in info["unexpected_keys"]), info
        self.np = model if model is not None else load_model(convert(self.src, out))
        self.hf_tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(self.src / "tokenizer.json"))

    def hf_logits(self, ids):  # [n] -> [n, n_vocab] float32
        with torch.no_grad():
            return self.hf(torch.from_numpy(np.asarray(ids))[None]).logits[0].numpy()

    def hf_greedy(self, prompt):  # -> [<= N_NEW] new ids, stopping after EOS as npspec does
        eos = self.np.config.eos_token_id
        with torch.no_grad():
            out = self.hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                   max_new_tokens=N_NEW, do_sample=False, eos_token_id=eos, pad_token_id=eos)
        return out[0, len(prompt):].tolist()

    def hf_text(self, ids):
        return self.hf_tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def check_logits(model, ids, theirs, n_step=8, rtol=RTOL):
    """Level 1 on `ids` against transformers' logits `theirs`: the prefill, the verify path (the last n_step
    rows fed at once) and n_step one-token forwards; the last two bit-identical."""
    ids = np.asarray(ids)
    scale = np.abs(theirs).max()
    prefill = model.prefill(ids, model.new_cache())
    assert prefill.shape == theirs.shape == (len(ids), model.config.n_vocab) and prefill.dtype == np.float32
    cache = model.new_cache()
    model.prefill(ids[:-n_step], cache)
    rows = model.forward(ids[-n_step:], cache)  # verify's path: n_step rows at once
    cache.rollback(len(ids) - n_step)
    steps = np.concatenate([model.forward(ids[i : i + 1], cache) for i in range(len(ids) - n_step, len(ids))])
    for name, ours, want in [("prefill", prefill, theirs), ("verify rows", rows, theirs[-n_step:]),
                             ("one-token steps", steps, theirs[-n_step:])]:
        err = np.abs(ours - want).max() / scale
        assert err <= rtol, f"{name}: logits off transformers' by {err:.2e} of their scale {scale:.3g} (bound {rtol})"
    assert np.array_equal(rows, steps)  # batch invariance, bit for bit


def greedy(model, prompt, n_new, draft=None, gamma=0):
    """A greedy Generation with npspec, and its text as TextStreamer streams it round by round."""
    streamer, pieces = TextStreamer(model.tokenizer), []
    gen = speculative_generate(model, draft, prompt, n_new, gamma=gamma, temperature=0,
                               on_emit=lambda ids, n: pieces.append(streamer.push(ids)))
    return gen, "".join(pieces) + streamer.finish()


def check_greedy(pair, draft, gamma, text):
    """Levels 2 and 3: greedy ids with gamma 0 and with `draft` equal transformers'; decoded text equal."""
    model = pair.np
    prompt = model.tokenizer.encode(text).ids
    theirs = pair.hf_greedy(prompt)
    runs = {}
    for label, d, g in [("gamma 0", None, 0), (f"draft, gamma {gamma}", draft, gamma)]:
        gen, streamed = greedy(model, prompt, N_NEW, d, g)
        assert gen.ids == theirs, f"{label}: greedy ids differ from transformers'"
        assert streamed == model.tokenizer.decode(gen.ids) == pair.hf_text(theirs), f"{label}: text differs"
        runs[label] = gen
    assert len(theirs) == N_NEW or theirs[-1] == model.config.eos_token_id
    return runs


# ---- the tiny family ----

@pytest.fixture(scope="module", params=TINY, ids=lambda c: c.name)
def tiny_case(request, tmp_path_factory):
    """(case, Pair, a draft for it: every other layer of it, with noise, converted and loaded)."""
    case, tmp = request.param, tmp_path_factory.mktemp(request.param.name)
    tensors = init_tensors_varied(case.config, 0)
    src = ref.write_checkpoint(tmp / "hf", tensors, case.config, case.layout, case.dtype,
                               TOKENIZERS[case.tokenizer])
    small, n_layer = ref.draft_tensors(tensors, case.n_layer, noise=0.1)
    draft_src = ref.write_checkpoint(tmp / "draft-hf", small, replace(case.config, n_layer=n_layer), "hub", "float32",
                                     TOKENIZERS[case.tokenizer])
    return case, Pair(src, out=tmp / "npspec"), load_model(convert(draft_src, tmp / "draft-npspec"))


@oracle
def test_tiny_logits_match(tiny_case):
    case, pair, _ = tiny_case
    ids = np.random.default_rng(1).integers(0, case.n_vocab, case.n_ctx)  # every position of the context
    check_logits(pair.np, ids, pair.hf_logits(ids))


@oracle
def test_tiny_greedy_ids_and_text_match(tiny_case):
    case, pair, draft = tiny_case
    check_greedy(pair, draft, 3, PROMPTS[case.tokenizer])
    runs = check_greedy(pair, pair.np, 4, PROMPTS[case.tokenizer])  # self-drafting: every draft accepted
    assert runs["draft, gamma 4"].stats.rejected == 0


def test_tiny_cases_cover_the_variants():
    # several n_head, n_layer, n_embd and vocabulary sizes, with and without the prefix, float16 and bfloat16
    assert len({c.n_head for c in TINY}) >= 3 and len({c.n_layer for c in TINY}) >= 3
    assert len({c.n_embd for c in TINY}) >= 3 and len({c.n_vocab for c in TINY}) >= 3
    assert {c.layout for c in TINY} == {"save_pretrained", "hub"} and {"float16", "bfloat16"} <= {c.dtype for c in TINY}


@oracle
def test_hub_layout_file_has_no_prefix_and_buffers(tmp_path):
    # the layout really is the hub's: a regression here would make the "no prefix" cases test nothing new
    from safetensors import safe_open

    case, names = TINY[1], {}
    for layout in ("hub", "save_pretrained"):
        src = ref.write_checkpoint(tmp_path / layout, init_tensors_varied(case.config, 0), case.config, layout,
                                   "float32", TOKENIZERS[case.tokenizer])
        with safe_open(str(src / "model.safetensors"), "numpy") as f:
            names[layout] = set(f.keys())
    assert "wte.weight" in names["hub"] and "h.0.attn.bias" in names["hub"]
    assert not any(n.startswith("transformer.") for n in names["hub"])
    assert {n[len("transformer."):] for n in names["save_pretrained"]} == set(tensor_shapes(case.config))


# ---- GPT-2's real shapes, random weights ----
# The default run uses exactly the tensors `random:gpt2` / `random:distilgpt2` hold. Under GPT-2's
# init a random model's greedy run repeats one token, so the slow test adds a varied gpt2-shaped
# target with a distilgpt2-shaped draft that agrees with it about half the time.

def full_size_pair(tmp, shape, layout, tensors=None):
    """Pair for SHAPES[shape], by default with the tensors `random:<shape>` holds."""
    config = SHAPES[shape]
    tensors = init_tensors(config, RANDOM_SEED) if tensors is None else tensors
    src = ref.write_checkpoint(tmp / "hf", tensors, config, layout, "float32", TOKENIZERS["gpt2"])
    return Pair(src, out=tmp / "npspec")


@pytest.fixture(scope="module")
def gpt2_pair(tmp_path_factory):
    return full_size_pair(tmp_path_factory.mktemp("gpt2"), "gpt2", "hub")  # as the hub's gpt2 file: no prefix


@pytest.fixture(scope="module")
def distilgpt2_pair(tmp_path_factory):
    return full_size_pair(tmp_path_factory.mktemp("distilgpt2"), "distilgpt2", "save_pretrained")


def published_ids():
    vectors = json.loads((ROOT / "tests" / "data" / "gpt2_test_vectors.json").read_text(encoding="utf-8"))
    return [v for v in vectors["published"] if v["text"].startswith("The dog was")][0]["ids"]


@pytest.mark.slow  # long (>10 s with its fixture): CI's second step
@oracle
@pytest.mark.parametrize("shape", ["gpt2", "distilgpt2"])
def test_full_size_logits_match(request, shape):
    pair = request.getfixturevalue(f"{shape}_pair")
    assert pair.np.config == SHAPES[shape]
    ids = published_ids() * 4  # 80 real GPT-2 tokens
    check_logits(pair.np, ids, pair.hf_logits(ids), n_step=4)


@pytest.mark.slow  # long (>10 s with its fixture): CI's second step
@oracle
@pytest.mark.parametrize("shape", ["gpt2", "distilgpt2"])
def test_full_size_greedy_ids_and_text_match(request, shape):
    pair = request.getfixturevalue(f"{shape}_pair")
    check_greedy(pair, pair.np, 1, PROMPTS["gpt2"])  # self-draft, gamma 1: the verify path, cheaply


@pytest.mark.slow  # long (>10 s with its fixture): CI's second step
@oracle
def test_full_size_weights_are_the_random_shapes(distilgpt2_pair, tmp_path):
    # what the oracle checked is what `random:distilgpt2` runs: same init, same seed, same converter
    ours, theirs = distilgpt2_pair.np, load("random:distilgpt2", cache_dir=tmp_path / "cache")
    assert ours.config == theirs.config
    for name in ("wte", "wpe"):
        assert np.array_equal(ours.params[name], theirs.params[name])
    for i in (0, 5):
        assert all(np.array_equal(a, b) for a, b in zip(leaves(ours.params["h"][i]), leaves(theirs.params["h"][i]),
                                                       strict=True))


def varied_gpt2_tensors(seed=1):
    """gpt2-shaped weights whose greedy runs vary: block matrices 3x GPT-2's init, and the output projections
    of the odd layers 0.1x, so those layers barely move the residual stream and a draft keeping the even
    layers (ref.draft_tensors) agrees with the target about half the time."""
    out = {}
    for name, a in init_tensors(SHAPES["gpt2"], seed).items():
        if a.ndim == 2 and name not in ("wte.weight", "wpe.weight"):
            a = a * np.float32(3)
            if name.endswith("c_proj.weight") and int(name.split(".")[1]) % 2:
                a = a * np.float32(0.1)
        out[name] = a
    return out


@oracle
@pytest.mark.slow
def test_gpt2_greedy_with_distilgpt2_draft(tmp_path):
    tensors = varied_gpt2_tensors()
    pair = full_size_pair(tmp_path, "gpt2", "save_pretrained", tensors)
    ids = published_ids() * 4
    check_logits(pair.np, ids, pair.hf_logits(ids), n_step=4)
    small, n_layer = ref.draft_tensors(tensors, 12)
    assert n_layer == SHAPES["distilgpt2"].n_layer
    draft_src = ref.write_checkpoint(tmp_path / "draft-hf", small, SHAPES["distilgpt2"], "hub", "float32",
                                     TOKENIZERS["gpt2"])
    draft = load_model(convert(draft_src, tmp_path / "draft-npspec"))
    runs = check_greedy(pair, draft, 4, PROMPTS["gpt2"])
    stats = runs["draft, gamma 4"].stats
    assert stats.accepted > 0 and stats.rejected > 0  # both branches of the accept step ran
    assert len(set(runs["gamma 0"].ids)) > N_NEW // 2  # a varied run, not one repeated token


# ---- the shipped pair, against the training checkpoints it was converted from ----

@oracle
@pytest.mark.parametrize("role", ["target", "draft"])
def test_shipped_logits_match(shipped, val_ids, role):
    model = shipped[role == "draft"]
    pair = Pair(SHIPPED / "checkpoints" / role, model)
    ids = val_ids[: model.config.n_ctx]
    check_logits(model, ids, pair.hf_logits(ids), n_step=10, rtol=1e-5)


@oracle
def test_shipped_greedy_ids_and_text_match(shipped):
    check_greedy(Pair(SHIPPED / "checkpoints" / "target", shipped[0]), shipped[1], 4, "KING RICHARD III:\n")


# ---- the stored reference: transformers' outputs without torch ----

@pytest.fixture(scope="module")
def stored():
    try:
        return ref.load_expected()
    except ref.StaleReference as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="module")
def reference_model(tmp_path_factory):
    return load_model(convert(ref.OUT / "hf", tmp_path_factory.mktemp("reference") / "npspec"))


def test_logits_match_stored_transformers_logits(stored, reference_model):
    arrays, _ = stored
    assert arrays["logits"].dtype == np.float32
    check_logits(reference_model, arrays["input_ids"], arrays["logits"], n_step=len(arrays["input_ids"]),
                 rtol=ref.RTOL)


def test_greedy_ids_and_text_match_stored(stored, reference_model):
    arrays, metadata = stored
    prompt, theirs = arrays["prompt_ids"].tolist(), arrays["greedy_ids"].tolist()
    assert len(theirs) == ref.N_NEW
    for draft, gamma in [(None, 0), (reference_model, 3)]:
        gen, streamed = greedy(reference_model, prompt, ref.N_NEW, draft, gamma)
        assert gen.ids == theirs, f"gamma {gamma}: greedy ids differ from transformers'"
        assert streamed == metadata["greedy_text"]


def test_reference_is_what_the_script_describes(stored, reference_model):
    arrays, metadata = stored
    config, tokenizer = reference_model.config, reference_model.tokenizer
    assert config.n_vocab == ref.EOS + 1 and config.n_ctx == ref.N_CTX
    assert (config.n_embd, config.n_head, config.n_layer) == (ref.N_EMBD, ref.N_HEAD, ref.N_LAYER)
    assert tokenizer.encode(ref.TEXT).ids == arrays["input_ids"].tolist()
    assert tokenizer.encode(ref.PROMPT).ids == arrays["prompt_ids"].tolist()
    assert float(metadata["min_greedy_margin"]) >= ref.MIN_MARGIN
    assert sum(f.stat().st_size for f in ref.OUT.rglob("*") if f.is_file()) < 400_000  # small enough to commit


@pytest.mark.parametrize("damage", ["missing", "old version", "other checkpoint"])
def test_stale_reference_says_how_to_regenerate(tmp_path, damage):
    folder = tmp_path / "reference"
    shutil.copytree(ref.OUT, folder)
    if damage == "missing":
        (folder / "expected.safetensors").unlink()
    elif damage == "old version":
        from safetensors.numpy import save_file

        arrays, metadata = ref.load_expected(folder)
        save_file(arrays, str(folder / "expected.safetensors"), metadata={**metadata, "format_version": "0"})
    else:
        weights = folder / "hf" / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-1] ^= 1  # one bit of the last weight
        weights.write_bytes(bytes(data))
    regenerate = r"regenerate (the files|them) with python tests/data/make_reference.py"
    with pytest.raises(ref.StaleReference, match=regenerate):
        ref.load_expected(folder)

"""Train, convert and measure the model pair npspec ships in weights/shakespeare/.

    pip install -e '.[train]'
    python weights/train_shakespeare.py            # the full recipe, ~30 min on 2 cores
    python weights/train_shakespeare.py --quick    # a 5-minute version, for development

Steps (fixed seeds, fixed step counts, no wall-clock budgets):
  1. split weights/shakespeare/input.txt 90/10 by character position;
  2. train a byte-level BPE tokenizer (vocabulary 2048 including <|endoftext|>) on the
     training split with `tokenizers`;
  3. train the target, a transformers GPT2LMHeadModel (n_layer 4, n_embd 256, n_head 4);
  4. train the draft (n_layer 2, n_embd 128, n_head 4), then distill it toward the target
     (forward KL(p || q) on the training split);
  5. write both as Hugging Face checkpoints (save_pretrained) to weights/shakespeare/checkpoints/,
     convert them with npspec.cli.convert into weights/shakespeare/{target,draft}/;
  6. measure validation perplexity and acceptance with npspec itself and write the model
     card weights/shakespeare/README.md.

Only steps 5-6 need no torch: `--skip-training` reruns them from existing checkpoints.
"""

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from npspec.decode.evaluate import split_corpus
from npspec.sources.progress import show_progress

HERE = Path(__file__).resolve().parent
OUT = HERE / "shakespeare"
SEED = 1337
N_CTX = 256
N_VOCAB = 2048
BATCH = 8

# name -> shape and schedule of each model; --quick divides the step counts.
RECIPE = {
    "target": dict(n_layer=4, n_embd=256, n_head=4, steps=2400, lr=1.5e-3, warmup=100),
    "draft": dict(n_layer=2, n_embd=128, n_head=4, steps=2400, lr=2e-3, warmup=100),
    "distill": dict(steps=800, lr=5e-4, warmup=20),
}


def train_tokenizer(train_text):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=N_VOCAB,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # one "document" per line keeps training fast and deterministic; the pre-tokenizer
    # never merges across a newline anyway.
    tok.train_from_iterator(train_text.splitlines(keepends=True), trainer=trainer)
    assert tok.get_vocab_size() == N_VOCAB, tok.get_vocab_size()
    return tok


def lr_at(step, steps, lr, warmup):
    """Linear warmup, then cosine decay to lr/10."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def batches(data, rng):
    import torch

    while True:
        ix = rng.integers(0, len(data) - N_CTX - 1, size=BATCH)
        x = np.stack([data[i : i + N_CTX] for i in ix]).astype(np.int64)
        y = np.stack([data[i + 1 : i + 1 + N_CTX] for i in ix]).astype(np.int64)
        yield torch.from_numpy(x), torch.from_numpy(y)


def make_model(shape, eos_id, seed):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=N_VOCAB, n_positions=N_CTX, n_embd=shape["n_embd"], n_layer=shape["n_layer"],
        n_head=shape["n_head"], resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
        layer_norm_epsilon=1e-5, bos_token_id=eos_id, eos_token_id=eos_id,
        activation_function="gelu_new", tie_word_embeddings=True,
    )
    return GPT2LMHeadModel(config)


def fit(model, data, sched, seed, label, loss_fn=None):
    """AdamW (0.9, 0.95), weight decay 0.1 on matrices, grad-norm clip 1.0."""
    import torch
    from tqdm import tqdm

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=sched["lr"], betas=(0.9, 0.95),
    )
    model.train()
    stream = batches(data, np.random.default_rng(seed))
    # a bar on a terminal only (not in a log file or a pipe), and never with NPSPEC_QUIET or TQDM_DISABLE set
    bar = tqdm(range(sched["steps"]), desc=label, file=sys.stderr, mininterval=2, leave=False,
               disable=not show_progress(False, sys.stderr, os.environ))
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, sched["steps"], sched["lr"], sched["warmup"])
        x, y = next(stream)
        logits = model(x).logits
        if loss_fn is None:
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, N_VOCAB), y.reshape(-1))
        else:
            loss = loss_fn(x, logits)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    return model


def distill_loss(teacher):
    """Forward KL(p_target || q_draft), averaged over positions."""
    import torch

    def loss_fn(x, logits):
        with torch.no_grad():
            p_logp = torch.log_softmax(teacher(x).logits, -1)
        q_logp = torch.log_softmax(logits, -1)
        return (p_logp.exp() * (p_logp - q_logp)).sum(-1).mean()

    return loss_fn


def train(args, ckpt):
    import torch

    torch.set_num_threads(args.threads)
    text = (OUT / "input.txt").read_text(encoding="utf-8")
    train_text, _ = split_corpus(text)
    tok = train_tokenizer(train_text)
    eos_id = tok.token_to_id("<|endoftext|>")
    data = np.array(tok.encode(train_text).ids, dtype=np.uint16)
    print(f"tokenizer: {tok.get_vocab_size()} ids, training split {len(data)} tokens", file=sys.stderr)
    scale = 6 if args.quick else 1
    sched = {k: dict(v, steps=v["steps"] // scale) for k, v in RECIPE.items()}

    target = fit(make_model(RECIPE["target"], eos_id, SEED), data, sched["target"], SEED, "target")
    draft = make_model(RECIPE["draft"], eos_id, SEED + 1)
    draft = fit(draft, data, sched["draft"], SEED + 1, "draft")
    for p in target.parameters():
        p.requires_grad_(False)
    draft = fit(draft, data, sched["distill"], SEED + 2, "distill", distill_loss(target))

    for name, model in (("target", target), ("draft", draft)):
        d = ckpt / name
        d.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(d)
        tok.save(str(d / "tokenizer.json"))
    (ckpt / "recipe.json").write_text(json.dumps(dict(sched, seed=SEED, batch=BATCH, n_ctx=N_CTX, quick=args.quick), indent=1) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1/6 of the steps (development only)")
    ap.add_argument("--skip-training", action="store_true", help="reuse weights/shakespeare/checkpoints/")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    ckpt = OUT / "checkpoints"
    t0 = time.time()
    train_seconds = None
    if not args.skip_training:
        train(args, ckpt)
        train_seconds = time.time() - t0
        print(f"training done in {train_seconds:.0f} s", file=sys.stderr)
    sys.path.insert(0, str(HERE))
    import model_card

    return model_card.convert_and_report(ckpt, OUT, train_seconds=train_seconds)


if __name__ == "__main__":
    sys.exit(main())

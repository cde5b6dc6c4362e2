"""python -m bench.quantized: how acceptance falls as the draft is quantized, on the shipped pair (issue 14).

Two families of drafts, each against the float32 shipped target: the shipped TARGET quantized (the
self-speculative draft, `--draft SCHEME:self`) and the shipped 2-layer distilled DRAFT quantized,
at every level of npspec.sources.quantize: fp16, bf16, and int8/6/5/4/3/2 round-to-nearest per output
channel (`-ch`) and per group of 128/64/32 input weights; block linears only, and (`+emb`, for
`-ch` and `-g64` and the 16-bit levels) the embeddings and tied head too. Rows named `fp32` are
the unquantized models: the target as its own draft (beta 1) and the shipped draft (the
reference every quantized self-draft is compared with). Method `awq` rows (int -ch and -g64,
block linears): AWQ's activation-aware scaling (Lin et al. 2024, Section 3.2;
npspec.sources.quantized.awq_quantize_model) calibrated on CALIBRATION windows of 256 ids at evenly
spaced offsets of the TRAINING split, never the validation split measured on.

Tables:
  * quantized_beta: for each draft, exact beta = mean over validation positions of sum_x min(p, q)
    (Leviathan et al. 2023, section 3.1; no sampling) at the model card's three warpings
    (greedy: argmax agreement; temperature 0.8 with top-p 0.95; temperature 1), the draft's
    validation perplexity on the same positions, the weight bytes a one-token forward reads
    (npspec.sources.quantize.weight_bytes: codes packed at bits/8 bytes, float32 scales), the ratio c_bw
    of those bytes to the float32 target's, and the predicted speedup in the bandwidth-bound limit,
    E[tokens/round](beta, gamma 4) / (4 c_bw + 1) (npspec.decode.evaluate.predicted_speedup, v = 1).
    Positions: every position of the first --windows non-overlapping windows of n_ctx + 1 ids of
    the validation split (as npspec.decode.evaluate.validation_loss): the draft and the target both read
    the true text (teacher forcing).
  * quantized_position: beta at draft positions 1..8 when drafting along the DRAFT'S OWN proposals:
    from --starts fixed validation offsets (64 ids of context each), the draft proposes 8 tokens
    (greedy: its argmax; temperature 1: sampled with one seeded generator, the same uniforms for
    every draft), and at position i the mean of sum min(p_i, q_i) is taken over starts, without
    conditioning on acceptance. Does quantization error compound along a round?
  * quantized_alpha: measured alpha, tokens per round (= mean acceptance length: every round
    proposes) and acceptance by position in real speculative generation, gamma 4, the model
    card's prompts and settings (npspec.decode.evaluate.acceptance on fixed_prompts: 8 prompts of 32
    validation ids, 64 new tokens each); sampled warpings: mean and standard error over --seeds
    seeds; for a subset of the drafts (ALPHA_SCHEMES).
Writes quantized_beta, quantized_position, quantized_alpha (.csv/.md) and quantized.png.
--target and --draft take npspec SPECs instead of the shipped pair (e.g. `--target gpt2-large
--draft distilgpt2` where the hub is reachable); the text stays the shipped validation split.

Speed is not measured here: the drafts above run on float32 weights dequantized at load (kernel
"gemv-rows"), so their forward costs what the float32 model's does; c_bw is the limit a kernel
reading packed codes could approach, not a measurement. `python -m bench.qspeed` measures c of
npspec's dequantizing kernel ("dequant-panels", npspec.kernels.quantized) on random:gpt2-large and puts the
predicted speedups with c measured beside these betas (quantized_speed.md).
"""

import sys

import numpy as np

from npspec.decode.evaluate import acceptance, expected_tokens_per_round, fixed_prompts, predicted_speedup
from npspec.model.tensors import tensor_shapes
from npspec.sources.quantize import parse_scheme, weight_bytes
from npspec.sources.quantized import awq_quantize_model, quantize_model
from npspec.decode.sampling import sample, warp
from npspec.sources import load

from . import common, models

WARPS = {"greedy": dict(temperature=0.0), "t0.8_p0.95": dict(temperature=0.8, top_p=0.95),
         "t1.0": dict(temperature=1.0)}
BITS = (8, 6, 5, 4, 3, 2)
GRANULARITIES = ("ch", "g128", "g64", "g32")
GAMMA = 4
DEPTH, CONTEXT, REPEAT = 8, 64, 4
CALIBRATION = 8
WINDOWS, STARTS, PROMPTS, SEEDS = 48, 96, 16, 3  # the full run's sample sizes (notes/quantized.md says why)
POSITION_SCHEMES = (("fp32", "rtn"), ("bf16", "rtn"), ("int8-ch", "rtn"), ("int4-ch", "rtn"), ("int4-g64", "rtn"),
                    ("int3-g64", "rtn"), ("int2-g64", "rtn"), ("int4-g64", "awq"), ("int3-g64", "awq"))
ALPHA_SCHEMES = tuple((s, "rtn") for s in ("fp32", "int8-ch", "int4-ch", "int4-g64", "int3-g64", "int2-g64"))
# measured alpha costs a speculative run per prompt, seed and warping: only for the drafts notes/quantized.md compares


def all_configs():
    """Every (scheme, method) of the study, in table order: fp32 (unquantized), the 16-bit levels, then int by bits and
    granularity, then the +emb variants (16-bit, -ch and -g64), then AWQ (-ch and -g64)."""
    ints = [f"int{b}-{g}" for b in BITS for g in GRANULARITIES]
    emb = ["fp16+emb", "bf16+emb"] + [f"int{b}-{g}+emb" for b in BITS for g in ("ch", "g64")]
    awq = [(f"int{b}-{g}", "awq") for b in BITS for g in ("ch", "g64")]
    return [(s, "rtn") for s in ["fp32", "fp16", "bf16", *ints, *emb]] + awq


def quick_configs():
    """The --quick run's (scheme, method) pairs: one of each kind."""
    return [("fp32", "rtn"), ("bf16", "rtn"), ("int8-ch", "rtn"), ("int4-g64", "rtn"), ("int2-ch+emb", "rtn"),
            ("int4-g64", "awq")]


def make_draft(base, name, method, calibration):
    """The draft (name, method) builds from `base`, decoding with gemv-rows: the model itself for fp32, else base
    quantized with round-to-nearest ("rtn") or AWQ ("awq", calibrated on the id windows `calibration`)."""
    if name == "fp32":
        return base.with_kernel("gemv-rows")
    if method == "awq":
        return awq_quantize_model(base, parse_scheme(name), calibration, "gemv-rows")
    return quantize_model(base, parse_scheme(name), "gemv-rows")


def calibration_windows(train_ids, n_ctx, count):
    """`count` windows of n_ctx ids at evenly spaced offsets of the TRAINING ids (AWQ's calibration set)."""
    step = (len(train_ids) - n_ctx) // count
    return [np.asarray(train_ids[i * step : i * step + n_ctx]) for i in range(count)]


def windows(val_ids, n_ctx, count):
    """The first `count` non-overlapping windows of n_ctx + 1 ids (the tail shorter), as npspec.decode.evaluate.validation_loss."""
    ids = np.asarray(val_ids)
    return [ids[s : s + n_ctx + 1] for s in range(0, len(ids) - 1, n_ctx)[:count]]


def reference(target, wins):
    """The target's warped rows p for every window and warping: {warp name: [[n, n_vocab] float64]}."""
    logits = [target.prefill(w[:-1], target.new_cache()) for w in wins]
    return {k: [warp(x, **a) for x in logits] for k, a in WARPS.items()}


def beta_and_loss(draft, wins, ref):
    """Exact beta of `draft` on the windows `wins`, its uncertainty, and its cross-entropy.

    Returns ({warp name: mean over positions of sum min(p, q)}, {warp name: [len(wins)] the mean over each window's
    positions}, mean cross-entropy in nats/token). beta is exact for the text read; what is uncertain is which text
    was read, so the per-window means are what an interval is taken over (`mean_and_se`: the windows are disjoint
    stretches of the validation split, treated as independent draws of text).
    """
    betas, nll, count = {k: [] for k in WARPS}, 0.0, 0
    for i, w in enumerate(wins):
        logits = draft.prefill(w[:-1], draft.new_cache())
        x = logits.astype(np.float64)
        top = x.max(-1)
        logz = np.log(np.exp(x - top[:, None]).sum(-1)) + top
        nll += float((logz - x[np.arange(len(w) - 1), w[1:]]).sum())
        count += len(w) - 1
        for k, a in WARPS.items():
            betas[k].append(np.minimum(ref[k][i], warp(logits, **a)).sum(-1))
    per_window = {k: [float(b.mean()) for b in v] for k, v in betas.items()}
    return {k: float(np.concatenate(v).mean()) for k, v in betas.items()}, per_window, nll / count


def mean_and_se(values):  # [n] floats -> (mean, standard error of the mean; 0.0 for n = 1)
    """The mean of independent values and its standard error, std (ddof 1) / sqrt(n)."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()), (float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0)


def ratio_and_se(num, den):  # [n], [n] counts per unit -> (sum num / sum den, its standard error)
    """A pooled ratio over independent units (prompts x seeds) and its standard error by the delta method for a
    ratio estimator: se^2 = sum (num_i - r den_i)^2 / (n (n - 1) mean(den)^2) (Cochran, Sampling Techniques, 3rd
    ed., eq. 6.13, without the finite-population factor). nan for no denominator."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    if den.sum() == 0:
        return float("nan"), float("nan")
    r, n = float(num.sum() / den.sum()), len(num)
    if n < 2:
        return r, 0.0
    return r, float(np.sqrt(((num - r * den) ** 2).sum() / (n * (n - 1))) / den.mean())


def position_betas(target, draft, val_ids, starts, warp_args, seed=0):
    """beta at draft positions i = 1..DEPTH along the draft's own proposals, with its standard error, and how often
    the proposal repeats a recent id.

    Each start s: context val_ids[s - CONTEXT : s]; the draft proposes DEPTH tokens one forward
    each (as npspec.decode.drafters.ModelDrafter: greedy, or sampled with uniforms from one Generator
    seeded with `seed`); the target scores context + proposals in one prefill. Returns three lists
    of DEPTH floats: the mean over starts of sum min(p_i, q_i), its standard error over starts, and
    `repeat`, the fraction of starts whose i-th proposal equals one of the REPEAT ids before it (a
    draft caught in a loop of one or a few tokens: "\n\n\n...", "you, you, you").
    """
    rng = np.random.default_rng(seed)
    greedy = warp_args["temperature"] == 0
    per_start, repeats = [], []
    for s in starts:
        seq = [int(t) for t in val_ids[s - CONTEXT : s]]
        cache = draft.new_cache()
        draft.prefill(np.asarray(seq[:-1]), cache)
        qs = []
        for _ in range(DEPTH):
            q = warp(draft.forward(np.asarray(seq[cache.length:]), cache)[-1], **warp_args)
            u = rng.random()
            seq.append(int(np.argmax(q)) if greedy else sample(q, u))
            qs.append(q)
        p = warp(target.prefill(np.asarray(seq[:-1]), target.new_cache())[-DEPTH:], **warp_args)
        per_start.append(np.minimum(p, np.array(qs)).sum(-1))
        n = len(seq) - DEPTH
        repeats.append([seq[n + i] in seq[n + i - REPEAT : n + i] for i in range(DEPTH)])
    stats = [mean_and_se(col) for col in np.array(per_start).T]
    return [m for m, _ in stats], [se for _, se in stats], list(np.mean(repeats, axis=0))


def measured_alpha(target, draft, prompts, seeds, new_tokens):
    """{warp name: (alpha, its se, tokens/round, its se, acceptance by position)} at gamma 4.

    One run per (prompt, seed) unit (greedy: per prompt, its one output), each with its own Generator seeded
    `seed`; alpha = accepted / tested and tokens/round = new tokens / rounds pooled over the units, with standard
    errors over the units (`ratio_and_se`), which are independent.
    """
    out = {}
    for k, a in WARPS.items():
        runs = [acceptance(target, draft, [prompt], gamma=GAMMA, max_new_tokens=new_tokens, seed=s, **a)
                for prompt in prompts for s in (seeds[:1] if a["temperature"] == 0 else seeds)]
        alpha = ratio_and_se([r.accepted for r in runs], [r.accepted + r.rejected for r in runs])
        tpr = ratio_and_se([r.new_tokens for r in runs], [r.rounds for r in runs])
        tested = np.sum([r.tested_by_position for r in runs], axis=0)
        accepted = np.sum([r.accepted_by_position for r in runs], axis=0)
        out[k] = (*alpha, *tpr, [float(x / t) if t else float("nan") for x, t in zip(accepted, tested)])
    return out


def bits_of(name):
    """Bits per weight of a scheme name (32 for the unquantized "fp32")."""
    return 32 if name == "fp32" else parse_scheme(name).bits


def granularity(name):
    """"ch", "g<group>", or the name of a float level ("fp32", "fp16", "bf16"), without "+emb"."""
    if name == "fp32" or parse_scheme(name).kind != "int":
        return name.split("+")[0]
    s = parse_scheme(name)
    return "ch" if s.group is None else f"g{s.group}"


def plot(beta_rows, alpha_rows, path, target_label="shipped target", draft_label="shipped draft"):
    """quantized.png: beta (t1.0 and greedy) against bits for both families, one line per granularity, the
    shipped draft's level as a horizontal line; and the bandwidth-bound predicted speedup against bits. None without matplotlib."""
    plt = common.pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    ref = {k: next(r[f"beta_{k}"] for r in beta_rows if r["draft"] == draft_label and r["scheme"] == "fp32")
           for k in ("greedy", "t1.0")}
    for j, (family, warpname) in enumerate([(target_label, "t1.0"), (target_label, "greedy")]):
        lines = [(g, "rtn", False, "o-") for g in GRANULARITIES] + [("ch", "rtn", True, "x--"), ("g64", "rtn", True, "x--"),
                                                                   ("ch", "awq", False, "d-."), ("g64", "awq", False, "d-.")]
        for g, method, emb, style in lines:
            rows = [r for r in beta_rows if r["draft"] == family and r["granularity"] == g and r["emb"] == emb
                    and r["method"] == method and r["bits"] <= 8]
            if rows:
                ax[j].plot([r["bits"] for r in rows], [r[f"beta_{warpname}"] for r in rows], style,
                           label=f"self {g} {method}{' +emb' if emb else ''}")
        rows = [r for r in beta_rows if r["draft"] == draft_label and r["granularity"] == "g64" and not r["emb"]
                and r["method"] == "rtn"]
        ax[j].plot([r["bits"] for r in rows], [r[f"beta_{warpname}"] for r in rows], "s:", color="gray",
                   label=f"{draft_label} g64 rtn")
        a = [r for r in alpha_rows if r["draft"] == family and not r["emb"] and r["granularity"] == "g64"
             and r["method"] == "rtn" and r["bits"] <= 8]
        ax[j].plot([r["bits"] for r in a], [r[f"alpha_{warpname}"] for r in a], "k^", label="measured alpha, self g64")
        ax[j].axhline(ref[warpname], color="gray", lw=1, label=f"{draft_label}, fp32")
        ax[j].set(xlabel="bits per weight", ylabel="acceptance", title=f"self-draft vs bits ({warpname})",
                  xticks=[2, 3, 4, 5, 6, 8], ylim=(0, 1.02))
        ax[j].legend(fontsize=7)
    for family, style in ((target_label, "o-"), (draft_label, "s:")):
        rows = [r for r in beta_rows if r["draft"] == family and r["granularity"] == "g64" and not r["emb"]
                and r["method"] == "rtn" and r["bits"] <= 8]
        ax[2].plot([r["bits"] for r in rows], [r["speedup_bw_t1.0"] for r in rows], style, label=f"{family} g64")
    ax[2].axhline(1, color="k", lw=0.5)
    ax[2].set(xlabel="bits per weight", ylabel="predicted speedup (bandwidth-bound, v = 1)",
              title="E[tokens/round](beta t1.0) / (4 c_bw + 1)", xticks=[2, 3, 4, 5, 6, 8])
    ax[2].legend(fontsize=7)
    return common.save_figure(fig, path)


def options(ap):
    """This command's own options (bench.common.command_line adds --quick, --out and --threads)."""
    ap.add_argument("--windows", type=int, default=None, help=f"validation windows of n_ctx + 1 ids (default {WINDOWS}; quick 2)")
    ap.add_argument("--starts", type=int, default=None, help=f"starts of the per-position study (default {STARTS}; quick 4)")
    ap.add_argument("--seeds", type=int, default=None, help=f"seeds of each sampled alpha (default {SEEDS}; quick 1)")
    ap.add_argument("--target", metavar="SPEC", default=None,
                    help="the target, an npspec SPEC (default: the shipped target), e.g. gpt2-large where the hub is "
                         "reachable; the text is still the shipped pair's validation split, in its tokenizer")
    ap.add_argument("--draft", metavar="SPEC", default=None,
                    help="the separately trained draft quantized as the second family (default: the shipped draft)")


def main(argv=None):
    run = common.command_line("bench.quantized", __doc__, argv, options=options, threads=("1", "1"), many=False)
    quick = run.args.quick
    n_windows = run.args.windows or (2 if quick else WINDOWS)
    n_starts = run.args.starts or (4 if quick else STARTS)
    seeds = list(range(run.args.seeds or (1 if quick else SEEDS)))
    configs = quick_configs() if quick else all_configs()
    n_prompts, new_tokens = (2, 16) if quick else (PROMPTS, 64)
    with common.blas_threads(run.threads[0]):
        with common.notes():
            target = load(run.args.target, "target", threads=run.threads[0])
            draft = load(run.args.draft, "draft", threads=run.threads[0])
        labels = ("shipped target" if run.args.target is None else f"target {run.args.target}",
                  "shipped draft" if run.args.draft is None else f"draft {run.args.draft}")
        val_ids = models.validation_ids(target.tokenizer)
        calibration = calibration_windows(models.validation_ids(target.tokenizer, part=0), target.config.n_ctx,
                                          2 if quick else CALIBRATION)
        wins = windows(val_ids, target.config.n_ctx, n_windows)
        ref = reference(target, wins)
        target_bytes = models.matrix_bytes(target)
        starts = [CONTEXT + i * (len(val_ids) - CONTEXT - DEPTH) // n_starts for i in range(n_starts)]
        prompts = fixed_prompts(val_ids, n=n_prompts)
        beta_rows, window_rows, position_rows, alpha_rows = [], [], [], []
        for family, base in zip(labels, (target, draft)):
            shapes = tensor_shapes(base.config)
            for name, method in common.steps(configs, f"quantized {family}, scheme"):
                q = make_draft(base, name, method, calibration)
                betas, per_window, loss = beta_and_loss(q, wins, ref)
                nbytes = models.matrix_bytes(base) if name == "fp32" else int(weight_bytes(shapes, parse_scheme(name)))
                c_bw = nbytes / target_bytes
                row = {"draft": family, "scheme": name, "method": method, "bits": bits_of(name),
                       "granularity": granularity(name), "emb": name.endswith("+emb")}
                row.update({f"beta_{k}": v for k, v in betas.items()})
                row.update({f"beta_{k}_se": mean_and_se(v)[1] for k, v in per_window.items()})
                window_rows += [{"draft": family, "scheme": name, "method": method, "window": i,
                                 **{f"beta_{k}": per_window[k][i] for k in WARPS}} for i in range(len(wins))]
                row.update({"val_loss": loss, "val_ppl": float(np.exp(loss)), "bytes_per_token": nbytes, "c_bw": c_bw})
                row.update({f"speedup_bw_{k}": predicted_speedup(min(v, 1 - 1e-12), GAMMA, c_bw, 1.0)
                            for k, v in betas.items()})
                beta_rows.append(row)
                common.log(f"{family} {name} {method}: beta " + ", ".join(f"{k} {v:.4f}" for k, v in betas.items())
                           + f", ppl {np.exp(loss):.2f}, c_bw {c_bw:.3f}")
                if quick or (name, method) in POSITION_SCHEMES:
                    for k in ("greedy", "t1.0"):
                        per, per_se, repeat = position_betas(target, q, val_ids, starts, WARPS[k])
                        position_rows += [{"draft": family, "scheme": name, "method": method, "warping": k,
                                           "position": i + 1, "beta": b, "beta_se": se, "repeat": r}
                                          for i, (b, se, r) in enumerate(zip(per, per_se, repeat))]
                        common.log(f"  positions {k}: " + " ".join(f"{b:.3f}" for b in per))
                if quick or (name, method) in ALPHA_SCHEMES:
                    res = measured_alpha(target, q, prompts, seeds, new_tokens)
                    arow = {"draft": family, "scheme": name, "method": method, "bits": bits_of(name),
                            "granularity": granularity(name), "emb": name.endswith("+emb")}
                    for k, (am, ase, tm, tse, by_pos) in res.items():
                        arow.update({f"alpha_{k}": am, f"alpha_{k}_se": ase, f"tokens_per_round_{k}": tm,
                                     f"tokens_per_round_{k}_se": tse, f"beta_{k}": betas[k],
                                     f"geometric_{k}": expected_tokens_per_round(min(betas[k], 1 - 1e-12), GAMMA)})
                        arow.update({f"acceptance_{k}_pos{i + 1}": v for i, v in enumerate(by_pos)})
                    alpha_rows.append(arow)
                    common.log("  alpha " + ", ".join(f"{k} {v[0]:.3f}" for k, v in res.items()))
    positions = sum(len(w) - 1 for w in wins)
    run.meta["validation"] = (f"beta and perplexity: {positions} positions (the first {len(wins)} windows of "
                              f"{target.config.n_ctx} + 1 ids of the validation split)")
    run.meta["alpha"] = (f"gamma {GAMMA}, {n_prompts} prompts x 32 validation ids (fixed_prompts), {new_tokens} new "
                         f"tokens each, one run per prompt and seed (seeds {seeds} for sampled warpings, seed 0 greedy)")
    run.meta["positions"] = f"{n_starts} starts x {CONTEXT} ids of context, {DEPTH} draft positions"
    run.meta["awq_calibration"] = (f"{len(calibration)} windows x {target.config.n_ctx} ids at evenly spaced offsets "
                                   "of the training split")
    return common.finish(run, [
        common.Table("quantized_beta", beta_rows, "Exact acceptance beta of quantized drafts against the float32 "
                     "shipped target",
                     "beta_W: mean over validation positions of sum min(p, q) at warping W (greedy = argmax agreement); "
                     "beta_W_se: its standard error over the windows (quantized_beta_windows holds each window's mean). "
                     "c_bw: weight bytes a one-token forward reads (packed codes + float32 scales) over the float32 "
                     "target's; speedup_bw_W = E[tokens/round](beta_W, gamma 4) / (4 c_bw + 1), the bandwidth-bound "
                     "limit, NOT a measured speed (npspec dequantizes to float32 at load)."),
        common.Table("quantized_beta_windows", window_rows, "beta of each quantized draft in each validation window",
                     "beta_W: the mean of sum min(p, q) over one window's positions; the same windows for every draft, "
                     "so two drafts compare by their paired differences."),
        common.Table("quantized_position", position_rows, "beta by draft position along the draft's own proposals",
                     f"Mean over starts of sum min(p_i, q_i) at position i (beta_se: its standard error over starts); "
                     f"not conditioned on acceptance. repeat: the fraction of starts whose i-th proposal equals one of "
                     f"the {REPEAT} ids before it."),
        common.Table("quantized_alpha", alpha_rows, "Measured acceptance at gamma 4 (the model card's prompts)",
                     "alpha: accepted / tested, pooled over one run per prompt and seed; _se: standard error over those "
                     "runs (ratio estimator); tokens_per_round = mean acceptance length (every round proposes); "
                     "geometric: (1 - beta^5) / (1 - beta) with the exact beta; acceptance_W_posI: accepted / tested "
                     "at position I (conditional on reaching it).")],
        [plot(beta_rows, alpha_rows, run.out / "quantized.png", *labels)])


if __name__ == "__main__":
    sys.exit(main())

"""python -m bench.sweep: acceptance of the shipped pair against gamma and against temperature.

1. Draft-length sweep, greedy: for gamma = 1..8, alpha (accepted / tested), acceptance by
   position within the round, and tokens per round against the geometric model
   (1 - alpha^(gamma+1)) / (1 - alpha) (Leviathan et al. 2023, eq. 1) with the measured alpha.
2. Temperature sweep, gamma = 4, no top-k/top-p: temperature 0 (greedy, exact, one run) and
   0.1 .. 2.0, each averaged over 8 seeds (mean and standard error over seeds), next to
   beta = E[sum min(p, q)], the acceptance the theory expects (Leviathan et al. 2023, section 3.1),
   computed on the first validation window.
Prompts: 16-token slices at fixed offsets of the validation text (npspec.evaluate.fixed_prompts).
Writes sweep_gamma, sweep_position, sweep_temperature (.csv/.md) and sweep.png.
"""

import sys

import numpy as np

from npspec.evaluate import acceptance, expected_acceptance, fixed_prompts, split_corpus
from npspec.models import load, shipped_dir

from . import common


def geometric(alpha, gamma):
    """Expected tokens per round for i.i.d. acceptance alpha: (1 - alpha^(gamma+1)) / (1 - alpha)."""
    return gamma + 1.0 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def gamma_sweep(target, draft, prompts, gammas, new_tokens, log):
    rows, positions = [], []
    for gamma in gammas:
        s = acceptance(target, draft, prompts, gamma=gamma, max_new_tokens=new_tokens, temperature=0)
        rows.append({"gamma": gamma, "alpha": s.alpha, "tokens_per_round": s.tokens_per_round,
                     "geometric_tokens_per_round": geometric(s.alpha, gamma), "accepted": s.accepted,
                     "rejected": s.rejected, "rounds": s.rounds, "new_tokens": s.new_tokens})
        for i, (a, t) in enumerate(zip(s.accepted_by_position, s.tested_by_position)):
            positions.append({"gamma": gamma, "position": i + 1, "tested": t, "accepted": a,
                              "acceptance": a / t if t else float("nan")})
        log(f"gamma {gamma}: alpha {s.alpha:.3f}, tokens/round {s.tokens_per_round:.2f} "
            f"(geometric {geometric(s.alpha, gamma):.2f})")
    return rows, positions


def temperature_sweep(target, draft, prompts, temperatures, seeds, new_tokens, val_ids, log):
    rows = []
    for temp in temperatures:
        runs = [acceptance(target, draft, prompts, gamma=4, max_new_tokens=new_tokens, temperature=temp, seed=s)
                for s in (seeds[:1] if temp == 0 else seeds)]
        alphas = np.array([r.alpha for r in runs])
        tpr = np.array([r.tokens_per_round for r in runs])
        se = (lambda x: float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else 0.0)
        beta = expected_acceptance(target, draft, val_ids, temperature=temp)  # temperature 0: argmax agreement
        rows.append({"temperature": temp, "seeds": len(runs), "alpha": float(alphas.mean()), "alpha_se": se(alphas),
                     "tokens_per_round": float(tpr.mean()), "tokens_per_round_se": se(tpr), "beta": beta})
        log(f"temperature {temp}: alpha {alphas.mean():.3f}, beta {beta:.3f}, tokens/round {tpr.mean():.2f}")
    return rows


def plot(gamma_rows, position_rows, temp_rows, path):
    plt = common.pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
    g = [r["gamma"] for r in gamma_rows]
    ax[0].plot(g, [r["tokens_per_round"] for r in gamma_rows], "o-", label="measured")
    ax[0].plot(g, [r["geometric_tokens_per_round"] for r in gamma_rows], "k--", label="geometric, measured alpha")
    ax[0].set(xlabel="gamma", ylabel="tokens per round", title="draft length (greedy)")
    ax[0].legend(fontsize=8)
    for gamma in g:
        pts = [r for r in position_rows if r["gamma"] == gamma and r["tested"]]
        ax[1].plot([r["position"] for r in pts], [r["acceptance"] for r in pts], ".-", label=f"gamma {gamma}")
    ax[1].set(xlabel="position in round", ylabel="accepted / tested", title="acceptance by position", ylim=(0, 1))
    ax[1].legend(fontsize=7, ncol=2)
    t = [r["temperature"] for r in temp_rows]
    ax[2].errorbar(t, [r["alpha"] for r in temp_rows], yerr=[r["alpha_se"] for r in temp_rows], fmt="o-",
                   label="alpha (measured)")
    ax[2].plot(t, [r["beta"] for r in temp_rows], "k--", label="beta = E sum min(p, q)")
    ax[2].set(xlabel="temperature", ylabel="acceptance", title="acceptance vs temperature (gamma 4)", ylim=(0, 1))
    ax[2].legend(fontsize=8)
    common.save_figure(fig, path)
    return path


def main(argv=None):
    ap = common.parser("bench.sweep", __doc__.split("\n")[0])
    args = ap.parse_args(argv)
    out = common.output_dir(args)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    target, draft = load(None, "target"), load(None, "draft")
    text = (shipped_dir("shakespeare/target").parent / "input.txt").read_text(encoding="utf-8")
    val_ids = target.tokenizer.encode(split_corpus(text)[1]).ids
    if args.quick:
        n_prompts, new_tokens, gammas, temps, seeds = 2, 32, [1, 2, 4], [0.0, 0.5, 1.0], [0, 1]
        t_prompts, t_tokens = 2, 32
    else:
        n_prompts, new_tokens, gammas = 8, 128, list(range(1, 9))
        temps, seeds = [0.0] + [round(0.1 * i, 1) for i in range(1, 21)], list(range(8))
        t_prompts, t_tokens = 4, 64
    prompts = fixed_prompts(val_ids, n=n_prompts, length=16)
    meta = common.machine_info()
    with common.blas_threads(common.thread_counts(args)[0]):
        gamma_rows, position_rows = gamma_sweep(target, draft, prompts, gammas, new_tokens, log)
        temp_rows = temperature_sweep(target, draft, fixed_prompts(val_ids, n=t_prompts, length=16), temps, seeds,
                                      t_tokens, val_ids, log)
    meta["prompts"] = (f"gamma sweep: {n_prompts} x 16 tokens of the validation text, {new_tokens} new tokens each; "
                       f"temperature sweep: {t_prompts} prompts x {t_tokens} new tokens per seed")
    meta["command"] = "python -m bench.sweep " + " ".join(argv if argv is not None else sys.argv[1:])
    common.write_table(out, "sweep_gamma", gamma_rows, meta, "Acceptance against gamma (shipped pair, greedy)",
                       "geometric_tokens_per_round = (1 - alpha^(gamma+1)) / (1 - alpha) with the measured alpha; "
                       "the last round of each prompt is shortened by the budget, so measured values sit slightly "
                       "below.")
    common.write_table(out, "sweep_position", position_rows, meta, "Acceptance by position within the round")
    common.write_table(out, "sweep_temperature", temp_rows, meta, "Acceptance against temperature (gamma 4)",
                       f"Mean and standard error over {len(seeds)} seeds (temperature 0: one exact run). "
                       "beta: mean of sum min(p, q) over the first validation window.")
    png = plot(gamma_rows, position_rows, temp_rows, out / "sweep.png")
    print(f"wrote {out / 'sweep_gamma.md'}, {out / 'sweep_temperature.md'}" + (f", {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

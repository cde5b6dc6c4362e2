"""python -m bench.sweep: acceptance of the shipped pair against gamma and against temperature.

1. Draft-length sweep, greedy: for gamma = 1..8, alpha (accepted / tested), acceptance by
   position within the round, and tokens per round against the geometric model
   (1 - alpha^(gamma+1)) / (1 - alpha) (npspec.decode.evaluate.expected_tokens_per_round; Leviathan et
   al. 2023, eq. 1) with the measured alpha.
2. Temperature sweep, gamma = 4, no top-k/top-p: temperature 0 (greedy, exact, one run) and
   0.1 .. 2.0, each averaged over 8 seeds (mean and standard error over seeds), next to
   beta = E[sum min(p, q)], the acceptance the theory expects (Leviathan et al. 2023, section 3.1),
   computed on the first validation window.
Prompts: 16-token slices at fixed offsets of the validation text (bench.models.validation_prompts).
Writes sweep_gamma, sweep_position, sweep_temperature (.csv/.md) and sweep.png.
"""

import sys

import numpy as np

from npspec.decode.evaluate import acceptance, expected_acceptance, expected_tokens_per_round

from . import common, models


def gamma_sweep(target, draft, prompts, gammas, new_tokens):
    rows, positions = [], []
    for gamma in common.steps(gammas, "sweep gamma"):
        s = acceptance(target, draft, prompts, gamma=gamma, max_new_tokens=new_tokens, temperature=0)
        geometric = expected_tokens_per_round(s.alpha, gamma)
        rows.append({"gamma": gamma, "alpha": s.alpha, "tokens_per_round": s.tokens_per_round,
                     "geometric_tokens_per_round": geometric, "accepted": s.accepted,
                     "rejected": s.rejected, "rounds": s.rounds, "new_tokens": s.new_tokens})
        for i, (a, t) in enumerate(zip(s.accepted_by_position, s.tested_by_position)):
            positions.append({"gamma": gamma, "position": i + 1, "tested": t, "accepted": a,
                              "acceptance": a / t if t else float("nan")})
        common.log(f"gamma {gamma}: alpha {s.alpha:.3f}, tokens/round {s.tokens_per_round:.2f} "
                   f"(geometric {geometric:.2f})")
    return rows, positions


def temperature_sweep(target, draft, prompts, temperatures, seeds, new_tokens, val_ids):
    rows = []
    for temp in common.steps(temperatures, "sweep temperature"):
        runs = [acceptance(target, draft, prompts, gamma=4, max_new_tokens=new_tokens, temperature=temp, seed=s)
                for s in (seeds[:1] if temp == 0 else seeds)]
        alphas = np.array([r.alpha for r in runs])
        tpr = np.array([r.tokens_per_round for r in runs])
        se = (lambda x: float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else 0.0)
        beta = expected_acceptance(target, draft, val_ids, temperature=temp)  # temperature 0: argmax agreement
        rows.append({"temperature": temp, "seeds": len(runs), "alpha": float(alphas.mean()), "alpha_se": se(alphas),
                     "tokens_per_round": float(tpr.mean()), "tokens_per_round_se": se(tpr), "beta": beta})
        common.log(f"temperature {temp}: alpha {alphas.mean():.3f}, beta {beta:.3f}, tokens/round {tpr.mean():.2f}")
    return rows


def plot(gamma_rows, position_rows, temp_rows, path):
    """sweep.png: tokens per round against gamma, acceptance by position, acceptance against temperature.

    None without matplotlib.
    """
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
    return common.save_figure(fig, path)


def main(argv=None):
    run = common.command_line("bench.sweep", __doc__, argv, threads=("1", "1"), many=False)
    with common.blas_threads(run.threads[0]):
        target = models.get("shipped:target", threads=run.threads[0])
        draft = models.get("shipped:draft", threads=run.threads[0])
        val_ids = models.validation_ids(target.tokenizer)
        if run.args.quick:
            n_prompts, new_tokens, gammas, temps, seeds = 2, 32, [1, 2, 4], [0.0, 0.5, 1.0], [0, 1]
            t_prompts, t_tokens = 2, 32
        else:
            n_prompts, new_tokens, gammas = 8, 128, list(range(1, 9))
            temps, seeds = [0.0] + [round(0.1 * i, 1) for i in range(1, 21)], list(range(8))
            t_prompts, t_tokens = 4, 64
        gamma_rows, position_rows = gamma_sweep(target, draft, models.validation_prompts(val_ids, n_prompts), gammas,
                                                new_tokens)
        temp_rows = temperature_sweep(target, draft, models.validation_prompts(val_ids, t_prompts), temps, seeds,
                                      t_tokens, val_ids)
    run.meta["prompts"] = (f"gamma sweep: {n_prompts} x {models.PROMPT_LENGTH} tokens of the validation text, "
                           f"{new_tokens} new tokens each; temperature sweep: {t_prompts} prompts x {t_tokens} new "
                           "tokens per seed")
    return common.finish(run, [
        common.Table("sweep_gamma", gamma_rows, "Acceptance against gamma (shipped pair, greedy)",
                     "geometric_tokens_per_round = (1 - alpha^(gamma+1)) / (1 - alpha) with the measured alpha; "
                     "the last round of each prompt is shortened by the budget, so measured values sit slightly "
                     "below."),
        common.Table("sweep_position", position_rows, "Acceptance by position within the round"),
        common.Table("sweep_temperature", temp_rows, "Acceptance against temperature (gamma 4)",
                     f"Mean and standard error over {len(seeds)} seeds (temperature 0: one exact run). "
                     "beta: mean of sum min(p, q) over the first validation window.")],
        [plot(gamma_rows, position_rows, temp_rows, run.out / "sweep.png")])


if __name__ == "__main__":
    sys.exit(main())

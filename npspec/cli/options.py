"""generate's options: the parser (build_parser) and every check that needs no model (checked), each once, before
a model loads; a failed check raises ValueError naming the option and its fix. Imports npspec.decode (choices,
bounds), npspec.kernels.registry (names), npspec.sources (SPECs, paths, probe modes) and console's Parser.
"""

import argparse
import logging
import os

from ..decode import RULES, SCHEDULES, SIBLINGS, Options, SamplingParams, accept
from ..decode.drafters import COMMANDS, check_p_min
from ..decode.rules.trees import MAX_TREE_NODES, branching_tree
from ..kernels.registry import names as kernel_names, role_candidates
from ..sources import HUB_NAMES, SHIPPED_PAIR, shipped_dir
from ..sources.atomic import expand, replace_problem, resolved
from ..sources.choices import MODES
from .console import Parser, integer
from .console import number as real  # (report.number formats a ratio)

log = logging.getLogger(__name__)

DEFAULT_PROMPT = "ROMEO:"
NUMBER_TYPES = {int: integer, float: real}  # how the command line reads a number (npspec.cli.console): ASCII only
PROG = "python -m npspec.generate"
DESCRIPTION = "python -m npspec.generate: speculative decoding from the command line."  # --help's first line


def build_parser(prog=PROG, out=None, err=None):
    """The parser; prog: the name usage shows; help to `out`, usage errors to `err` (console.Parser)."""
    ap = Parser(prog=prog, description=DESCRIPTION, out=out, err=err)
    ap.add_argument("prompt", nargs="?", default=None,
                    help=f"prompt text, or - to read it from stdin (default: {DEFAULT_PROMPT!r})")
    spec = ("SPEC: a model directory (converted or Hugging Face), random:<shape>, or a hub name "
            f"({', '.join(HUB_NAMES)}, org/name)")
    ap.add_argument("--target", metavar="SPEC", default=None, help=f"{spec} (default: the shipped target)")
    ap.add_argument("--draft", metavar="SPEC", default=None,
                    help=f"{spec}, or {', '.join(f'`{c.word}`: {c.about}' for c in COMMANDS.values())}, or "
                         "SCHEME:SPEC / SCHEME:self: that "
                         "model / the target quantized, e.g. int4-g64:self (default: the shipped draft for the shipped "
                         "target; another target without --draft decodes plainly)")
    add_drafting_options(ap)
    ap.add_argument("--max-new-tokens", type=integer, default=128, help="tokens to generate (default 128)")
    ap.add_argument("--temperature", type=real, default=0.8, help="0 = greedy (default 0.8)")
    ap.add_argument("--top-k", type=integer, default=0, help="keep the k most likely tokens; 0 = off (default)")
    ap.add_argument("--top-p", type=real, default=0.95, help="nucleus mass in (0, 1]; 1 = off (default 0.95)")
    ap.add_argument("--seed", type=integer, default=0,
                    help="seed of the one random generator (default 0): the same seed, models, prompt and "
                         "options give the same output (README: Reproducibility)")
    ap.add_argument("--threads", type=integer, default=None,
                    help="threads of each forward: the panel kernels' own workers, or BLAS's for gemm and gemv-rows "
                         "(default: $NPSPEC_NUM_THREADS, else the CPUs this process may use); a role's default kernel "
                         "runs at these or at one, as --kernel-probe timed faster; results never depend on it")
    ap.add_argument("--target-kernel", choices=kernel_names(cli=True, codes=False) + ("compiled-quant",), default=None,
                    help="the target's product (default: the fastest of " + ", ".join(role_candidates("target"))
                         + " on this machine, as timed by --kernel-probe; compiled-panels needs the fast extra; "
                         "compiled-quant: an int SCHEME:SPEC's codes, lossless relative to that quantized target)")
    ap.add_argument("--draft-kernel", choices=kernel_names(cli=True), default=None,
                    help="the draft's product (default: the fastest of " + ", ".join(role_candidates("draft"))
                         + " on this machine, as timed by --kernel-probe; compiled-panels needs the fast extra; "
                         "compiled-quant (an int SCHEME:SPEC's default with it) and dequant-panels keep its codes)")
    ap.add_argument("--kernel-probe", choices=MODES, default="cached",
                    help="how the default kernels, and the longest prompt each prefills itself, are chosen "
                         "(npspec.kernels.probe), once every check has passed: cached (measured once per machine and model "
                         "shape, kept in npspec's cache), refresh (measure again), bypass (measure, cache nothing), "
                         "off (no measurement: the first candidate, every prompt prefilled by GEMM) (default cached)")
    ap.add_argument("--json", action="store_true", help="print one JSON object: text, ids, stats")
    ap.add_argument("--trace", action="store_true",
                    help="with --json: add a record per round (drafted ids, accepted count, corrected or bonus id)")
    ap.add_argument("--html", metavar="FILE", default=None,
                    help="also write a page showing each round (drafts, accepted or not, p, q, u, times); a new "
                         "file, or an existing regular file with --force")
    ap.add_argument("--force", action="store_true", help="with --html: replace FILE if it exists (a regular file only)")
    ap.add_argument("--compare", action="store_true",
                    help="then run plain decoding with the same options (with the target's kernel, compiled-panels "
                         "when installed, gemv-rows and gemm) and print the speeds and the speedup over the fastest")
    ap.add_argument("--compare-repeats", type=integer, default=1, metavar="N",
                    help="with --compare: decode speculatively and then plainly with each kernel, in turn, N times, "
                         "and print the medians (default 1); where the machine's memory rate drifts (a virtual "
                         "machine), 5 keeps the drift out of the speedup")
    ap.add_argument("--simulate-acceptance", type=real, default=None, metavar="A",
                    help="SIMULATION for timing random-weight drafts: run the draft's forwards for their cost but make "
                         "each proposal the target's greedy token with probability A (needs --temperature 0 and a "
                         "draft model; the output stays the target's greedy output)")
    ap.add_argument("--no-color", action="store_true", help="do not colour accepted draft tokens")
    ap.add_argument("--quiet", action="store_true", help="no progress bars (nor with NPSPEC_QUIET=1 or "
                                                         "TQDM_DISABLE=1; they show only when stderr is a terminal)")
    ap.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return ap


def add_drafting_options(ap):
    """Gamma, its schedule, the acceptance rule, trees, confidence stopping and each COMMANDS drafter's options."""
    ap.add_argument("--gamma", type=integer, default=4,
                    help="draft tokens per round (the heuristic schedule's start); 0 = plain decoding (default 4)")
    ap.add_argument("--gamma-schedule", choices=SCHEDULES, default="constant",
                    help="constant: gamma every round; heuristic: transformers' rule, +2 after a round that kept "
                         "every draft, else -1, at least 1 (default constant)")
    ap.add_argument("--verify", choices=tuple(RULES), default="token",
                    help="the acceptance rule (npspec.decode.rules.RULES): token = token-by-token rejection "
                         "sampling (Leviathan et al. 2023; its multi-candidate form down a tree of i.i.d. children), "
                         "block = block verification of a chain (Sun et al. 2025), which keeps at least as many drafts "
                         "in law, rsd = a --tree whose siblings are drawn without replacement, verified by recursive "
                         "rejection sampling (Jeon et al. 2024), which keeps at least as many per node, exact-match = a "
                         "draft kept iff it equals the target's own sample (the engines' strict rule; chains only), "
                         "which keeps fewer, traversal = a tree (sampled siblings without replacement, or top-k or "
                         "budgeted) or a chain verified leaves up with whole-path weights (Weng et al. 2025), block "
                         "verification on a chain (default token)")
    ap.add_argument("--draft-p-min", type=real, default=0.0, metavar="P",
                    help="confidence stopping for a draft model: stop drafting after a token whose largest draft "
                         "probability is below P, as llama.cpp's --draft-p-min (default 0: off)")
    ap.add_argument("--tree", type=branching, default=None, metavar="K1,K2,...",
                    help="draft a token tree: K1 children of the last id, K2 of each of those, ... (e.g. 3,2,1); "
                         "verified in one forward (npspec.decode.rules.trees); its depth is at most --gamma, its nodes at most "
                         f"{MAX_TREE_NODES}")
    ap.add_argument("--tree-kind", choices=("sampled", "top-k"), default="sampled",
                    help="with --tree: children drawn i.i.d. from the draft (sampled) or its most likely ids (top-k)")
    ap.add_argument("--tree-budget", type=integer, default=None, metavar="N",
                    help="draft a dynamic tree of N nodes grown best first by cumulative draft probability "
                         "(EAGLE-2's idea; each node offers its 4 most likely ids); its depth is at most --gamma, "
                         f"N at most {MAX_TREE_NODES}")
    for command in COMMANDS.values():  # the options of each drafter without a model (npspec.decode.drafters)
        for flag, options in command.options:  # its int and float read as every number here: ASCII only
            if "type" in options:
                options = {**options, "type": NUMBER_TYPES.get(options["type"], options["type"])}
            ap.add_argument(flag, **options)


def branching(text):
    """--tree's value: "3,2,1" -> (3, 2, 1). Raises argparse.ArgumentTypeError for anything else."""
    try:
        counts = tuple(integer(k) for k in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of counts >= 1 such as 3,2,1")
    return counts


def is_shipped_target(spec):
    """Whether --target SPEC is the shipped target (None, or its directory)."""
    if spec is None:
        return True
    try:
        return resolved(expand(spec, "--target"), "--target") == shipped_dir(f"{SHIPPED_PAIR}/target").resolve()
    except (ValueError, OSError):  # CheckpointError included; a ~user that does not exist, a symlink loop: load says so
        return False


def drafting(args):
    """Whether the run drafts: --gamma >= 1 and --draft, or the shipped target (its own draft; another target
    without --draft decodes plainly)."""
    return args.gamma > 0 and (args.draft is not None or is_shipped_target(args.target))


def drafting_options(args):
    """The options given that need a drafter, as the user spelled them."""
    given = [("--draft-p-min", bool(args.draft_p_min)), ("--tree", bool(args.tree)),
             ("--tree-kind", args.tree_kind != "sampled"), ("--tree-budget", args.tree_budget is not None),
             ("--draft-kernel", args.draft_kernel is not None),
             ("--gamma-schedule heuristic", args.gamma_schedule != "constant"),
             ("--compare", args.compare), ("--simulate-acceptance", args.simulate_acceptance is not None),
             (f"--verify {args.verify}", args.verify != "token")]
    return [name for name, on in given if on]


def check_output_args(args):
    """Raise ValueError for --trace without --json, --compare-repeats below 1 or without --compare, --force
    without --html, and an --html FILE that cannot be written."""
    if args.trace and not args.json:
        raise ValueError("--trace adds a record per round to --json's output: add --json (or draw the rounds "
                         "with --html FILE)")
    if args.compare_repeats < 1:
        raise ValueError(f"--compare-repeats must be >= 1, got {args.compare_repeats}")
    if args.compare_repeats != 1 and not args.compare:
        raise ValueError("--compare-repeats repeats --compare's decodings: add --compare or drop it")
    if args.force and args.html is None:
        raise ValueError("--force replaces an existing --html FILE: add --html FILE or drop --force")
    if args.html is not None:
        path = expand(args.html, "--html")
        parent = path.parent
        try:
            if path.is_dir():
                raise ValueError(f"cannot write --html {args.html}: it is a directory; pick a file path")
            if problem := replace_problem(path):
                raise ValueError(f"cannot write --html {args.html}: {problem}")
            if path.exists() and not args.force:
                raise ValueError(f"--html {args.html} exists; pass --force to replace it, or pick a new file "
                                 "(nothing was written)")
            if not parent.is_dir():
                raise ValueError(f"cannot write --html {args.html}: {parent} is not a directory; pick a writable path")
        except OSError as e:
            raise ValueError(f"cannot write --html {args.html} ({e.strerror or e}); pick a writable path") from None
        if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise ValueError(f"cannot write --html {args.html}: permission denied; pick a writable path")


def check_drafting_args(args):
    """Raise ValueError for drafting options that conflict, do nothing or pass their bounds (MAX_TREE_NODES, a
    model-free drafter's Command.check)."""
    command = COMMANDS.get(args.draft)  # a drafter without a model (--draft WORD), or None
    words = " or ".join(f"--draft {word}" for word in COMMANDS)
    if command is not None and args.gamma == 0:
        raise ValueError(f"--draft {command.word} needs --gamma >= 1 (0 is plain decoding, with no drafter)")
    if args.gamma == 0 and (args.draft is not None or drafting_options(args)):
        given = ", ".join((["--draft"] if args.draft is not None else []) + drafting_options(args))
        raise ValueError(f"--gamma 0 is plain decoding, with no drafter, so {given} would do nothing: give "
                         "--gamma >= 1 or drop " + ("it" if "," not in given else "them"))
    if args.gamma > 0 and not drafting(args) and drafting_options(args):
        given = drafting_options(args)
        raise ValueError(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} a drafter, and without --draft "
                         f"the target {args.target} decodes plainly: add --draft SPEC (a draft with its tokenizer) or "
                         f"{words}")
    for other in COMMANDS.values():
        if other is not command and other.given(command_values(other, args)):
            flags = " and ".join(flag for flag, _ in other.options)
            raise ValueError(f"{flags} apply to --draft {other.word} only; add --draft {other.word} or drop them")
    if command is not None and args.draft_p_min:
        raise ValueError(f"--draft-p-min applies to a draft model, not to --draft {command.word} ({command.certain})")
    if command is not None and args.draft_kernel is not None:
        raise ValueError(f"--draft-kernel picks a draft model's product, and --draft {command.word} has no model; "
                         "drop it")
    check_tree_args(args, command, words)
    check_p_min(args.draft_p_min)
    if command is not None:
        command.check(**command_values(command, args))


def command_values(command, args):  # -> {name: value}
    """The values of a model-free drafter's own options (its Command.names), as its check and build take them."""
    return {name: getattr(args, name) for name in command.names}


def check_tree_args(args, command, words):
    """Raise ValueError for --tree, --tree-budget, --tree-kind and --simulate-acceptance used where they cannot apply;
    note (logging) a --tree deeper than a constant --gamma, which drafts only gamma levels."""
    if args.tree and args.tree_budget is not None:
        raise ValueError("--tree and --tree-budget are two kinds of tree; give one of them")
    if (args.tree or args.tree_budget is not None) and (command is not None or args.draft_p_min):
        raise ValueError(f"--tree drafts with a draft model; it cannot be combined with {words} or --draft-p-min")
    if args.tree_budget is not None and not 1 <= args.tree_budget <= MAX_TREE_NODES:
        raise ValueError(f"--tree-budget must be >= 1 and at most {MAX_TREE_NODES} (the tree's nodes; the largest "
                         f"tree npspec drafts), got {args.tree_budget}")
    if args.tree:
        branching_tree(args.tree)  # the node count's bound, checked before any model loads
        if args.gamma_schedule == "constant" and 0 < args.gamma < len(args.tree):
            log.info(f"--tree has {len(args.tree)} levels and --gamma is {args.gamma}: each round drafts the first "
                     f"{args.gamma} levels; give --gamma {len(args.tree)} to draft them all")
    if args.tree_kind != "sampled" and not args.tree:
        raise ValueError("--tree-kind applies to --tree only; add --tree K1,K2,... or drop it")
    siblings = RULES[args.verify].siblings  # a tree rule that is the token rule on anything else (rsd) needs its tree
    if siblings != "iid" and RULES[args.verify].chain is accept and not (args.tree and args.tree_kind == "sampled"):
        raise ValueError(f"--verify {args.verify} verifies a --tree of {SIBLINGS[siblings]} and is the token rule "
                         "anywhere else: add --tree K1,K2,... (without --tree-kind top-k) or use --verify token")
    if (a := args.simulate_acceptance) is not None:
        if not 0 <= a <= 1:  # also NaN
            raise ValueError(f"--simulate-acceptance is a probability: give a number in [0, 1], got {a}")
        if args.temperature != 0:
            raise ValueError("--simulate-acceptance steers greedy proposals only: add --temperature 0")
        if command is not None or args.tree or args.tree_budget is not None:
            raise ValueError("--simulate-acceptance steers a draft model's chain of proposals: give --draft SPEC "
                             f"without --tree, --tree-budget or {' or '.join(COMMANDS)}")


def checked(args):  # -> Options
    """The decoding Options of `args`, once Options' bounds, the drafting and output options and --seed are
    checked. Raises ValueError for the first that fails."""
    options = Options(args.max_new_tokens, args.gamma, SamplingParams(args.temperature, args.top_k, args.top_p),
                      args.gamma_schedule, args.verify)
    check_drafting_args(args)
    check_output_args(args)
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    return options

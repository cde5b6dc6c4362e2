"""python -m npspec.generate: speculative decoding from the command line.

    python -m npspec.generate                        # the shipped Shakespeare pair
    python -m npspec.generate "ROMEO:" --temperature 0 --max-new-tokens 64
    printf 'JULIET:' | python -m npspec.generate - --json   # stdin is used verbatim
    python -m npspec.generate --draft ngram --gamma-schedule heuristic "ROMEO:"   # prompt lookup

Text streams to stdout; a one-line summary goes to stderr (never to stdout, even when stderr is
closed). `--gamma 0` is plain autoregressive decoding with the target alone, and so is a target
other than the shipped one without --draft (with a note). Ctrl-C ends the line, prints the summary
of what was generated (stop: interrupted) and exits 130. On a terminal, accepted draft tokens are
coloured (green) apart from target-produced ones; `--no-color` or NO_COLOR turns it off.

The top of the house: argparse -> load (npspec.sources) -> a drafter (npspec.decode.drafters; a word of
COMMANDS, or a draft model) -> npspec.decode.prepare -> both roles' kernels (npspec.kernels.probe.choose_kernels) -> decode
-> print. Every option is checked once, before a model loads (npspec.decode.types.Options, the drafting and output
options here), and everything else (the pair, the prompt, the --html path) before the kernels are measured (which
may write the cache's choices.json) and before the first byte is written; this module maps errors to one-line
messages. --compare and --simulate-acceptance run in npspec.cli.harness.
The only environment variables read are here: NO_COLOR, NPSPEC_QUIET and TQDM_DISABLE
(npspec.sources.progress.show_progress), and NPSPEC_NUM_THREADS as the default of --threads.
"""

import argparse
import json
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from . import picture
from ..sources.atomic import expand, replace_problem, resolved
from ..sources.choices import MODES
from .console import Parser, error_stream, integer, notes_to, parse, terminate_as_interrupt
from .console import number as real  # (`number` here formats a ratio)
from ..decode import (RULES, SCHEDULES, SIBLINGS, Generation, GenerationInterrupted, Options, SamplingParams, Stats,
                     decode, prepare, tree_depth)
from ..decode.drafters import (COMMANDS, TREE_DRAFTERS, DraftModelCache, DynamicTreeDrafter, ModelDrafter, TreeDrafter,
                              check_p_min)
from ..sources.errors import CheckpointError, NoCodes
from .harness import compare_repeated, comparison, simulated, steered
from ..kernels.probe import choose_kernels
from ..kernels.workers import check_threads
from ..sources.progress import bar, show_progress, terminal_bars
from ..kernels.registry import STATIC_DEFAULT, names as kernel_names, role_candidates
from ..sources import HUB_NAMES, SHIPPED_PAIR, choice_store, load, shipped_dir
from ..decode.text import TextStreamer, encode_prompt
from .startup import exit_on_another_interrupt, started
from ..decode.rules.trees import MAX_TREE_NODES, branching_tree

log = logging.getLogger(__name__)

DEFAULT_PROMPT = "ROMEO:"
NUMBER_TYPES = {int: integer, float: real}  # how the command line reads a number (npspec.cli.console): ASCII only
GREEN, RESET = "\033[32m", "\033[0m"


PROG = "python -m npspec.generate"


class Interrupted(Exception):
    """Ctrl-C ended a run whose output and summary are already printed (main exits 130)."""


def build_parser(prog=PROG, out=None, err=None):
    """The argument parser; prog names the command in usage and help (`npspec generate` under the npspec command);
    help to `out`, usage errors to `err` (npspec.cli.console.Parser)."""
    ap = Parser(prog=prog, description=__doc__.split("\n")[0], out=out, err=err)
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
    ap.add_argument("--target-kernel", choices=kernel_names(cli=True, codes=False), default=None,
                    help="the target's product (default: the fastest of " + ", ".join(role_candidates("target"))
                         + " on this machine, as timed by --kernel-probe; compiled-panels needs the fast extra; "
                         "npspec.kernels.registry)")
    ap.add_argument("--draft-kernel", choices=kernel_names(cli=True), default=None,
                    help="the draft's product (default: the fastest of " + ", ".join(role_candidates("draft"))
                         + " on this machine, as timed by --kernel-probe; compiled-panels needs the fast extra; "
                         "dequant-panels keeps a quantized draft's int8 codes, npspec.kernels.quantized)")
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
    """How to draft: gamma and its schedule, the acceptance rule, confidence stopping, trees, and the options of each
    drafter without a model (npspec.decode.drafters.COMMANDS)."""
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
                         "rejection sampling (Jeon et al. 2024), which keeps at least as many per node (default token)")
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


def json_safe(x):
    """NaN (e.g. alpha when nothing was drafted) becomes null, so strict JSON parsers accept the output."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [json_safe(v) for v in x]
    return x


def number(x, spec):
    """`x` formatted with `spec`, or "-" for a ratio with nothing to count (NaN; JSON's null)."""
    return "-" if np.isnan(x) else format(x, spec)


def summary(stats):
    """The one-line summary printed to stderr."""
    return (f"{stats.new_tokens} new tokens in {stats.rounds} rounds, alpha {number(stats.alpha, '.3f')}, "
            f"{number(stats.tokens_per_round, '.2f')} tokens/round, {number(stats.tokens_per_s, '.1f')} tokens/s "
            f"(stop: {stats.stop_reason})")


def prompt_byte_limit(tokenizer, n_ctx):
    """A number of bytes past which a prompt cannot fit in `n_ctx` tokens: 4 * n_ctx * the longest token's length.

    A token stands for at most that many characters and a character is at most 4 UTF-8 bytes, so a longer
    text has more than n_ctx tokens; it is refused without being read or tokenized in full.
    """
    return 4 * n_ctx * max(map(len, tokenizer.get_vocab()))


def read_prompt(arg, limit, stdin=None):
    """The prompt text: the argument, or stdin verbatim for `-` (a trailing newline is kept).

    Raises ValueError for a prompt of more than `limit` bytes (prompt_byte_limit; stdin is read no further) or
    stdin that is not UTF-8.
    """
    if arg is None:
        return DEFAULT_PROMPT
    if arg == "-":
        stream = stdin if stdin is not None else getattr(sys.stdin, "buffer", None)
        if stream is None:
            raise ValueError("the prompt is - (read stdin), but stdin is closed; pipe the prompt in, or give it "
                             "as an argument")
        try:
            data = stream.read(limit + 1)
        except OSError as e:
            raise ValueError(f"cannot read the prompt from stdin ({e.strerror or e}); pipe the prompt in, or give "
                             "it as an argument") from None
        source = "the prompt on stdin"
    else:
        data, source = arg.encode("utf-8", "surrogateescape"), "the prompt"
    if len(data) > limit:
        raise ValueError(f"{source} is over {limit:,} bytes, more than the context can hold "
                         "(the prompt has more tokens than the context); shorten it")
    if arg != "-":
        return arg
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"the prompt on stdin is not valid UTF-8 ({e.reason} at byte {e.start}); "
                         "pass UTF-8 text") from None


def cpu_count():
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def thread_count(arg, environ=os.environ, cpus=None):
    """--threads, else NPSPEC_NUM_THREADS capped at `cpus` (default cpu_count()), else cpus.

    An explicit --threads is used as given, up to kernels.check_threads' bound (an error past it). A variable above
    the CPU count is capped, with a note. Raises ValueError naming the bad setting.
    """
    cpus = cpu_count() if cpus is None else cpus
    if arg is not None:
        if arg < 1:
            raise ValueError(f"--threads must be >= 1, got {arg}")
        try:
            return check_threads(arg, cpus)  # the one bound, per CPU
        except ValueError as e:
            raise ValueError(f"--threads: {e}") from None
    env = environ.get("NPSPEC_NUM_THREADS", "")
    if not env:
        return cpus
    try:
        n = integer(env)  # the options' own rule: ASCII only
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"NPSPEC_NUM_THREADS={env!r} is not a positive integer; set it to a thread count such "
                         "as 2, or unset it")
    if n > cpus:
        log.info(f"NPSPEC_NUM_THREADS={env.strip()} is more than the {cpus} CPUs this process may use; using {cpus}")
        return cpus
    return n


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
    """Whether the run drafts: --gamma >= 1 and a drafter, given by --draft or the shipped target's own draft.

    Without --draft, a target other than the shipped one decodes plainly (the shipped draft speaks another
    tokenizer; run() says so on stderr)."""
    return args.gamma > 0 and (args.draft is not None or is_shipped_target(args.target))


def drafting_options(args):
    """The options given that need a drafter, as the user spelled them."""
    given = [("--draft-p-min", bool(args.draft_p_min)), ("--tree", bool(args.tree)),
             ("--tree-kind", args.tree_kind != "sampled"), ("--tree-budget", args.tree_budget is not None),
             ("--draft-kernel", args.draft_kernel is not None),
             ("--gamma-schedule heuristic", args.gamma_schedule != "constant"),
             ("--compare", args.compare), ("--simulate-acceptance", args.simulate_acceptance is not None)]
    return [name for name, on in given if on]


def check_output_args(args):
    """Raise ValueError for output options that would do nothing or cannot apply: --trace without --json (--html needs
    no --trace), --compare-repeats without --compare or below 1, and an --html FILE that cannot be written (checked
    before anything is printed)."""
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
    """Raise ValueError for drafting options that cannot apply together, do nothing, or pass their bounds (the tree's
    node count, npspec.decode.rules.trees.MAX_TREE_NODES; a model-free drafter's own, its Command.check), before anything loads."""
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
    """Raise ValueError for --tree, --tree-budget, --tree-kind and --simulate-acceptance used where they cannot apply."""
    if args.tree and args.tree_budget is not None:
        raise ValueError("--tree and --tree-budget are two kinds of tree; give one of them")
    if (args.tree or args.tree_budget is not None) and (command is not None or args.draft_p_min):
        raise ValueError(f"--tree drafts with a draft model; it cannot be combined with {words} or --draft-p-min")
    if args.tree_budget is not None and not 1 <= args.tree_budget <= MAX_TREE_NODES:
        raise ValueError(f"--tree-budget must be >= 1 and at most {MAX_TREE_NODES} (the tree's nodes; the largest "
                         f"tree npspec drafts), got {args.tree_budget}")
    if args.tree:
        branching_tree(args.tree)  # the node count's bound, checked before any model loads
    if args.tree_kind != "sampled" and not args.tree:
        raise ValueError("--tree-kind applies to --tree only; add --tree K1,K2,... or drop it")
    siblings = RULES[args.verify].siblings
    if siblings != "iid" and not (args.tree and args.tree_kind == "sampled"):
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


def load_draft(args, threads, progress=None):
    """The draft model --draft names (the shipped draft for the shipped target without --draft), or None when the run
    drafts without one (not drafting(args), or a word of npspec.decode.drafters.COMMANDS such as `ngram`). It decodes
    with --draft-kernel, else registry.STATIC_DEFAULT until `probed` gives it the draft's (after every check)."""
    if not drafting(args) or args.draft in COMMANDS:
        return None
    try:  # load refuses a kernel reading int8 codes for float weights; said here with the CLI's options
        return load(args.draft, "draft", kernel=args.draft_kernel or STATIC_DEFAULT, threads=threads,
                    progress=progress, target=args.target)
    except NoCodes as e:
        raise NoCodes(e.kernel, "draft", e.source, f"--draft-kernel {e.kernel}", "--draft int8-g64:SPEC") from None


def make_drafter(args, target, draft):
    """The drafter --draft names (None when not drafting(args)): a registered word's (npspec.decode.drafters.COMMANDS,
    e.g. `ngram`), else ModelDrafter(draft), TreeDrafter with --tree, DynamicTreeDrafter with --tree-budget; `draft`
    is load_draft's model."""
    if not drafting(args):
        return None
    if args.draft in COMMANDS:
        return COMMANDS[args.draft].build(target, **command_values(COMMANDS[args.draft], args))
    if args.tree and args.tree_kind == "top-k":
        return TreeDrafter(draft, args.tree, "top-k")
    if args.tree:  # sampled children, drawn as the rule needs (npspec.decode.drafters.TREE_DRAFTERS)
        return TREE_DRAFTERS[RULES[args.verify].siblings](draft, args.tree)
    if args.tree_budget is not None:
        return DynamicTreeDrafter(draft, args.tree_budget)
    return ModelDrafter(draft, p_min=args.draft_p_min)


def probed(job, args, draft, threads):  # -> Job
    """The checked job decoding with each role's default kernel, threads and prefill length, chosen in one call
    (npspec.kernels.probe.choose_kernels, kept in the cache's choices.json as --kernel-probe says) once every check
    has passed; --target-kernel / --draft-kernel stay as given. A draft model the job does not use (gamma clamped to
    0) is not measured. draft: load_draft's model."""
    draft = draft if job.drafter is not None else None  # the draft model the job decodes beside (None: none)
    roles = [role for role, given in (("target", args.target_kernel), ("draft", args.draft_kernel)) if given is None]
    chosen = choose_kernels(job.target, draft, threads, choice_store(), args.kernel_probe, rows=(verify_rows(job),),
                            roles=roles)
    drafter = job.drafter
    if draft is not None and chosen.draft.model is not draft:  # a re-chosen draft model: its drafter anew
        drafter = make_drafter(args, chosen.target.model, chosen.draft.model)
    return replace(job, target=chosen.target.model, drafter=drafter)


def verify_rows(job):  # Job -> int
    """The rows of the target's forward in one of the job's rounds, as first scheduled: a chain of gamma drafts is
    verified with the last token as gamma + 1 rows, a tree with every node (drafter.tree_size at the first round's
    depth, decode.tree_depth) and the root; 1 with no drafter (plain decoding). What the kernel probe times the target
    at (npspec.kernels.probe)."""
    if job.drafter is None:
        return 1
    return job.drafter.tree_size(tree_depth(job.drafter, job.options.gamma, job.n_ctx, len(job.prompt))) + 1


def kernels_used(target, drafter):
    """{"target_kernel", "target_threads", "target_prefill_rows", and the same for "draft_"}: the products the two
    models decode with, the threads of their forwards, and the longest prompt each prefills with its kernel
    (Model.prefill_rows; draft None for all three: no draft model). Called before --simulate-acceptance wraps the
    draft model."""
    draft = draft_model(drafter)
    return {"target_kernel": target.kernel, "target_threads": target.threads, "target_prefill_rows": target.prefill_rows,
            **{f"draft_{k}": None if draft is None else getattr(draft, k) for k in ("kernel", "threads", "prefill_rows")}}


def draft_model(drafter, default=None):
    """The draft model a drafter decodes with (a DraftModelCache's), else `default` (an n-gram drafter, or none)."""
    return drafter.model if isinstance(drafter, DraftModelCache) else default


def rerun(job, args, reference=None):  # -> Job
    """A Job that decodes as `job` (probed's, before --simulate-acceptance steers it) first does: a new drafter of
    the same draft model (make_drafter: an empty cache) and a new random stream seeded with --seed, steered again
    copying `reference` (npspec.cli.harness.simulated's ids) with --simulate-acceptance. --compare-repeats decodes one per
    repeat (npspec.cli.harness.compare_repeated); its ids are the first run's."""
    drafter = None if job.drafter is None else make_drafter(args, job.target, draft_model(job.drafter))
    fresh = replace(job, drafter=drafter, rng=np.random.default_rng(args.seed))
    return fresh if reference is None else steered(fresh, reference, args.simulate_acceptance, args.seed)


def run(args, out=sys.stdout, err=sys.stderr, stdin=None):
    """Generate as `args` (build_parser's) say: the text to `out`, the summary and notes to `err`. Returns the
    Generation. Raises ValueError or CheckpointError, before anything is written to `out`, for anything that can
    be checked up front; Interrupted after printing what was generated when Ctrl-C stops the generation."""
    job, again, prompt, kernels, progress, threads = prepared(args, err, stdin)
    target = job.target
    color = out.isatty() and not args.no_color and not os.environ.get("NO_COLOR") and not args.json
    streamer = TextStreamer(target.tokenizer)
    gen, interrupted = generated(job, args, out, prompt, streamer, color, progress)
    if not args.json:  # the line ends before any bar of --compare can draw under it
        out.write(streamer.finish() + "\n")
        out.flush()
    if args.html is not None:
        try:
            picture.write(expand(args.html, "--html"), gen.trace, target.tokenizer.decode, prompt, gen.stats.as_dict())
        except OSError as e:
            raise ValueError(f"cannot write --html {args.html} ({e.strerror or e}); pick a writable path") from e
        print(f"npspec.generate: wrote {args.html} (each round of the generation)", file=err)
    specs, plain = [gen], {}
    if args.compare and not interrupted:  # the same prompt, options and seed, with the target alone
        specs, plain, finished = compare_repeated(job, gen, again, args.seed, threads, args.compare_repeats, progress)
        interrupted = not finished  # Ctrl-C in a turn: the finished turns are still compared
    report(args, out, err, gen, specs, plain, target, kernels)
    if interrupted:
        raise Interrupted()
    return gen


def prepared(args, err, stdin):
    """Every check, then the models, the drafter, the prompt, then the kernels: returns (the checked npspec.decode
    Job, a function returning a Job that decodes as it does (rerun, for --compare-repeats), the prompt text, the
    kernels the two models decode with (kernels_used), the bar factory or None, the threads asked for: thread_count).

    The options are checked (npspec.decode.types.Options, the drafting and output options) before any model loads,
    the pair and the prompt by npspec.decode.prepare once they are known, each once; only then are the default
    kernels chosen (probed), so that a refused command leaves nothing in the cache.
    """
    options = Options(args.max_new_tokens, args.gamma, SamplingParams(args.temperature, args.top_k, args.top_p),
                      args.gamma_schedule, args.verify)
    check_drafting_args(args)
    check_output_args(args)
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    threads = thread_count(args.threads)
    progress = terminal_bars if show_progress(args.quiet, err, os.environ) else None
    target = load(args.target, "target", kernel=args.target_kernel or STATIC_DEFAULT, threads=threads,
                  progress=progress)  # the role's kernel is chosen once every check has passed (probed)
    draft = load_draft(args, threads, progress)
    prompt = read_prompt(args.prompt, prompt_byte_limit(target.tokenizer, target.config.n_ctx), stdin)
    ids = encode_prompt(target.tokenizer, prompt, target.config.eos_token_id)
    rng = np.random.default_rng(args.seed)  # (its first use imports numpy.random: not between prompt and decoding)
    job = probed(prepare(target, make_drafter(args, target, draft), ids, options, rng), args, draft, threads)
    kernels = kernels_used(job.target, job.drafter)
    if args.gamma > 0 and not drafting(args):  # said once everything is checked and chosen, as decoding starts
        print(f"npspec.generate: note: no --draft for the target {args.target}, so it decodes plainly (the shipped "
              "draft is the shipped target's); add --draft SPEC or " + " or ".join(f"--draft {word}" for word in COMMANDS)
              + " to decode speculatively", file=err)
    probed_job, reference = job, None
    if args.simulate_acceptance is not None:
        job, reference = simulated(job, args.simulate_acceptance, args.seed, progress)
    return job, lambda: rerun(probed_job, args, reference), prompt, kernels, progress, threads


def generated(job, args, out, prompt, streamer, color, progress):
    """Decode the job streaming its text to `out` after the prompt (accepted drafts coloured when `color`; with --json,
    a bar of the tokens on stderr instead); returns (the Generation, whether Ctrl-C stopped it).

    The prompt is echoed with the first round's text, the first byte written: by then everything that can be checked
    was, the logits of the first forwards included (a model whose weights overflow to inf fails there, with nothing
    on stdout); alone if Ctrl-C stops the decoding before a round ends."""
    pending = "" if args.json else prompt  # the prompt, until the first round's text follows it

    def on_emit(new_ids, n_accepted):
        nonlocal pending
        if args.json:  # nothing streams: a bar on stderr shows the tokens instead
            tokens.update(len(new_ids))
            return
        out.write(pending)
        pending = ""
        if color:
            drafted = streamer.push(new_ids[:n_accepted])
            out.write(GREEN + drafted + RESET if drafted else "")
            out.write(streamer.push(new_ids[n_accepted:]))
        else:
            out.write(streamer.push(new_ids))
        out.flush()

    try:
        with bar(progress if args.json else None, "generating", args.max_new_tokens, "tok") as tokens:
            gen, interrupted = decode(job, on_emit, trace=args.trace or args.html is not None), False
    except GenerationInterrupted as e:  # Ctrl-C: print what was generated, then exit 130
        gen, interrupted = e.generation, True
    except KeyboardInterrupt:  # before the first forward: nothing generated
        gen, interrupted = Generation([], Stats(stop_reason="interrupted")), True
    out.write(pending)  # no round ended (Ctrl-C): the prompt alone
    return gen, interrupted


def report(args, out, err, gen, specs, plain, target, kernels):
    """The --json object (its stats naming the kernels: kernels_used) to `out`, the summary and the --compare line to
    `err` (the streamed text's end is written before --html and --compare run). gen: the Generation streamed; specs,
    plain: compare_repeated's speculative and plain runs of the finished turns (plain {}: no comparison); fewer
    turns than --compare-repeats asked (Ctrl-C) are said on `err` and in the object's `repeats` and `repeats_asked`."""
    greedy = args.temperature == 0
    if args.json:
        obj = {"text": target.tokenizer.decode(gen.ids), "ids": gen.ids, "stats": {**gen.stats.as_dict(), **kernels}}
        if args.trace:
            obj["trace"] = gen.trace
        if plain:
            obj["compare"] = {**comparison(specs, plain, greedy), "repeats_asked": args.compare_repeats}
        out.write(json.dumps(json_safe(obj), allow_nan=False) + "\n")
        out.flush()
    print(summary(gen.stats), file=err)
    if plain:
        c = comparison(specs, plain, greedy)
        spread = (f" (median of {c['repeats']} in turn, {min(c['speedups']):.2f}x to {max(c['speedups']):.2f}x)"
                  if c["repeats"] > 1 else "")
        print(f"compare: speculative {c['speculative_tokens_per_s']:.1f} tokens/s, plain "
              f"{c['plain_tokens_per_s']:.1f} tokens/s (fastest plain decoding: {c['plain_kernel']}), speedup "
              f"{c['speedup']:.2f}x{spread}" + ("" if c["same_ids"] is None else ", same output" if c["same_ids"]
                                                 else ", DIFFERENT output"), file=err)
        if c["repeats"] < args.compare_repeats:
            print(f"compare: Ctrl-C stopped turn {c['repeats'] + 1} of {args.compare_repeats}; the line above "
                  f"compares the {c['repeats']} finished", file=err)
    elif args.compare:
        print("compare: interrupted before its decodings finished, so nothing is compared", file=err)


def main(argv=None, prog=PROG, out=None, err=None):
    """Run the command (argv: the arguments; default sys.argv[1:]). Returns the exit status: 0, 1 an error, 2 a
    command line argparse rejects, 130 interrupted, 141 stdout's reader left. prog: the name usage shows.
    out, err: the streams (default sys.stdout and sys.stderr, read when called; with stderr closed, messages
    are dropped, never printed to stdout: npspec.cli.console)."""
    started()  # Python's Ctrl-C handler back (npspec.cli.console: the imports had their own)
    out = sys.stdout if out is None else out
    err = error_stream(sys.stderr if err is None else err)
    try:
        args, status = parse(build_parser(prog, out, err), argv, err, "npspec.generate")
    except KeyboardInterrupt:
        print("npspec.generate: interrupted", file=err)
        return 130
    if args is None:
        return status
    if out is None:
        print("npspec.generate: error: stdout is closed; redirect it to a file or a pipe", file=err)
        return 1
    try:
        # SIGTERM stops as Ctrl-C does (a cache build deletes its staging); notes go to err
        with terminate_as_interrupt(), notes_to(err, "npspec.generate"):
            run(args, out=out, err=err)
    except (CheckpointError, ValueError) as e:
        if args.debug:
            raise
        print(f"npspec.generate: error: {e}", file=err)
        return 1
    except Interrupted:  # the output and the summary (stop: interrupted) are printed
        exit_on_another_interrupt()  # a second Ctrl-C while the models are freed: 130 at once
        return 130
    except KeyboardInterrupt:  # before generation started, or while printing its end
        exit_on_another_interrupt()
        print("npspec.generate: interrupted", file=err)
        return 130
    except BrokenPipeError:  # e.g. `| head`: the reader left; stop quietly, as Unix tools do
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        except (OSError, AttributeError, ValueError):  # a stream with no descriptor
            pass
        return 141
    except OSError as e:  # a file the OS refused (it names it), else stdout closed or full
        if args.debug:
            raise
        print(f"npspec.generate: error: cannot use {e.filename} ({e.strerror or e}); check the path" if e.filename
              else f"npspec.generate: error: cannot write the output ({e.strerror or e}); check where stdout goes",
              file=err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

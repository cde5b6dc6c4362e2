"""python -m npspec.generate: speculative decoding from the command line.

    printf 'JULIET:' | python -m npspec.generate - --json   # stdin is used verbatim

run: options checked (options) -> the pair, the drafter (drafts) and the prompt (inputs), checked by
npspec.decode.prepare -> each role's kernel (kernel_choice) -> decode, text streamed to stdout -> report (on
stderr). Nothing is written nor measured before every check passed; Ctrl-C prints what was generated, exit 130.
Reads NO_COLOR, NPSPEC_QUIET, TQDM_DISABLE and NPSPEC_NUM_THREADS. Imports npspec.decode, npspec.sources,
npspec.kernels.registry and the other cli modules.
"""

import os
import sys
from dataclasses import dataclass, replace

import numpy as np

from . import picture
from ..decode import Generation, GenerationInterrupted, Stats, decode, prepare
from ..decode.drafters import COMMANDS
from ..decode.text import TextStreamer, encode_prompt
from ..sources.atomic import expand
from ..sources.errors import CheckpointError
from ..sources.progress import bar, show_progress, terminal_bars
from .console import notes_to, parsed, streams, terminate_as_interrupt
from .drafts import draft_model, load_draft, load_role, make_drafter
from .harness import compare_repeated, simulated, steered
from .inputs import prompt_byte_limit, read_prompt, thread_count
from .kernel_choice import kernels_used, probed
from .options import PROG, build_parser, checked, drafting
from .report import Outcome, report
from .startup import exit_on_a_late_interrupt, exit_on_another_interrupt, started

GREEN, RESET = "\033[32m", "\033[0m"


class Interrupted(Exception):
    """Ctrl-C ended a run whose output and summary are already printed (main exits 130)."""


@dataclass(frozen=True)
class Prepared:
    """A run ready to decode (prepared's)."""
    job: object  # the checked npspec.decode Job, each role with its kernel (probed), steered by --simulate-acceptance
    again: object  # () -> a Job decoding as job first did (rerun), for --compare-repeats
    prompt: str  # the prompt's text
    kernels: dict  # kernels_used's: each role's kernel, threads and prefill rows
    progress: object  # the bar factory, or None
    threads: int  # the threads asked for (thread_count)


def rerun(job, args, reference=None):  # -> Job
    """A Job decoding as `job` (probed's, before --simulate-acceptance steers it) first did: a new drafter of the same
    draft model, a new rng seeded with --seed, steered again copying `reference` with --simulate-acceptance."""
    drafter = None if job.drafter is None else make_drafter(args, job.target, draft_model(job.drafter))
    fresh = replace(job, drafter=drafter, rng=np.random.default_rng(args.seed))
    return fresh if reference is None else steered(fresh, reference, args.simulate_acceptance, args.seed)


def run(args, out=sys.stdout, err=sys.stderr, stdin=None):
    """Generate as `args` (build_parser's) say: the text to `out`, the summary and notes to `err`; returns the
    Generation. Raises ValueError or CheckpointError before anything is written to `out`; Interrupted after printing
    what was generated when Ctrl-C stops it."""
    prep = prepared(args, err, stdin)
    target = prep.job.target
    color = out.isatty() and not args.no_color and not os.environ.get("NO_COLOR") and not args.json
    streamer = TextStreamer(target.tokenizer)
    gen, interrupted = generated(prep, args, out, streamer, color)
    if not args.json:  # the line ends before any bar of --compare can draw under it
        out.write(streamer.finish() + "\n")
        out.flush()
    if args.html is not None:
        try:
            picture.write(expand(args.html, "--html"), gen.trace, target.tokenizer.decode, prep.prompt,
                          gen.stats.as_dict())
        except OSError as e:
            raise ValueError(f"cannot write --html {args.html} ({e.strerror or e}); pick a writable path") from e
        print(f"npspec.generate: wrote {args.html} (each round of the generation)", file=err)
    specs, plain = [gen], {}
    if args.compare and not interrupted:  # the same prompt, options and seed, with the target alone
        specs, plain, finished = compare_repeated(prep.job, gen, prep.again, args.seed, prep.threads,
                                                  args.compare_repeats, prep.progress)
        interrupted = not finished  # Ctrl-C in a turn: the finished turns are still compared
    report(args, Outcome(gen, specs, plain, prep.kernels, target.tokenizer.decode), out, err)
    if interrupted:
        raise Interrupted()
    return gen


def prepared(args, err, stdin):  # -> Prepared
    """A Prepared: the options checked (options.checked) before any model loads, the pair and the prompt by
    npspec.decode.prepare, and only then each role's kernel chosen (probed), so that a refused command leaves nothing
    in the cache. Raises ValueError or CheckpointError."""
    options = checked(args)
    threads = thread_count(args.threads)
    progress = terminal_bars if show_progress(args.quiet, err, os.environ) else None
    target = load_role(args.target, "target", args.target_kernel, threads, progress)  # its kernel probed later
    draft = load_draft(args, threads, progress, target if target.codes is None else None)
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
    return Prepared(job, lambda: rerun(probed_job, args, reference), prompt, kernels, progress, threads)


def generated(prep, args, out, streamer, color):  # -> (Generation, bool)
    """Decode prep.job streaming its text to `out` (accepted drafts coloured when `color`; with --json, a bar on
    stderr instead). The prompt, the first byte written, goes with the first round's text (its logits checked by
    then), or alone after Ctrl-C. Returns (the Generation, whether Ctrl-C stopped it)."""
    pending = "" if args.json else prep.prompt  # the prompt, until the first round's text follows it

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
        with bar(prep.progress if args.json else None, "generating", args.max_new_tokens, "tok") as tokens:
            gen, interrupted = decode(prep.job, on_emit, trace=args.trace or args.html is not None), False
    except GenerationInterrupted as e:  # Ctrl-C: print what was generated, then exit 130
        gen, interrupted = e.generation, True
    except KeyboardInterrupt:  # before the first forward: nothing generated
        gen, interrupted = Generation([], Stats(stop_reason="interrupted")), True
    out.write(pending)  # no round ended (Ctrl-C): the prompt alone
    return gen, interrupted


def main(argv=None, prog=PROG, out=None, err=None):
    """Run the command (argv default sys.argv[1:]; prog: the name usage shows; out, err: console.streams). Returns
    the exit status: 0, 1 an error, 2 usage, 130 interrupted, 141 stdout's reader left."""
    started()  # Python's Ctrl-C handler back (npspec.cli.startup: the imports had their own)
    out, err = streams(out, err)
    args, status = parsed(lambda: build_parser(prog, out, err), argv, err, "npspec.generate")
    if args is None:
        return status
    if out is None:
        print("npspec.generate: error: stdout is closed; redirect it to a file or a pipe", file=err)
        return 1
    try:
        # SIGTERM stops as Ctrl-C does (a cache build deletes its staging); notes go to err
        with terminate_as_interrupt(), notes_to(err, "npspec.generate"):
            run(args, out=out, err=err)
        exit_on_a_late_interrupt()  # the run is printed: a Ctrl-C while the models are freed exits 130 at once
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

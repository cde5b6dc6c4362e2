"""What generate reads besides its options: the prompt (the argument, or stdin for `-`) and the thread count
(--threads, NPSPEC_NUM_THREADS, the CPUs). Imports npspec.kernels.workers and options' DEFAULT_PROMPT;
notes go to its logger.
"""

import logging
import os
import sys

from ..kernels.workers import check_threads
from .console import integer
from .options import DEFAULT_PROMPT

log = logging.getLogger(__name__)


def prompt_byte_limit(tokenizer, n_ctx):
    """Bytes past which a prompt cannot fit in `n_ctx` tokens: 4 * n_ctx * the longest token's length (a token
    stands for at most that many characters, a character is at most 4 UTF-8 bytes)."""
    return 4 * n_ctx * max(map(len, tokenizer.get_vocab()))


def read_prompt(arg, limit, stdin=None):
    """The prompt: `arg`, DEFAULT_PROMPT for None, or stdin verbatim for `-`. Raises ValueError past `limit`
    bytes (stdin is read no further), for a closed or unreadable stdin, or stdin that is not UTF-8."""
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
    """--threads `arg` (up to kernels.workers.check_threads' bound), else NPSPEC_NUM_THREADS capped at `cpus`
    (a note says so), else cpus (default cpu_count()). Raises ValueError naming the bad setting."""
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

"""What every benchmark shares: the command line (command_line -> Run, then finish), output folders,
machine description, thread control, timing, tables, plots.

Units: seconds, bytes, tokens/s, GB/s (1e9 bytes/s), GFLOP/s (1e9 float32 operations/s).
"""

import argparse
import contextlib
import csv
import datetime
import io
import logging
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from npspec.kernels import compiled
from npspec.sources.atomic import atomic_write
from npspec.sources.choices import cpu_model
from tqdm import tqdm

from npspec.sources.progress import bar, show_progress, terminal_bars
from npspec.cli.console import handled

RESULTS = Path(__file__).resolve().parent / "results"  # the committed runs, one folder each
LATEST = RESULTS / "latest"  # where a full run writes without --out; rename it for what it measured and where


@dataclass
class Run:
    """One run of a benchmark command: its parsed `args`, output folder `out`, the thread counts to
    measure (`threads`: each one both the BLAS pools' and the panel kernels') and `meta`, the
    header every table of the run carries (machine_info() plus the command line; a command adds
    what it measures once, e.g. the read bandwidth)."""

    args: argparse.Namespace
    out: Path
    threads: list
    meta: dict


def command_line(prog, doc, argv=None, options=None, threads=("1,2", "1"), many=True):
    """Parse a benchmark command's arguments and set up its run: returns a Run.

    Every command takes --quick, --out and --threads. prog: the module ("bench.sweep"); doc: its
    docstring (the first line is the --help description); argv: the arguments (default
    sys.argv[1:]); options: a function adding the command's own options to the parser.
    threads: the default --threads of a full and of a --quick run; many=False: the command
    measures one thread count. Exits with a usage error for bad options, and before creating
    anything if a --quick run is pointed into bench/results/ (output_dir).
    """
    ap = argparse.ArgumentParser(prog=f"python -m {prog}", description=doc.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="a small run (under 3 minutes) written to a new temporary folder, never to bench/results/")
    ap.add_argument("--out", default=None,
                    help="output folder (default: bench/results/latest/, or a temporary one with --quick)")
    ap.add_argument("--threads", type=thread_counts, default=None,
                    help=f"comma-separated thread counts to measure{'' if many else ' (one)'}, each for BLAS and the "
                         f"panel kernels (default: {threads[0]}; --quick: {threads[1]})")
    if options is not None:
        options(ap)
    args = ap.parse_args(argv)
    counts = args.threads or thread_counts(threads[args.quick])
    if not many and len(counts) != 1:
        ap.error(f"--threads takes one thread count here, got {len(counts)}")
    out = output_dir(args)
    meta = machine_info()
    meta["command"] = f"python -m {prog} " + " ".join(sys.argv[1:] if argv is None else argv)
    return Run(args, out, counts, meta)


def thread_counts(text):
    """Thread counts from "1,2": a list of positive ints. Raises argparse.ArgumentTypeError otherwise."""
    try:
        counts = [int(t) for t in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"takes positive integers like 1,2; got {text!r}")
    return counts


def output_dir(args):
    """Where results go: --out, else bench/results/latest/ (full run) or a fresh temporary folder (--quick).

    Raises SystemExit if a --quick run is pointed at bench/results/: quick figures must never
    replace the committed ones.
    """
    if args.out is None:
        out = Path(tempfile.mkdtemp(prefix="npspec-bench-")) if args.quick else LATEST
    else:
        out = Path(args.out).expanduser().resolve()
    if args.quick and (out == RESULTS or RESULTS in out.parents):
        raise SystemExit(f"--quick never writes into {RESULTS} (the committed results); pick another --out")
    out.mkdir(parents=True, exist_ok=True)
    return out


def progress_bars():
    """The bar factory for a benchmark's rows and sweeps (npspec.sources.progress): bars on stderr when it is a terminal, None
    (no bars) when it is piped or redirected, or with NPSPEC_QUIET / TQDM_DISABLE set."""
    return terminal_bars if show_progress(False, sys.stderr, os.environ) else None


def steps(items, desc, unit="row"):
    """Iterate over `items` (made a list, for the total) with a progress bar (progress_bars()) advanced by each one:
    a benchmark's rows and sweeps. The bar disappears when done, and is never shown when stderr is not a terminal."""
    items = list(items)
    with bar(progress_bars(), desc, len(items), unit) as b:
        for item in items:
            yield item
            b.update(1)


class NoteHandler(logging.Handler):
    """npspec's one-line notes (a conversion, a wait, the kernel probe), as the commands print them, through log."""

    def emit(self, record):
        log(f"npspec: {record.getMessage()}")


def notes():
    """While the block runs, the "npspec" loggers' notes are printed (NoteHandler); as before they were after."""
    return handled(NoteHandler())


def log(message):
    """Progress for the person running a benchmark: one line on stderr (stdout ends with what was written), printed
    above any progress bar (tqdm.write) rather than through it."""
    tqdm.write(message, file=sys.stderr)
    sys.stderr.flush()


class Table(NamedTuple):
    """One result table of a run: written as `name.csv` and `name.md` by `finish`."""

    name: str
    rows: list  # dicts; the columns are their keys' union, in first-seen order
    title: str
    notes: str = ""


def finish(run, tables, files=()):
    """The end of every command: write each Table under run.out with run.meta (write_table), print one
    line "wrote <the .md files and `files`>" (the last line of stdout), and return 0, main's exit status."""
    written = [write_table(run.out, t.name, t.rows, run.meta, t.title, t.notes)[1] for t in tables]
    print("wrote " + ", ".join(str(p) for p in [*written, *files] if p))
    return 0


@contextlib.contextmanager
def blas_threads(n):
    """Run the body with BLAS and OpenMP pools limited to n threads (threadpoolctl), restored afterwards.

    npspec's own panel-kernel threads are not global: each command passes n to the models it
    builds (`Model(..., threads=n)`, `model.with_kernel(kernel, n)`).
    """
    with threadpool_limits(limits=n):
        yield


def blas_info():
    """The BLAS numpy uses: `{"blas": vendor, "blas_version", "blas_threads", "blas_arch"}` (threadpoolctl)."""
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not blas:
        return {"blas": "unknown", "blas_version": "", "blas_threads": "", "blas_arch": ""}
    b = blas[0]
    return {"blas": b.get("internal_api", ""), "blas_version": b.get("version", ""),
            "blas_threads": b.get("num_threads", ""), "blas_arch": b.get("architecture", "")}


def memory_bytes():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def load_average():
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def machine_info():
    """A description of the machine and software a result was measured on (a flat dict of strings)."""
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{cpu_model()}, {os.cpu_count()} cores, {memory_bytes() / 2**30:.0f} GiB RAM",
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "load_average_1min_at_start": f"{load_average():.2f}",
    }
    info.update({k: str(v) for k, v in blas_info().items()})
    info["compiled_panel"] = str(compiled.host_panel()) if compiled.available() else "no numba"  # its loop nest
    return info


def time_call(f, repeats, warmup=1):
    """Call f() `warmup` times untimed, then `repeats` times; return the sorted list of durations (seconds)."""
    for _ in range(warmup):
        f()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return sorted(times)


def in_turn(calls, repeats, pause=0.0):
    """{name: f} -> {name: [what f() returned in each timed round]}: a warm-up round, then `repeats` rounds, each
    calling every f once, in turn, `pause` seconds after the call before it (so that BLAS threads a threaded call
    left spinning fall asleep), so that a machine whose speed drifts moves every f alike."""
    results = {name: [] for name in calls}
    for i in range(repeats + 1):
        for name, f in calls.items():
            time.sleep(pause)
            out = f()
            if i:
                results[name].append(out)
    return results


def median(xs):
    return float(np.median(xs))


def read_bandwidth(nbytes=1 << 30, repeats=5):
    """Read bandwidth in bytes/s: the fastest of two read-only kernels over an `nbytes` float32 array.

    Kernels: BLAS sdot of the array with itself (`np.dot(a, a)`, one pass over memory, uses the
    BLAS threads) and `np.add.reduce` split over as many Python threads as BLAS threads (numpy
    releases the GIL in reductions). Each is timed `repeats` times; the best time counts. The
    array must be much larger than the last-level cache (default 1 GiB).
    """
    a = np.ones(nbytes // 4, dtype=np.float32)
    n_threads = int(blas_info()["blas_threads"] or 1)
    best = min(time_call(lambda: np.dot(a, a), repeats))
    chunks = np.array_split(a, n_threads)
    with ThreadPoolExecutor(n_threads) as pool:
        best = min(best, min(time_call(lambda: list(pool.map(np.add.reduce, chunks)), repeats)))
    return a.nbytes / best


def best_read_rate(probe, nbytes, seconds):
    """The read rate of the roofline, bytes/s: the best measured in the run, i.e. the probe's `probe` (bytes/s) or
    the fastest one-token forward's own `nbytes / seconds` if that read faster (a model that fits in cache; a GEMV
    over large matrices, which streams faster than the probe's two-thread sum on some machines), so that no
    kernel sits above 1.0 of the roofline (issue 11; bench.verify_cost, bench.speedup)."""
    return max(probe, nbytes / seconds)


def gemm_peak(n=2048, repeats=5):
    """float32 GEMM throughput in FLOP/s: the best of `repeats` products of two `[n, n]` matrices."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    return 2 * n**3 / min(time_call(lambda: a @ b, repeats))


def fmt(v):
    if isinstance(v, float):
        if not np.isfinite(v):
            return ""
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.1f}"
    return str(v)


def write_table(out_dir, name, rows, meta, title, notes=""):
    """Write `name.csv` (all columns, full precision) and `name.md` (a titled table with the machine).

    rows: list of dicts with the same keys. meta: `machine_info()` plus any measured constants.
    Both files are written atomically. Returns the two paths.
    """
    out_dir = Path(out_dir)
    columns = list(dict.fromkeys(k for r in rows for k in r))  # the union, in first-seen order
    rows = [{c: r.get(c, "") for c in columns} for r in rows]
    buf = io.StringIO()
    for k, v in meta.items():
        buf.write(f"# {k}: {v}\n")
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    csv_path, md_path = out_dir / f"{name}.csv", out_dir / f"{name}.md"
    atomic_write(csv_path, lambda tmp: Path(tmp).write_text(buf.getvalue(), encoding="utf-8"))
    md = [f"# {title}", ""]
    md += [f"- {k}: {v}" for k, v in meta.items()]
    md += ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    md += ["| " + " | ".join(fmt(r[c]) for c in columns) + " |" for r in rows]
    if notes:
        md += ["", notes.strip()]
    atomic_write(md_path, lambda tmp: Path(tmp).write_text("\n".join(md) + "\n", encoding="utf-8"))
    return csv_path, md_path


def read_table(path):
    """Rows of a CSV written by write_table, and its `# key: value` header, as (rows, meta)."""
    meta, lines = {}, []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("# ") and ": " in line and not lines:
            k, v = line[2:].split(": ", 1)
            meta[k] = v
        else:
            lines.append(line)
    return list(csv.DictReader(lines)), meta


def pyplot():
    """matplotlib.pyplot with a file-only backend, or None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path):
    """Save a matplotlib figure as PNG atomically, close it, and return `path`."""
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight"))
    pyplot().close(fig)
    return path

"""What every benchmark shares: arguments, output folders, machine description, timing, tables, plots.

Units: seconds, bytes, tokens/s, GB/s (1e9 bytes/s), GFLOP/s (1e9 float32 operations/s).
"""

import argparse
import contextlib
import csv
import datetime
import io
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from npspec.checkpoint import atomic_write

RESULTS = Path(__file__).resolve().parent / "results"


def parser(prog, description):
    """An argparse parser with the options every benchmark takes: --quick, --out, --threads."""
    ap = argparse.ArgumentParser(prog=f"python -m {prog}", description=description)
    ap.add_argument("--quick", action="store_true",
                    help="a small run (under 3 minutes) written to a new temporary folder, never to bench/results/")
    ap.add_argument("--out", default=None, help="output folder (default: bench/results/, or a temporary one with --quick)")
    ap.add_argument("--threads", default=None,
                    help="comma-separated BLAS thread counts to measure (default: 1,2; --quick: 1)")
    return ap


def output_dir(args):
    """Where results go: --out, else bench/results/ (full run) or a fresh temporary folder (--quick).

    Raises SystemExit if a --quick run is pointed at bench/results/: quick figures must never
    replace the committed ones.
    """
    if args.out is None:
        out = Path(tempfile.mkdtemp(prefix="npspec-bench-")) if args.quick else RESULTS
    else:
        out = Path(args.out).expanduser().resolve()
    if args.quick and (out == RESULTS or RESULTS in out.parents):
        raise SystemExit(f"--quick never writes into {RESULTS} (the committed results); pick another --out")
    out.mkdir(parents=True, exist_ok=True)
    return out


def thread_counts(args):
    """The BLAS thread counts to measure, from --threads (default 1,2; --quick: 1)."""
    if args.threads is None:
        return [1] if args.quick else [1, 2]
    counts = [int(t) for t in args.threads.split(",")]
    if not counts or min(counts) < 1:
        raise SystemExit(f"--threads takes positive integers like 1,2; got {args.threads!r}")
    return counts


@contextlib.contextmanager
def blas_threads(n):
    """Run the body with n threads: BLAS and OpenMP pools limited by threadpoolctl, and npspec's
    own "panels" workers (npspec.model.set_threads) set to n; both restored afterwards."""
    from threadpoolctl import threadpool_limits

    from npspec.model import set_threads

    previous = set_threads(n)
    try:
        with threadpool_limits(limits=n):
            yield
    finally:
        set_threads(previous)


def blas_info():
    """The BLAS numpy uses: `{"blas": vendor, "blas_version", "blas_threads", "blas_arch"}` (threadpoolctl)."""
    from threadpoolctl import threadpool_info

    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not blas:
        return {"blas": "unknown", "blas_version": "", "blas_threads": "", "blas_arch": ""}
    b = blas[0]
    return {"blas": b.get("internal_api", ""), "blas_version": b.get("version", ""),
            "blas_threads": b.get("num_threads", ""), "blas_arch": b.get("architecture", "")}


def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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


def median(xs):
    return float(np.median(xs))


def read_bandwidth(nbytes=1 << 30, repeats=5):
    """Read bandwidth in bytes/s: the fastest of two read-only kernels over an `nbytes` float32 array.

    Kernels: BLAS sdot of the array with itself (`np.dot(a, a)`, one pass over memory, uses the
    BLAS threads) and `np.add.reduce` split over as many Python threads as BLAS threads (numpy
    releases the GIL in reductions). Each is timed `repeats` times; the best time counts. The
    array must be much larger than the last-level cache (default 1 GiB).
    """
    from concurrent.futures import ThreadPoolExecutor

    a = np.ones(nbytes // 4, dtype=np.float32)
    n_threads = int(blas_info()["blas_threads"] or 1)
    best = min(time_call(lambda: np.dot(a, a), repeats))
    chunks = np.array_split(a, n_threads)
    with ThreadPoolExecutor(n_threads) as pool:
        best = min(best, min(time_call(lambda: list(pool.map(np.add.reduce, chunks)), repeats)))
    return a.nbytes / best


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
    """Save a matplotlib figure as PNG atomically, and close it."""
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight"))
    import matplotlib.pyplot as plt

    plt.close(fig)

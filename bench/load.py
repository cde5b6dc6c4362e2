"""python -m bench.load: how long loading a converted model takes, cold and warm, and its peak memory, against the targets.

Builds `random:<shape>` (default gpt2-large; --quick: distilgpt2) once into npspec's cache
(npspec.sources.resolve; --cache-dir, default $NPSPEC_CACHE or ~/.cache/npspec; --quick: a temporary
one, deleted afterwards), timing the build when it happens, and writes a format-1 copy of it (the
layout npspec wrote before format 2: every tensor row-major, `[in, out]`) into a temporary folder,
for comparison. Each case then runs `child` in a fresh interpreter, which times
npspec.sources.files.load_model (wall seconds) and reads its peak resident set (resource.getrusage
ru_maxrss; /proc's VmHWM beside it) and the bytes it read from storage (/proc/self/io read_bytes):
  * cold: the weights file is dropped from the page cache just before: os.fsync, then
    os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED). The kernel may keep pages it cannot drop, so
    the storage bytes say whether it worked (about the file's size when cold, about 0 when warm);
  * warm: the file is read once just before.
Format 1 loads as a read-only directory loads it (the relayout, no rewrite; every load pays it), and
once more with its one-time rewrite as format 2. Targets (issue 17): a warm load of format 2 in at
most 1.5 s (the median of the warm runs) and peak RSS at most 1.1x the weight bytes (the largest of
the format-2 runs). Writes load.csv/.md.
"""

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors import safe_open

from npspec.sources import files
from npspec.sources.progress import bar
from npspec.sources import cache_root, resolve

from . import common
from .memory import status_bytes, warm

TARGET_WARM_SECONDS = 1.5
TARGET_PEAK_OVER_WEIGHTS = 1.1


def io_read_bytes():
    """Bytes this process has caused to be fetched from storage (/proc/self/io read_bytes); -1 where /proc is missing."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


def child(path, rewrite):
    """Run in the child process: load `path` (no rewrite of a format-1 file unless `rewrite`), report JSON on stdout."""
    if not rewrite:  # what a directory npspec cannot write gets: the relayout on every load
        files.rewrite_format_1 = lambda path, params, config, metadata, lock=None: (metadata, None)
    before, read0 = status_bytes("VmRSS"), io_read_bytes()  # ru_maxrss may still hold the parent's peak here
    t0 = time.perf_counter()
    model = files.load_model(path)
    seconds = time.perf_counter() - t0
    print(json.dumps({"load_seconds": seconds, "rss_before": before,
                      "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "vm_hwm": status_bytes("VmHWM"), "storage_read": io_read_bytes() - read0,
                      "weight_bytes": model.n_bytes, "format_after": model.metadata["format_version"]}))


def measure(path, rewrite=False):
    """The JSON report of `child` run in a fresh interpreter (from the repository root, so `bench` imports)."""
    code = f"from bench.load import child; child({str(path)!r}, {bool(rewrite)})"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=Path(__file__).resolve().parent.parent)
    return json.loads(r.stdout.strip().splitlines()[-1])


def drop_from_page_cache(path):
    """Ask the kernel to drop `path` from the page cache (fsync first: dirty pages cannot be dropped)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def write_format_1(src, out):
    """Write the format-2 model directory `src` as format 1 into `out` (one tensor in memory at a time)."""
    weights = Path(src) / files.WEIGHTS_FILE
    with safe_open(str(weights), framework="numpy") as f:
        metadata = f.metadata()
    config = files.config_from_metadata(metadata, weights)
    old = {**{k: v for k, v in metadata.items() if k != "layout"}, "format_version": "1"}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with open(weights, "rb") as fh:
        start, header = files.read_header(fh)

        def array(name):  # format 2 holds w.T; format 1 holds w, row-major
            a = files.read_tensor(fh, start, header[name], "<f4", f"{weights} (tensor {name})")
            return np.ascontiguousarray(a.T) if files.is_block_matrix(name) else a

        files.atomic_write(out / files.WEIGHTS_FILE,
                           lambda tmp: files.write_safetensors(tmp, files.tensor_shapes(config), array, old))
    shutil.copy(Path(src) / files.TOKENIZER_FILE, out / files.TOKENIZER_FILE)
    return out


def options(ap):
    ap.add_argument("--shape", default=None, help="GPT-2 shape (default gpt2-large; --quick: distilgpt2)")
    ap.add_argument("--cache-dir", default=None, help="npspec's cache to build random:<shape> into (default "
                                                      "$NPSPEC_CACHE or ~/.cache/npspec; --quick: a temporary one)")
    ap.add_argument("--runs", type=int, default=None, help="runs of each format-2 case (default 3; --quick: 1)")


def row(case, fmt, page_cache, run, r, file_bytes):
    w = r["weight_bytes"]
    return {"case": case, "format": fmt, "page_cache": page_cache, "run": run, "load_seconds": r["load_seconds"],
            "load_GBps": file_bytes / r["load_seconds"] / 1e9, "storage_read_MB": r["storage_read"] / 1e6,
            "rss_before_MB": r["rss_before"] / 1e6, "peak_rss_MB": r["peak_rss"] / 1e6,
            "vm_hwm_MB": r["vm_hwm"] / 1e6, "peak_over_weights": r["peak_rss"] / w,
            "growth_over_weights": (r["peak_rss"] - r["rss_before"]) / w,
            "file_format_after": r["format_after"]}


def main(argv=None):
    run = common.command_line("bench.load", __doc__, argv, options, threads=("1", "1"), many=False)
    args = run.args
    shape = args.shape or ("distilgpt2" if args.quick else "gpt2-large")
    runs = args.runs or (1 if args.quick else 3)
    temporary = args.quick and not args.cache_dir
    root = Path(tempfile.mkdtemp(prefix="npspec-bench-cache-")) if temporary else cache_root(args.cache_dir)
    scratch = Path(tempfile.mkdtemp(prefix="npspec-bench-load-"))
    progress = common.progress_bars()
    try:
        t0 = time.perf_counter()
        with common.notes():
            entry = resolve(f"random:{shape}", root, progress)
        build = time.perf_counter() - t0
        built = build > 1.0 or temporary  # resolve found the entry already there in well under a second
        old = write_format_1(entry, scratch / "format-1")
        weights = entry / files.WEIGHTS_FILE
        file_bytes = os.path.getsize(weights)
        cases = [("format 2, cold", "2", "cold", entry, False)] * runs + \
                [("format 2, warm", "2", "warm", entry, False)] * runs + \
                [("format 1, cold (relayout)", "1", "cold", old, False), ("format 1, warm (relayout)", "1", "warm", old, False),
                 ("format 1, warm, first load (relayout + rewrite as format 2)", "1", "warm", old, True)]
        rows, count = [], {}
        with bar(progress, f"loading {shape}", len(cases), unit="load") as b:
            for case, fmt, page_cache, path, rewrite in cases:
                (drop_from_page_cache if page_cache == "cold" else warm)(path / files.WEIGHTS_FILE)
                count[case] = count.get(case, 0) + 1
                rows.append(row(case, fmt, page_cache, count[case], measure(path, rewrite), file_bytes))
                common.log(f"{case}: {rows[-1]['load_seconds']:.2f} s, peak RSS {rows[-1]['peak_over_weights']:.2f} x "
                           f"weights, {rows[-1]['storage_read_MB']:.0f} MB from storage")
                b.update(1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if temporary:
            shutil.rmtree(root, ignore_errors=True)
    weight_bytes = rows[0]["peak_rss_MB"] * 1e6 / rows[0]["peak_over_weights"]
    warm2 = [r["load_seconds"] for r in rows if r["format"] == "2" and r["page_cache"] == "warm"]
    cold2 = [r for r in rows if r["format"] == "2" and r["page_cache"] == "cold"]
    peak2 = max(r["peak_over_weights"] for r in rows if r["format"] == "2")
    warm_s = common.median(warm2)
    cold_read = min(r["storage_read_MB"] for r in cold2) * 1e6
    warm_read = max(r["storage_read_MB"] for r in rows if r["page_cache"] == "warm") * 1e6
    run.meta.update({"model": f"random:{shape}", "weight_bytes": f"{weight_bytes:.0f}", "file_bytes": str(file_bytes),
                     "build_seconds": f"{build:.1f}" if built else "already built",
                     "load_average_1min_at_end": f"{common.load_average():.2f}"})  # a shared machine: say how busy
    met = {True: "met", False: "MISSED"}
    notes = f"""
How coldness was made sure: before each cold load the weights file was fsync'd and dropped from the page cache with
`os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`; before each warm load it was read once. Whether it worked: the cold
loads read at least {cold_read / 1e6:.0f} MB from storage (the file is {file_bytes / 1e6:.0f} MB) and the warm ones at
most {warm_read / 1e6:.0f} MB (/proc/self/io read_bytes of the loading process), so the drop
{"worked" if cold_read > 0.9 * file_bytes and warm_read < 0.1 * file_bytes else "did NOT fully work (see storage_read_MB)"}.

Targets (issue 17):
- warm load of format 2 at most {TARGET_WARM_SECONDS} s: {met[warm_s <= TARGET_WARM_SECONDS]} (median of {len(warm2)}
  warm runs: {warm_s:.2f} s, fastest {min(warm2):.2f} s; cold median {common.median([r["load_seconds"] for r in cold2]):.2f} s);
- peak RSS at most {TARGET_PEAK_OVER_WEIGHTS}x the weight bytes: {met[peak2 <= TARGET_PEAK_OVER_WEIGHTS]} (largest of
  the format-2 runs: {peak2:.3f}x; it includes the interpreter, numpy and the tokenizer, rss_before_MB, VmRSS just before
  the load; growth_over_weights is the peak's growth during the load alone).

Peak RSS is ru_maxrss of the loading process (vm_hwm_MB, /proc's VmHWM, is the same high-water mark read another way).
Format 1 rows: the load a directory npspec cannot write pays every time (each block matrix relaid out column-major after
the read), and the one-time first load that also rewrites the file as format 2 (file_format_after). Build of
random:{shape} (drawing GPT-2's initialisation and writing it): {run.meta["build_seconds"]} s.
"""
    return common.finish(run, [common.Table("load", rows, f"Loading a converted random:{shape}, cold and warm", notes)])


if __name__ == "__main__":
    sys.exit(main())

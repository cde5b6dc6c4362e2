"""python -m bench.memory: load time and peak memory of a converted model, against its weight bytes.

Writes a converted model with random weights of `--shape` (default gpt2-large; --quick:
distilgpt2) once into a cache folder (npspec.sources.files.save_converted), reads the file once
to warm the page cache, then in a fresh child process (`child`, with the run's thread count for
BLAS and the kernel): times npspec.sources.files.load_model and reads the peak resident set size (VmHWM
in /proc/self/status, Linux) after loading and after generating `--new-tokens` greedy tokens, and the resident
set (VmRSS) then. With the fast extra, also the target on compiled-panels, alone and with `--draft` (default the
int4-g64 self-draft on compiled-quant). The child runs twice; the second (warm) run is reported. Writes memory.csv/.md.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from npspec.kernels import compiled
from npspec.kernels.registry import STATIC_DEFAULT
from npspec.model.model import leaves
from npspec.sources.files import WEIGHTS_FILE, load_model, save_converted
from npspec.sources.init import init_tensors
from npspec.sources import SHAPES, load
from npspec.sources.shipped import gpt2_tokenizer_json
from npspec.decode import speculative_generate

from . import common


def status_bytes(field):
    """A `kB` field of /proc/self/status (VmRSS, VmHWM) in bytes; 0 where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def write_model(shape, path):
    """Write a converted model of `shape` with random weights (GPT-2 init, seed 0) to `path`, unless it exists."""
    path = Path(path)
    if (path / WEIGHTS_FILE).is_file():
        return path
    config = SHAPES[shape]
    save_converted(path, init_tensors(config, seed=0), config, f"random:{shape}", "", gpt2_tokenizer_json())
    return path


def warm(path, chunk=1 << 26):
    """Read every byte of the file once (page cache warm-up); returns seconds."""
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(chunk):
            pass
    return time.perf_counter() - t0


def child(path, new_tokens, threads, kernel=STATIC_DEFAULT, draft=None):
    """Run in the child process: load with `kernel` at `threads` (and, with `draft`, that SPEC's draft, e.g.
    "int4-g64:self" quantized from the loaded target, on compiled-quant), generate, report JSON on stdout."""
    with common.blas_threads(threads):
        rss0 = status_bytes("VmRSS")
        t0 = time.perf_counter()
        model = load_model(path, kernel, threads=threads)
        drafter = None if draft is None else load(draft, "draft", kernel="compiled-quant", threads=threads,
                                                  target=model)
        load_s = time.perf_counter() - t0
        hwm_load = status_bytes("VmHWM")
        gen = speculative_generate(model, drafter, [50256], new_tokens, gamma=0 if draft is None else 4,
                                   temperature=0)
    weights = model.n_bytes + (0 if draft is None else drafter.n_bytes - shared_bytes(model, drafter))
    print(json.dumps({"load_seconds": load_s, "rss_before": rss0, "peak_rss_after_load": hwm_load,
                      "peak_rss_after_generate": status_bytes("VmHWM"), "rss_after_generate": status_bytes("VmRSS"),
                      "weight_bytes": weights, "tok_s": gen.stats.tokens_per_s}))


def shared_bytes(a, b):  # bytes of the weight arrays two models share (a self-draft's float32 tensors)
    ids = {id(x) for x in leaves(a.params)}
    return sum(x.nbytes for x in leaves(b.params) if id(x) in ids)


def measure(path, new_tokens, threads, kernel=STATIC_DEFAULT, draft=None):
    """The JSON report of `child` run in a fresh interpreter (from the repository root, so `bench` imports)."""
    code = (f"from bench.memory import child; child({str(path)!r}, {int(new_tokens)}, {int(threads)}, {kernel!r}, "
            f"{draft!r})")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=Path(__file__).resolve().parent.parent)
    return json.loads(r.stdout.strip().splitlines()[-1])


def options(ap):
    ap.add_argument("--shape", default=None, help="GPT-2 shape (default gpt2-large; --quick: distilgpt2)")
    ap.add_argument("--cache", default=None,
                    help="folder for the converted model (default ~/.cache/npspec-bench/<shape>; --quick: a temporary "
                         "one, deleted afterwards)")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens generated after loading (default 16; --quick: 4)")
    ap.add_argument("--draft", default="int4-g64:self",
                    help="with the fast extra, also the target on compiled-panels, alone and with this draft SPEC on "
                         "compiled-quant, speculative at gamma 4 (default int4-g64:self; '' for neither)")


def main(argv=None):
    run = common.command_line("bench.memory", __doc__, argv, options, threads=("2", "1"), many=False)
    args = run.args
    shape = args.shape or ("distilgpt2" if args.quick else "gpt2-large")
    new_tokens = args.new_tokens or (4 if args.quick else 16)
    if args.cache:
        cache = Path(args.cache).expanduser()
    elif args.quick:
        cache = Path(tempfile.mkdtemp(prefix="npspec-bench-model-"))
    else:
        cache = Path.home() / ".cache" / "npspec-bench" / shape
    path = write_model(shape, cache)
    file_bytes = os.path.getsize(path / WEIGHTS_FILE)
    warm(path / WEIGHTS_FILE)
    cases = [(STATIC_DEFAULT, None)] + ([("compiled-panels", None), ("compiled-panels", args.draft)]
                                        if compiled.available() and args.draft else [])
    rows = []
    for kernel, draft in cases:
        r = [measure(path, new_tokens, run.threads[0], kernel, draft) for _ in range(2)][-1]  # the second, warm run
        w = r["weight_bytes"]
        row = {"model": f"random:{shape}", "kernel": kernel, "draft": draft or "", "weight_MB": w / 1e6,
               "file_MB": file_bytes / 1e6, "load_seconds": r["load_seconds"],
               "load_GBps": file_bytes / r["load_seconds"] / 1e9, "rss_before_MB": r["rss_before"] / 1e6,
               "peak_rss_load_MB": r["peak_rss_after_load"] / 1e6, "peak_rss_generate_MB": r["peak_rss_after_generate"] / 1e6,
               "rss_generate_MB": r["rss_after_generate"] / 1e6, "peak_over_weights": r["peak_rss_after_generate"] / w,
               "new_tokens": new_tokens, "tok_s": r["tok_s"]}
        rows.append(row)
        common.log(f"{shape} ({kernel}{', draft ' + draft if draft else ''}): load {r['load_seconds']:.2f} s, resident "
                   f"{row['rss_generate_MB']:.0f} MB after generating, peak {row['peak_rss_generate_MB']:.0f} MB = "
                   f"{row['peak_over_weights']:.2f} x weight bytes")
    if args.quick and not args.cache:  # the temporary model is not kept (about 330 MB)
        shutil.rmtree(cache)
    return common.finish(run, [common.Table(
        "memory", rows, "Load time and memory (warm page cache)",
        "Peak RSS = VmHWM, resident = VmRSS after generating, of a fresh process (Python + numpy + the models + KV "
        "caches); the second of two runs, after the file was read once. A compiled kernel holds the weights as its "
        "panels only; the draft, quantized from the loaded target, holds codes and scales (compiled-quant).")])


if __name__ == "__main__":
    sys.exit(main())

"""python -m bench.memory: load time and peak memory of a converted model, against its weight bytes.

Writes a converted model with random weights of `--shape` (default gpt2-large; --quick:
distilgpt2) once into a cache folder (npspec.checkpoint.save_converted), reads the file once
to warm the page cache, then in a fresh child process: times npspec.checkpoint.load_model and
reads the peak resident set size (VmHWM in /proc/self/status, Linux) after loading and after
generating `--new-tokens` greedy tokens. The child runs twice; the second (warm) run is reported.
Writes memory.csv/.md.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
    from npspec.checkpoint import WEIGHTS_FILE, save_converted
    from npspec.init import SHAPES, init_tensors
    from npspec.models import shipped_dir

    path = Path(path)
    if (path / WEIGHTS_FILE).is_file():
        return path
    config = SHAPES[shape]
    tokenizer_json = (shipped_dir("gpt2", "tokenizer.json") / "tokenizer.json").read_text(encoding="utf-8")
    save_converted(path, init_tensors(config, seed=0), config, f"random:{shape}", "", tokenizer_json)
    return path


def warm(path, chunk=1 << 26):
    """Read every byte of the file once (page cache warm-up); returns seconds."""
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(chunk):
            pass
    return time.perf_counter() - t0


def child(path, new_tokens):
    """Run in the child process: load, generate, report JSON on stdout."""
    from npspec.checkpoint import load_model
    from npspec.speculative import speculative_generate

    rss0 = status_bytes("VmRSS")
    t0 = time.perf_counter()
    model = load_model(path)
    load_s = time.perf_counter() - t0
    hwm_load = status_bytes("VmHWM")
    gen = speculative_generate(model, None, [50256], new_tokens, gamma=0, temperature=0)
    print(json.dumps({"load_seconds": load_s, "rss_before": rss0, "peak_rss_after_load": hwm_load,
                      "peak_rss_after_generate": status_bytes("VmHWM"), "weight_bytes": model.n_bytes,
                      "tok_s": gen.stats.tokens_per_s}))


def main(argv=None):
    ap = common.parser("bench.memory", __doc__.split("\n")[0])
    ap.add_argument("--shape", default=None, help="GPT-2 shape (default gpt2-large; --quick: distilgpt2)")
    ap.add_argument("--cache", default=None,
                    help="folder for the converted model (default ~/.cache/npspec-bench/<shape>; --quick: a temporary "
                         "one, deleted afterwards)")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens generated after loading (default 16; --quick: 4)")
    ap.add_argument("--child", default=None, help=argparse_hidden())
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.new_tokens)
        return 0
    out = common.output_dir(args)
    shape = args.shape or ("distilgpt2" if args.quick else "gpt2-large")
    new_tokens = args.new_tokens or (4 if args.quick else 16)
    if args.cache:
        cache = Path(args.cache).expanduser()
    elif args.quick:
        cache = Path(tempfile.mkdtemp(prefix="npspec-bench-model-"))
    else:
        cache = Path.home() / ".cache" / "npspec-bench" / shape
    path = write_model(shape, cache)
    file_bytes = os.path.getsize(path / "model.safetensors")
    warm(path / "model.safetensors")
    env = dict(os.environ)
    runs = []
    with common.blas_threads(common.thread_counts(args)[-1]):
        for _ in range(2):
            r = subprocess.run([sys.executable, "-m", "bench.memory", "--child", str(path), "--new-tokens",
                                str(new_tokens)], capture_output=True, text=True, check=True, env=env,
                               cwd=Path(__file__).resolve().parent.parent)
            runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    if args.quick and not args.cache:  # the temporary model is not kept (about 330 MB)
        shutil.rmtree(cache)
    r = runs[-1]
    w = r["weight_bytes"]
    row = {"model": f"random:{shape}", "weight_MB": w / 1e6, "file_MB": file_bytes / 1e6,
           "load_seconds": r["load_seconds"], "load_GBps": file_bytes / r["load_seconds"] / 1e9,
           "rss_before_MB": r["rss_before"] / 1e6, "peak_rss_load_MB": r["peak_rss_after_load"] / 1e6,
           "peak_rss_generate_MB": r["peak_rss_after_generate"] / 1e6,
           "peak_over_weights": r["peak_rss_after_generate"] / w, "new_tokens": new_tokens, "tok_s": r["tok_s"]}
    print(f"{shape}: load {r['load_seconds']:.2f} s ({row['load_GBps']:.1f} GB/s), peak RSS "
          f"{row['peak_rss_generate_MB']:.0f} MB = {row['peak_over_weights']:.2f} x weight bytes", file=sys.stderr)
    meta = common.machine_info()
    meta["command"] = "python -m bench.memory " + " ".join(argv if argv is not None else sys.argv[1:])
    common.write_table(out, "memory", [row], meta, "Load time and peak memory (warm page cache)",
                       "Peak RSS = VmHWM of a fresh process (Python + numpy + the model + a KV cache); the second "
                       "of two runs, after the file was read once.")
    print(f"wrote {out / 'memory.md'}")
    return 0


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())

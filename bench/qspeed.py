"""python -m bench.qspeed: what a quantized self-draft costs per token with npspec's dequantizing kernel (issue 14, Speed).

c = t_draft(1) / t_target(1): t_target(1) is the one-token forward of the float32 model (default: the
shipped target, then random:gpt2-large) with its FASTEST kernel, "gemm", "gemv-rows" and "gemv-panels" all timed in this
run with the same threads; t_draft(1) is the one-token forward of the same model quantized (block
linears; int8 per channel, int8 group 64, int4 group 64; codes one a byte, never packed) running
the kernel "dequant-panels" (npspec.kernels.quantized: each panel's int8 codes cast to float32 into a reused
buffer, multiplied by its scales, then its GEMV). Forwards are timed as bench.verify_cost.time_forward
(median after a warm-up, --context cached tokens).

Tables (prefix quantized_ as bench.quantized's, issue 14):
  * quantized_speed: one row per model and kernel: t1_ms, bytes_per_token (what the forward reads:
    float32 matrices, or codes + scales + the float32 tied head), c (measured, over the fastest
    float32 kernel), c_bytes (bytes ratio of what this kernel reads), c_bw (npspec.sources.quantize.weight_bytes:
    codes packed at bits/8 bytes, the bandwidth-bound limit of bench.quantized), and for the
    quantized rows the predicted speedup E[tokens/round](beta, gamma 4) / (4 c + 1)
    (npspec.decode.evaluate.predicted_speedup, v = 1) with the shipped self-draft's exact beta of the same
    scheme (bench/results/quantized-epyc/quantized_beta.csv, the study) at greedy and t1.0, once with c measured and
    once with c_bw. This mixes the shipped pair's acceptance with gpt2-large's costs: a model of what
    the same scheme would do on a large target, not a measurement of one.
  * quantized_speed_profile: where a quantized forward's time goes, per scheme, over every block
    matrix of the model once (so nothing is timed from a warm cache): the cast (int8 -> float32 into
    the buffer), the multiply by the scales (cast + multiply, minus cast), the GEMVs on the
    dequantized panels (the buffer in L2), and the whole kernel; with the bytes each step reads and
    writes, the rate in weights per ns, and, for int4 packed two a byte (not built: estimated), the
    cost of unpacking (a shift pair per byte into int8) measured on the same panels. Beside them the
    read bandwidth probe (bench.common.read_bandwidth) and the float32 block matrices' time at that
    bandwidth.
  * quantized_speed_panels: ns per weight of "dequant-panels" (int8-ch, one token) on each matrix
    shape of the model, for float32 panel buffers of 160 KiB to 2 MiB (npspec.kernels.quantized.QPANEL_BYTES);
    then (rows with a `method`) weights per ns of five ways to dequantize the panels of layer 0's
    mlp.c_fc (method_rows): the kernel's cast + multiply in place, astype, a mixed-type multiply, a
    256-entry table gather, and the cast alone.
"""

import sys

import numpy as np

from npspec.decode.evaluate import predicted_speedup
from npspec.model.tensors import tensor_shapes
from npspec.model.gpt2 import attention, gpt2
from npspec.kernels.layout import block_linears
from npspec.kernels.registry import kernel as registry_kernel
from npspec.kernels.quantized import QPANEL_BYTES, QuantizedMatrix, dequant_panels, panel_gemv
from npspec.sources.quantize import parse_scheme, quantize_tensor, weight_bytes
from npspec.sources.quantized import quantize_model

from . import common, models
from .verify_cost import time_forward

FLOAT_KERNELS = ("gemm", "gemv-rows", "gemv-panels")
SCHEMES = ("int8-ch", "int8-g64", "int4-g64")
PANEL_SIZES = (160 << 10, 320 << 10, 512 << 10, 1 << 20, 2 << 20)
GAMMA = 4
STUDY = common.RESULTS / "quantized-epyc"  # the full quantized study, whose betas the predictions use


def study_betas(path):
    """{scheme: (beta greedy, beta t1.0)} of the shipped self-draft (RTN rows of quantized_beta.csv), {} if absent."""
    if not path.is_file():
        return {}
    rows, _ = common.read_table(path)
    return {r["scheme"]: (float(r["beta_greedy"]), float(r["beta_t1.0"])) for r in rows
            if r["draft"] == "shipped target" and r["method"] == "rtn"}


def best_of_passes(f, repeats):
    """The fastest of `repeats` calls of f() after one untimed call (seconds)."""
    return common.time_call(f, repeats, warmup=1)[0]


def profile(model, repeats):
    """Seconds of the cast, cast + multiply, GEMV and whole kernel over every block matrix of `model` once, one token.

    model: a Model whose block matrices are QuantizedMatrix. Returns a dict of seconds and weights.
    """
    mats = [lin["w"] for lin in block_linears(model.params)]
    xs = {m.shape[0]: np.random.default_rng(0).standard_normal((1, m.shape[0]), dtype=np.float32) for m in mats}
    bufs = {(m.shape[0], m.width): np.empty((m.shape[0], m.width), dtype=np.float32) for m in mats}

    def cast():
        for m in mats:
            buf = bufs[m.shape[0], m.width]
            for p in range(len(m.starts)):
                np.copyto(buf, m.codes[p], casting="unsafe")

    def dequantize():
        for m in mats:
            buf = bufs[m.shape[0], m.width]
            for p in range(len(m.starts)):
                m.panel(p, buf)

    def gemv():  # the GEMVs alone, on an L2-resident buffer (what they cost inside the kernel)
        for m in mats:
            buf, x = bufs[m.shape[0], m.width], xs[m.shape[0]]
            for p in range(len(m.starts)):
                panel_gemv(x, buf)

    def kernel():
        for m in mats:
            dequant_panels(xs[m.shape[0]], m)

    packed = [(m, np.ascontiguousarray(m.codes[:, : m.shape[0] // 2]).view(np.uint8) << 4
               | (np.ascontiguousarray(m.codes[:, m.shape[0] // 2:]).view(np.uint8) & 15)) for m in mats]
    half = {(m.shape[0] // 2, m.width): np.empty((m.shape[0] // 2, m.width), dtype=np.int8) for m in mats}

    def unpack():  # int4 packed two a byte (rows i and i + d_in/2): sign-extended nibbles into int8, per panel
        for m, pk in packed:
            lo, hi = half[m.shape[0] // 2, m.width], np.empty_like(half[m.shape[0] // 2, m.width])
            for p in range(len(m.starts)):
                np.right_shift(pk[p].view(np.int8), 4, out=hi)
                np.left_shift(pk[p], 4, out=lo.view(np.uint8))
                np.right_shift(lo, 4, out=lo)

    out = {name: best_of_passes(f, repeats) for name, f in
           (("cast", cast), ("dequantize", dequantize), ("gemv", gemv), ("kernel", kernel), ("unpack_int4", unpack))}
    out["weights"] = sum(m.size for m in mats)
    out["panel_weights"] = sum(m.codes.size for m in mats)  # the overlap panels included
    out["scale_bytes"] = sum(m.scales.nbytes for m in mats)
    return out


def panel_sweep(model, repeats):
    """quantized_speed_panels rows: ns per weight of dequant_panels (int8-ch) per matrix shape and panel size."""
    rows, scheme = [], parse_scheme("int8-ch")
    for lin, name in zip(block_linears({"h": model.params["h"][:1]}), ("attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                                       "mlp.c_proj")):
        q = quantize_tensor(lin["w"], scheme)
        x = np.random.default_rng(0).standard_normal((1, lin["w"].shape[0]), dtype=np.float32)
        for size in PANEL_SIZES:
            m = QuantizedMatrix.from_codes(q.codes, q.scales, size)
            t = common.median(common.time_call(lambda: dequant_panels(x, m), repeats, warmup=1))
            rows.append({"matrix": name, "d_in": m.shape[0], "d_out": m.shape[1], "panel_KiB": size >> 10,
                         "width": m.width, "panels": len(m.starts), "ms": 1e3 * t, "ns_per_weight": 1e9 * t / m.size})
            common.log(f"panels {name} {m.shape} {size >> 10} KiB width {m.width}: {1e9 * t / m.size:.3f} ns/weight")
    return rows


def method_rows(model, repeats):
    """quantized_speed_methods rows: weights per ns of ways to dequantize every panel of layer 0's mlp.c_fc (1 MiB panels).

    "cast + multiply in place" is the kernel's (QuantizedMatrix.panel); "astype * scales" allocates a new
    array per panel; "one mixed-type multiply" lets the ufunc cast int8 on the fly; "take from a 256-entry
    table" is a gather only (one shared table: NOT a dequantization of per-channel or per-group scales, which
    need a table per column or group), the cheapest a lookup could be; "cast only" is the floor.
    """
    rows, w = [], model.params["h"][0]["mlp"]["c_fc"]["w"]
    for s in ("int8-ch", "int8-g64"):
        q = quantize_tensor(w, parse_scheme(s))
        m = QuantizedMatrix.from_codes(q.codes, q.scales)
        buf = np.empty((m.shape[0], m.width), dtype=np.float32)
        grouped = buf.reshape(m.scales.shape[1], m.group, m.width)
        table = np.linspace(-1, 1, 256, dtype=np.float32)
        steps = {
            "cast only": lambda p: np.copyto(buf, m.codes[p], casting="unsafe"),
            "cast + multiply in place (the kernel)": lambda p: m.panel(p, buf),
            "astype * scales (new arrays)": lambda p: (m.codes[p].reshape(grouped.shape).astype(np.float32)
                                                      * m.scales[p]),
            "one mixed-type multiply": lambda p: np.multiply(m.codes[p].reshape(grouped.shape), m.scales[p], out=grouped,
                                                             casting="unsafe"),
            "take from a 256-entry table (gather only)": lambda p: np.take(table, m.codes[p].view(np.uint8), out=buf)}
        for step, f in steps.items():
            t = best_of_passes(lambda: [f(p) for p in range(len(m.starts))], repeats)
            rows.append({"scheme": s, "method": step, "ms": 1e3 * t, "weights_per_ns": m.codes.size / t / 1e9})
            common.log(f"methods {s} {step}: {m.codes.size / t / 1e9:.2f} weights/ns")
    return rows


def options(ap):
    ap.add_argument("--models", default=None, help="comma-separated float32 models (bench.models names; default "
                    "shipped:target,random:gpt2-large; --quick shipped:target,random:gpt2)")
    ap.add_argument("--repeats", type=int, default=None, help="timed forwards per point (default 5; --quick 2)")
    ap.add_argument("--context", type=int, default=32, help="cached tokens before the timed one (default 32)")


def measure(name, n, repeats, context, betas, bandwidth):
    """(quantized_speed rows, quantized_speed_profile rows, quantized_speed_panels rows, fastest float32 kernel) of
    the model `name` (bench.models) with `n` threads."""
    rows, prof_rows = [], []
    model = models.get(name, threads=n).with_kernel("gemv-panels", n)  # float32 matrices: a compiled kernel packs
    shapes = tensor_shapes(model.config)
    float_bytes = models.matrix_bytes(model)
    panel_rows = [{"model": name, **r} for r in panel_sweep(model, repeats)]
    panel_rows += [{"model": name, "matrix": "mlp.c_fc", **r} for r in method_rows(model, repeats)]
    t = {}
    for k in FLOAT_KERNELS:
        linear = registry_kernel(k).build(n)
        t[k] = time_forward(model, 1, repeats, context,
                            lambda ids, cache: gpt2(ids, model.params, model.config, cache, linear, attention))
        common.log(f"{name} float32 {k}: t(1) {1e3 * t[k]:.1f} ms")
    fastest = min(t, key=t.get)
    for k in FLOAT_KERNELS:
        rows.append({"model": name, "scheme": "fp32", "kernel": k, "t1_ms": 1e3 * t[k], "bytes_per_token": float_bytes,
                     "c": t[k] / t[fastest], "c_bytes": 1.0, "c_bw": 1.0})
    for s in SCHEMES:
        scheme = parse_scheme(s)
        q = quantize_model(model, scheme, "dequant-panels", n)
        nbytes = models.matrix_bytes(q)
        tq = time_forward(q, 1, repeats, context)
        c, c_bw = tq / t[fastest], weight_bytes(shapes, scheme) / float_bytes
        row = {"model": name, "scheme": s, "kernel": q.kernel, "t1_ms": 1e3 * tq, "bytes_per_token": nbytes, "c": c,
               "c_bytes": nbytes / float_bytes, "c_bw": c_bw}
        if s in betas:
            for w, beta in zip(("greedy", "t1.0"), betas[s]):
                beta = min(beta, 1 - 1e-12)
                row.update({f"beta_{w}": beta, f"speedup_c_{w}": predicted_speedup(beta, GAMMA, c, 1.0),
                            f"speedup_c_bw_{w}": predicted_speedup(beta, GAMMA, c_bw, 1.0)})
        rows.append(row)
        common.log(f"{name} {s} dequant-panels: t(1) {1e3 * tq:.1f} ms, c {c:.3f} (bytes {nbytes / float_bytes:.3f}, "
                    f"packed {c_bw:.3f})")
        p = profile(q, repeats)
        w, pw = p["weights"], p["panel_weights"]
        block_float = 4 * w / bandwidth
        for step, sec, read, written in (
                ("cast int8 -> float32", p["cast"], pw, 4 * pw),
                ("multiply by scales", p["dequantize"] - p["cast"], 4 * pw + p["scale_bytes"], 4 * pw),
                ("GEMV on the L2 panel", p["gemv"], 4 * pw, 0),
                ("whole kernel", p["kernel"], pw + p["scale_bytes"], 0),
                ("int4 packed: unpack (estimate)", p["unpack_int4"], pw / 2, pw),
                ("float32 blocks at read bandwidth", block_float, 4 * w, 0)):
            prof_rows.append({"model": name, "scheme": s, "step": step, "ms": 1e3 * sec,
                              "weights_per_ns": w / sec / 1e9, "bytes_read_MB": read / 1e6,
                              "bytes_written_MB": written / 1e6, "of_float32_target_t1": sec / t[fastest]})
        common.log(f"  profile ms: cast {1e3 * p['cast']:.0f}, multiply {1e3 * (p['dequantize'] - p['cast']):.0f}, "
                   f"gemv {1e3 * p['gemv']:.0f}, kernel {1e3 * p['kernel']:.0f}, unpack int4 "
                   f"{1e3 * p['unpack_int4']:.0f}; float32 blocks at {bandwidth / 1e9:.1f} GB/s "
                   f"{1e3 * block_float:.0f}")
        del q
        models.release()
    return rows, prof_rows, panel_rows, fastest


def main(argv=None):
    run = common.command_line("bench.qspeed", __doc__, argv, options=options, threads=("1", "1"), many=False)
    args, n = run.args, run.threads[0]
    names = (args.models or ("shipped:target,random:gpt2" if args.quick else "shipped:target,random:gpt2-large")).split(",")
    repeats = args.repeats or (2 if args.quick else 5)
    betas = study_betas(STUDY / "quantized_beta.csv")
    rows, prof_rows, panel_rows = [], [], []
    with common.blas_threads(n):
        bandwidth = common.read_bandwidth(1 << 28, 3) if args.quick else common.read_bandwidth(1 << 30, 3)
        run.meta[f"read_bandwidth_GBps_{n}_threads"] = f"{bandwidth / 1e9:.1f}"
        common.log(f"read bandwidth {bandwidth / 1e9:.1f} GB/s")
        for name in names:
            r, pr, pa, fastest = measure(name, n, repeats, args.context, betas, bandwidth)
            models.release()  # the model measure built
            rows, prof_rows, panel_rows = rows + r, prof_rows + pr, panel_rows + pa
            run.meta[f"fastest_float32_kernel_{name}"] = fastest
    run.meta["quantized_panel_bytes"] = str(QPANEL_BYTES)
    note = (f"c = t(1) / t(1) of the model's fastest float32 kernel (header), same run, {n} thread(s); median of {repeats} "
            f"one-token forwards after a warm-up, {args.context} cached tokens. c_bytes: bytes this kernel reads over "
            "the float32 model's (codes one a byte); c_bw: codes packed at bits/8 bytes (bench.quantized). "
            "speedup_c_W / speedup_c_bw_W: E[tokens/round](beta_W, 4) / (4 c + 1) with the shipped self-draft's beta of "
            "the same scheme (quantized_beta.csv): a model, not a measurement.")
    return common.finish(run, [
        common.Table("quantized_speed", rows, "One-token forward of a quantized self-draft with dequant-panels against "
                     "the float32 model's fastest kernel", note),
        common.Table("quantized_speed_profile", prof_rows, "Where a quantized one-token forward's time goes (block "
                     "matrices, every one once)",
                     "Best of repeated passes over every block matrix. multiply = (cast + multiply) - cast. The GEMV "
                     "runs on the L2-resident buffer as inside the kernel. unpack: int4 packed two a byte, the shifts "
                     "alone (the kernel does not read packed codes). of_float32_target_t1: over the fastest float32 "
                     "one-token forward (head and attention included)."),
        common.Table("quantized_speed_panels", panel_rows, "dequant-panels per matrix shape and panel size (int8-ch, "
                     "one token, layer 0)", f"Median of {repeats} products; panel_KiB: the float32 buffer.")])


if __name__ == "__main__":
    sys.exit(main())

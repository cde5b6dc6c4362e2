"""The tiles' helpers scratch, fma, prefetch, wide_vectors, block, qblock (`names`): numba intrinsics in LLVM IR, or
(numba None) NumPy stand-ins. fma, block and qblock round each multiply-add once (qblock each weight's scaling once
too); the others change no value. Imports numpy (numba, llvmlite inside the builders). numba's disk cache watches
tiles.py, blocks.py and qtiles.py only: after editing this file, delete compiled/__pycache__/*.nb?.
"""

import numpy as np

VECTOR_BITS = 512  # the vector width wide_vectors asks LLVM to prefer
LANES_256 = 8  # float32 in a 256-bit vector: qblock's vectors
AHEAD = 32  # panel rows a tile or block asks the CPU to fetch ahead of the row it multiplies


HELPERS = ("scratch", "fma", "prefetch", "wide_vectors", "block", "qblock")


def names(numba):  # numba module or None -> {name of HELPERS: callable}
    if numba is None:
        helpers = (numpy_scratch, numpy_fma, numpy_prefetch, numpy_wide_vectors, numpy_block, numpy_qblock)
    else:
        helpers = (stack_scratch(numba), fused(numba), cache_line(numba), vector_width(numba), register_block(numba),
                   quant_block(numba))
    return dict(zip(HELPERS, helpers))


def stack_scratch(numba):  # -> intrinsic scratch(rows, cols) -> [rows, cols] float32 C array on the stack
    """One LLVM `alloca` in the caller's entry block (rows, cols literal ints), which LLVM can keep in registers."""
    from numba.core import cgutils
    from numba.np.arrayobj import populate_array

    ints = numba.types.IntegerLiteral

    @numba.extending.intrinsic
    def scratch(typingctx, rows, cols):
        if not (isinstance(rows, ints) and isinstance(cols, ints)):
            return None  # numba then asks again with the arguments' literal values
        r, c = rows.literal_value, cols.literal_value
        array = numba.types.Array(numba.types.float32, 2, "C")

        def codegen(context, builder, signature, args):
            data = cgutils.alloca_once(builder, context.get_value_type(numba.types.float32), size=r * c)
            out = context.make_array(array)(context, builder)
            intp = context.get_value_type(numba.types.intp)
            populate_array(out, data=data, shape=[intp(r), intp(c)], strides=[intp(4 * c), intp(4)],
                           itemsize=intp(4), meminfo=None)
            return out._getvalue()
        return array(rows, cols), codegen
    return scratch


def fused(numba):  # -> intrinsic fma(a, b, c) -> float32: a * b + c rounded once (LLVM's llvm.fma.f32)
    from llvmlite import ir

    f32 = numba.types.float32

    @numba.extending.intrinsic
    def fma(typingctx, a, b, c):
        if not a == b == c == f32:
            return None

        def codegen(context, builder, signature, args):
            return builder.call(builder.module.declare_intrinsic("llvm.fma", [ir.FloatType()] * 3), args)
        return f32(a, b, c), codegen
    return fma


def cache_line(numba):  # -> intrinsic prefetch(a, i, j): asks the CPU for a[i, j]'s cache line into L2
    """One `llvm.prefetch` (read, locality 2) at a[i, j]'s address; past the array's end it does not fault."""
    from llvmlite import ir
    from numba.core import cgutils

    @numba.extending.intrinsic
    def prefetch(typingctx, a, i, j):
        if not (isinstance(a, numba.types.Array) and a.ndim == 2 and all(isinstance(t, numba.types.Integer)
                                                                          for t in (i, j))):
            return None

        def codegen(context, builder, signature, args):
            array_type, (array, row, column) = signature.args[0], args
            array = context.make_array(array_type)(context, builder, array)
            index = [context.cast(builder, v, t, numba.types.intp) for v, t in zip((row, column), signature.args[1:])]
            strides = cgutils.unpack_tuple(builder, array.strides, 2)
            offset = builder.add(builder.mul(index[0], strides[0]), builder.mul(index[1], strides[1]))
            byte = ir.IntType(8)
            address = builder.gep(builder.bitcast(array.data, byte.as_pointer()), [offset])
            i32 = ir.IntType(32)
            hint = ir.FunctionType(ir.VoidType(), [byte.as_pointer(), i32, i32, i32])
            call = builder.module.declare_intrinsic("llvm.prefetch", [byte.as_pointer()], hint)
            builder.call(call, [address, i32(0), i32(2), i32(1)])  # read, locality 2 (L2), data cache
            return context.get_dummy_value()
        return numba.types.void(a, i, j), codegen
    return prefetch


def vector_width(numba, bits=VECTOR_BITS):  # -> intrinsic wide_vectors(): the caller prefers `bits`-bit vectors
    """LLVM's attribute `"prefer-vector-width"="bits"` on the caller (added to llvmlite's set as a string)."""

    @numba.extending.intrinsic
    def wide_vectors(typingctx):
        def codegen(context, builder, signature, args):
            set.add(builder.function.attributes, f'"prefer-vector-width"="{bits}"')
            return context.get_dummy_value()
        return numba.types.void(), codegen
    return wide_vectors


def register_block(numba, ahead=AHEAD):  # -> intrinsic block(x, panels, p, a, rows, group, width, lanes)
    """a[r, g * width + j] = the chain s = +0.0, s = fma(x[r, k], panels[p + g, k, j], s) for k = 0 .. d_in - 1, for
    r < rows, g < group, j < width (rows, group, width, lanes literal ints; x [>= rows, d_in], panels [>= p + group,
    d_in, width] with unit inner stride, a [>= rows, group * width], both float32). The sums live in rows * group *
    width / lanes vectors of `lanes` float32 (llvm.fma.v<lanes>f32 per vector, one broadcast of x[r, k] per row), so
    LLVM keeps them in registers: a register block (Goto and van de Geijn 2008; BLIS's microkernel, Van Zee and van de
    Geijn 2015). Each k also asks for the panels' cache lines `ahead` rows on."""
    from numba.core import cgutils

    ints = numba.types.IntegerLiteral

    @numba.extending.intrinsic
    def block(typingctx, x, panels, p, a, rows, group, width, lanes):
        if not all(isinstance(t, ints) for t in (rows, group, width, lanes)):
            return None
        r_count, g_count, w_count, l_count = (t.literal_value for t in (rows, group, width, lanes))

        def codegen(context, builder, signature, args):
            x_, panels_, a_ = (context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 1, 3))
            strides = [cgutils.unpack_tuple(builder, v.strides, n) for v, n in ((x_, 2), (panels_, 3), (a_, 2))]
            p0 = context.cast(builder, args[2], signature.args[2], numba.types.intp)
            emit = BlockEmitter(builder, l_count, ahead)
            first = emit.at(panels_.data, builder.mul(p0, strides[1][0]))  # panels[p]
            d_in = cgutils.unpack_tuple(builder, x_.shape, 2)[1]
            emit.chains(x_.data, strides[0], first, strides[1][:2], a_.data, strides[2][0], d_in,
                        (r_count, g_count, w_count))
            return context.get_dummy_value()
        return numba.types.void(x, panels, p, a, rows, group, width, lanes), codegen
    return block


class BlockEmitter:
    """The LLVM IR of register_block's loop, emitted by `builder` (llvmlite) with `lanes`-float32 vectors."""

    def __init__(self, builder, lanes, ahead):
        from llvmlite import ir

        self.ir, self.builder, self.lanes, self.ahead = ir, builder, lanes, ahead
        self.i64, self.i32 = ir.IntType(64), ir.IntType(32)
        self.vector = ir.VectorType(ir.FloatType(), lanes)
        self.byte = ir.IntType(8).as_pointer()
        declare = builder.module.declare_intrinsic  # a full name and a type: the one declaration of that name
        self.fma = declare(f"llvm.fma.v{lanes}f32", (), ir.FunctionType(self.vector, [self.vector] * 3))
        self.prefetch = declare("llvm.prefetch.p0i8", (), ir.FunctionType(ir.VoidType(), [self.byte] + [self.i32] * 3))

    def at(self, data, offset):  # a typed pointer, a byte offset (i64) -> i8* to that byte
        return self.builder.gep(self.builder.bitcast(data, self.byte), [offset])

    def load(self, address, kind):  # i8* -> a value of `kind` read there (any alignment of its elements)
        return self.builder.load(self.builder.bitcast(address, kind.as_pointer()), align=4)

    def broadcast(self, value):  # a float -> a vector of `lanes` copies of it
        ir, b = self.ir, self.builder
        lane = b.insert_element(ir.Constant(self.vector, ir.Undefined), value, self.i64(0))
        return b.shuffle_vector(lane, ir.Constant(self.vector, ir.Undefined),
                                ir.Constant(ir.VectorType(self.i32, self.lanes), [0] * self.lanes))

    def chains(self, x, x_strides, panels, p_strides, a, a_stride, d_in, shape):
        """The loop over k in [0, d_in): zeros, then for each k one vector load per `lanes` weights, one broadcast per
        row and one fma per sum vector; the sums stored into a's rows at the end (phi nodes carry them)."""
        ir, b, i64 = self.ir, self.builder, self.i64
        rows, group, width = shape
        count = group * width // self.lanes  # sum vectors per row
        zero = ir.Constant(self.vector, [0.0] * self.lanes)
        entry = b.basic_block
        loop, done = b.append_basic_block("block.k"), b.append_basic_block("block.done")
        b.cbranch(b.icmp_signed(">", d_in, i64(0)), loop, done)
        b.position_at_end(loop)
        k = b.phi(i64)
        sums = [b.phi(self.vector) for _ in range(rows * count)]
        row = self.at(panels, b.mul(k, p_strides[1]))
        ahead = b.gep(row, [b.mul(p_strides[1], i64(self.ahead))])
        weights = []
        for g in range(group):
            start = b.mul(i64(g), p_strides[0])
            weights += [self.load(b.gep(row, [b.add(start, i64(4 * self.lanes * v))]), self.vector)
                        for v in range(width // self.lanes)]
            for line in range(0, 4 * width, 64):
                b.call(self.prefetch, [b.gep(ahead, [b.add(start, i64(line))]), self.i32(0), self.i32(2), self.i32(1)])
        column = b.mul(k, x_strides[1])
        added = []
        for r in range(rows):
            xk = self.broadcast(self.load(self.at(x, b.add(b.mul(i64(r), x_strides[0]), column)), ir.FloatType()))
            added += [b.call(self.fma, [xk, w, s]) for w, s in zip(weights, sums[r * count : (r + 1) * count])]
        k_next, tail = b.add(k, i64(1)), b.basic_block
        b.cbranch(b.icmp_signed("<", k_next, d_in), loop, done)
        k.add_incoming(i64(0), entry)
        k.add_incoming(k_next, tail)
        for phi, value in zip(sums, added):
            phi.add_incoming(zero, entry)
            phi.add_incoming(value, tail)
        b.position_at_end(done)
        final = []
        for value in added:
            phi = b.phi(self.vector)
            phi.add_incoming(zero, entry)
            phi.add_incoming(value, tail)
            final.append(phi)
        for r in range(rows):
            for v in range(count):
                address = self.at(a, b.add(b.mul(i64(r), a_stride), i64(4 * self.lanes * v)))
                b.store(final[r * count + v], b.bitcast(address, self.vector.as_pointer()), align=4)


def quant_block(numba, ahead=AHEAD):  # -> intrinsic qblock(x, codes, scales, c0, a, rows, width, nibbles)
    """A register block over int codes: a[r, j] = the chain s = +0.0, s = fma(x[r, k], w(k, c0 + j), s) for k = 0 ..
    d_in - 1, r < rows and j < width (rows, width, nibbles literal ints; width a multiple of 8), where w(k, n) =
    float32(code) * scale, rounded once: qtiles.py's weights and chain. codes int8 [d_in, >= c0 + width] (nibbles:
    [d_in / 2, ..], the byte 16 * code(k + 1) + code(k) + 8 for k even) and scales float32 [n_groups, >= c0 + width],
    both with unit inner stride; x float32 [>= rows, d_in]; a float32 [>= rows, >= width]. The sums live in rows *
    width / 8 vectors of 8 float32; a group's scales are loaded once, its codes sign-extended, split (nibbles: lo =
    (byte & 15) - 8, hi = byte >> 4) and converted in vector lanes, each weight once for all rows. Each code row also
    asks for the line `ahead` rows on."""
    from numba.core import cgutils

    ints = numba.types.IntegerLiteral

    @numba.extending.intrinsic
    def qblock(typingctx, x, codes, scales, c0, a, rows, width, nibbles):
        if not all(isinstance(t, ints) for t in (rows, width, nibbles)):
            return None
        shape = tuple(t.literal_value for t in (rows, width, nibbles))

        def codegen(context, builder, signature, args):
            x_, codes_, scales_, a_ = (context.make_array(signature.args[i])(context, builder, args[i])
                                       for i in (0, 1, 2, 4))
            strides = [cgutils.unpack_tuple(builder, v.strides, 2) for v in (x_, codes_, scales_, a_)]
            sizes = [cgutils.unpack_tuple(builder, v.shape, 2)[0] for v in (codes_, scales_)]
            column = context.cast(builder, args[3], signature.args[3], numba.types.intp)
            QuantEmitter(builder, LANES_256, ahead).quant_chains(
                (x_.data, strides[0]), (codes_.data, strides[1][0], sizes[0]), (scales_.data, strides[2][0], sizes[1]),
                column, (a_.data, strides[3][0]), shape)
            return context.get_dummy_value()
        return numba.types.void(x, codes, scales, c0, a, rows, width, nibbles), codegen
    return qblock


class QuantEmitter(BlockEmitter):
    """The LLVM IR of quant_block's loops (groups, then the code rows of a group), emitted by `builder` (llvmlite)."""

    def quant_chains(self, x, codes, scales, c0, a, shape):
        """x: (data, byte strides); codes, scales: (data, byte stride between rows, rows) (i64); c0: the first column
        (i64); a: (data, byte stride between rows); shape: (rows, width, nibbles)."""
        ir, b, i64, lanes = self.ir, self.builder, self.i64, self.lanes
        rows, width, nibbles = shape
        count = width // lanes  # sum vectors per row
        zero = ir.Constant(self.vector, [0.0] * lanes)
        per_group = b.sdiv(codes[2], scales[2])
        entry = b.basic_block
        groups, body, latch, done = (b.append_basic_block(f"qblock.{n}") for n in ("group", "k", "latch", "done"))
        b.cbranch(b.and_(b.icmp_signed(">", scales[2], i64(0)), b.icmp_signed(">", per_group, i64(0))), groups, done)
        b.position_at_end(groups)  # a group: its scales, then its code rows
        g = b.phi(i64)
        outer = [b.phi(self.vector) for _ in range(rows * count)]
        scale_row = self.at(scales[0], b.add(b.mul(g, scales[1]), b.mul(c0, i64(4))))
        scale = [self.load(self.at(scale_row, i64(4 * lanes * v)), self.vector) for v in range(count)]
        first = b.mul(g, per_group)
        b.branch(body)
        b.position_at_end(body)
        k = b.phi(i64)
        sums = [b.phi(self.vector) for _ in range(rows * count)]
        added = self.code_row(x, codes, c0, k, scale, sums, shape)
        k_next = b.add(k, i64(1))
        b.cbranch(b.icmp_signed("<", k_next, b.add(first, per_group)), body, latch)
        b.position_at_end(latch)
        g_next = b.add(g, i64(1))
        b.cbranch(b.icmp_signed("<", g_next, scales[2]), groups, done)
        g.add_incoming(i64(0), entry)
        g.add_incoming(g_next, latch)
        k.add_incoming(first, groups)
        k.add_incoming(k_next, body)
        for o, s, new in zip(outer, sums, added):
            o.add_incoming(zero, entry)
            o.add_incoming(new, latch)
            s.add_incoming(o, groups)
            s.add_incoming(new, body)
        b.position_at_end(done)
        final = [b.phi(self.vector) for _ in added]
        for i, (phi, new) in enumerate(zip(final, added)):
            phi.add_incoming(zero, entry)
            phi.add_incoming(new, latch)
            r, v = divmod(i, count)
            address = self.at(a[0], b.add(b.mul(i64(r), a[1]), i64(4 * lanes * v)))
            b.store(phi, b.bitcast(address, self.vector.as_pointer()), align=4)

    def code_row(self, x, codes, c0, k, scale, sums, shape):  # -> the sums after code row k (quant_chains' arguments)
        """Code row k's fmas into `sums` (rows * count vectors): its line `ahead` rows on asked for, each row's x
        broadcast, each code vector sign-extended once, split (nibbles: lo = (byte & 15) - 8, hi = byte >> 4),
        converted and multiplied by its group's `scale`, then fma'd into every row's sums."""
        ir, b, i64, lanes = self.ir, self.builder, self.i64, self.lanes
        rows, width, nibbles = shape
        count = width // lanes
        ints = ir.VectorType(self.i32, lanes)
        splat = lambda v: ir.Constant(ints, [v] * lanes)  # noqa: E731
        row = self.at(codes[0], b.add(b.mul(k, codes[1]), c0))
        for line in range(0, width, 64):
            ahead = b.gep(row, [b.add(b.mul(codes[1], i64(self.ahead)), i64(line))])
            b.call(self.prefetch, [ahead, self.i32(0), self.i32(2), self.i32(1)])
        steps = (b.mul(k, i64(2)), b.add(b.mul(k, i64(2)), i64(1))) if nibbles else (k,)
        xs = [[self.broadcast(self.load(self.at(x[0], b.add(b.mul(i64(r), x[1][0]), b.mul(column, x[1][1]))),
                                        ir.FloatType())) for r in range(rows)] for column in steps]
        codes_at = {}  # v -> its code vector, sign-extended where first used
        # nibbles: the low weights' fmas, then the high ones'; more than two code vectors would then stay live from
        # one to the other (spilled), so each vector's two go back to back instead. Sums' order is the same.
        order = ([(step, v) for v in range(count) for step in range(len(steps))] if count > 2
                 else [(step, v) for step in range(len(steps)) for v in range(count)])
        added = list(sums)
        for step, v in order:
            if v not in codes_at:
                codes_at[v] = b.sext(self.load(self.at(row, i64(lanes * v)), ir.VectorType(ir.IntType(8), lanes)), ints)
            code = codes_at[v]
            if nibbles:  # byte = 16 hi + (lo + 8), hi and lo in -8 .. 7
                code = b.sub(b.and_(code, splat(15)), splat(8)) if step == 0 else b.ashr(code, splat(4))
            w = b.fmul(b.sitofp(code, self.vector), scale[v])
            for r in range(rows):
                added[r * count + v] = b.call(self.fma, [xs[step][r], w, added[r * count + v]])
        return added


def numpy_scratch(rows, cols):  # -> [rows, cols] float32, uninitialised
    return np.empty((rows, cols), dtype=np.float32)


def numpy_fma(a, b, c):  # float32 arrays or scalars, broadcast -> float32: a * b + c rounded once
    """IEEE 754 fusedMultiplyAdd in float32 for finite a, b, c and result, ties to even: a * b is exact in float64,
    TwoSum (Knuth) gives hi + lo == a * b + c exactly, and hi is rounded to float32 unless it sits exactly halfway
    between two float32 values with lo != 0, where lo's side wins. The reference the compiled fma is tested against."""
    a, b, c = (np.asarray(v, dtype=np.float32).astype(np.float64) for v in (a, b, c))
    p = a * b
    hi = p + c
    back = hi - p
    lo = (p - (hi - back)) + (c - back)  # hi + lo == p + c exactly (TwoSum)
    f = hi.astype(np.float32)
    g = np.nextafter(f, np.where(hi > f, np.inf, -np.inf).astype(np.float32))  # f's neighbour on hi's side
    tie = (hi != f) & (hi == (f.astype(np.float64) + g) / 2)  # hi exactly halfway between f and g
    toward_g = np.sign(lo) == np.sign(g.astype(np.float64) - f)
    return np.where(tie & (lo != 0) & toward_g, g, f).astype(np.float32)


def numpy_prefetch(a, i, j):  # a hint: nothing to ask for in plain Python
    pass


def numpy_wide_vectors():  # chooses instructions, never values: nothing to do in plain Python
    pass


def numpy_block(x, panels, p, a, rows, group, width, lanes):  # register_block's values, k by k (lanes: unused)
    w = panels[p : p + group].transpose(1, 0, 2).reshape(panels.shape[1], group * width)  # [d_in, group * width]
    s = np.zeros((rows, group * width), dtype=np.float32)
    for k in range(w.shape[0]):
        s = numpy_fma(x[:rows, k, None], w[k], s)
    a[:rows, : group * width] = s


def numpy_qblock(x, codes, scales, c0, a, rows, width, nibbles):  # quant_block's values, k by k
    columns = slice(c0, c0 + width)
    per_group = codes.shape[0] // scales.shape[0]
    s = np.zeros((rows, width), dtype=np.float32)
    for kk in range(codes.shape[0]):
        scale, code = scales[kk // per_group, columns], codes[kk, columns].astype(np.int32)
        if nibbles:
            pairs = ((x[:rows, 2 * kk], (code & 15) - 8), (x[:rows, 2 * kk + 1], code >> 4))
        else:
            pairs = ((x[:rows, kk], code),)
        for xk, c in pairs:
            s = numpy_fma(xk[:, None], c.astype(np.float32) * scale, s)
    a[:rows, :width] = s

"""The tiles' helpers scratch, fma, prefetch, wide_vectors, block (`names`): numba intrinsics in LLVM IR, or (numba
None) NumPy stand-ins. fma and block round each multiply-add once; the others change no value. Imports numpy (numba,
llvmlite inside the builders). numba's disk cache watches tiles.py and blocks.py only: after editing this file, delete
compiled/__pycache__/*.nb?.
"""

import numpy as np

VECTOR_BITS = 512  # the vector width wide_vectors asks LLVM to prefer
AHEAD = 32  # panel rows a tile or block asks the CPU to fetch ahead of the row it multiplies


def names(numba):  # numba module or None -> {"scratch", "fma", "prefetch", "wide_vectors", "block": callable}
    if numba is None:
        helpers = (numpy_scratch, numpy_fma, numpy_prefetch, numpy_wide_vectors, numpy_block)
    else:
        helpers = (stack_scratch(numba), fused(numba), cache_line(numba), vector_width(numba), register_block(numba))
    return dict(zip(("scratch", "fma", "prefetch", "wide_vectors", "block"), helpers))


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
            xk = self.load(self.at(x, b.add(b.mul(i64(r), x_strides[0]), column)), ir.FloatType())
            lane = b.insert_element(ir.Constant(self.vector, ir.Undefined), xk, i64(0))
            broadcast = b.shuffle_vector(lane, ir.Constant(self.vector, ir.Undefined),
                                         ir.Constant(ir.VectorType(self.i32, self.lanes), [0] * self.lanes))
            added += [b.call(self.fma, [broadcast, w, s]) for w, s in zip(weights, sums[r * count : (r + 1) * count])]
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

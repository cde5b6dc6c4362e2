"""The tiles' helpers scratch, fma, prefetch, wide_vectors (`names`): numba intrinsics in LLVM IR, or (numba None)
NumPy stand-ins. fma rounds once; the others change no value. Imports numpy (numba, llvmlite inside the builders).
numba's disk cache watches tiles.py only: after editing this file, delete compiled/__pycache__/*.nb?.
"""

import numpy as np

VECTOR_BITS = 512  # the vector width wide_vectors asks LLVM to prefer


def names(numba):  # numba module or None -> {"scratch", "fma", "prefetch", "wide_vectors": callable}
    if numba is None:
        helpers = (numpy_scratch, numpy_fma, numpy_prefetch, numpy_wide_vectors)
    else:
        helpers = (stack_scratch(numba), fused(numba), cache_line(numba), vector_width(numba))
    return dict(zip(("scratch", "fma", "prefetch", "wide_vectors"), helpers))


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

"""npspec.testing.usage: the kit's argument checks and its bounds, in one place.

A bad argument to a check is the caller's mistake, not the sampler's: KitUsageError, one line naming the argument
and the fix, before anything runs. Imports nothing of npspec.
"""

import math
from fractions import Fraction

MAX_OUTCOMES = 2 ** 17  # paths an exact enumeration may walk: seconds of Python, at most some 100 MB of outcomes
MAX_UNIFORMS_PER_CALL = 1024  # a call draws 2 * gamma + 1 uniforms at most: past this many it loops
MAX_SAMPLES = 10 ** 7
MIN_SAMPLES = 100
ALPHA_RANGE = (1e-12, 0.05)  # a false-alarm rate of 0 or NaN turns a statistical test off; above 5 % it means little
MAX_TOL = 1e-6  # a larger tolerance lets a wrong rule pass (float64 rounding stays below 1e-15)
MAX_VOCAB = 262_144  # 2**18: above GPT-2's 50,257 and the largest vocabularies in use (256k)


class KitUsageError(TypeError, ValueError):
    """A check was called with a bad argument (a TypeError and a ValueError: either `except` catches it)."""


def _what(value):
    return f"{value!r} (a {type(value).__name__})"


def need_callable(f, name, signature, where):
    """Raise KitUsageError unless f is callable."""
    if not callable(f):
        raise KitUsageError(f"{where}: {name} must be a function {signature}, got {_what(f)}")


def need_int(value, name, where, minimum, maximum=None, why=""):
    """Raise KitUsageError unless value is an int (not a bool) in [minimum, maximum]; returns it as an int."""
    rule = f"an integer >= {minimum}" + (f" and <= {maximum}" if maximum is not None else "") + why
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise KitUsageError(f"{where}: {name} must be {rule}, got {_what(value)}")
    value = int(value.__index__())
    if value < minimum or (maximum is not None and value > maximum):
        raise KitUsageError(f"{where}: {name} must be {rule}, got {value}")
    return value


def need_ints(values, name, where, minimum, maximum=None, why=""):
    """A non-empty sequence of need_int values; returns them as a tuple of ints."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise KitUsageError(f"{where}: {name} must be a non-empty sequence of integers, got {_what(values)}")
    values = tuple(values)
    if not values:
        raise KitUsageError(f"{where}: {name} is empty: nothing would be checked; give at least one value")
    return tuple(need_int(v, f"{name}[{i}]", where, minimum, maximum, why) for i, v in enumerate(values))


def need_real(value, name, where, low, high, why=""):
    """Raise KitUsageError unless value is a finite real number in [low, high]; returns it as a float."""
    rule = f"a number in [{low:g}, {high:g}]{why}"
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)) and not hasattr(value, "__float__"):
        raise KitUsageError(f"{where}: {name} must be {rule}, got {_what(value)}")
    v = float(value)
    if not (math.isfinite(v) and low <= v <= high):
        raise KitUsageError(f"{where}: {name} must be {rule}, got {value!r}")
    return v


def need_alpha(alpha, where):
    """The false-alarm rate of a statistical check, in ALPHA_RANGE: 0 or NaN would turn the tests off."""
    return need_real(alpha, "alpha", where, *ALPHA_RANGE,
                     why=" (0 or NaN would turn the statistical tests off: pass statistical=False to skip them)")


def need_samples(n_samples, where):
    return need_int(n_samples, "n_samples", where, MIN_SAMPLES, MAX_SAMPLES)


def need_row(row, name, where, n_vocab=None):
    """Raise KitUsageError unless row is a probability row: entries finite and >= 0, summing to 1 (exactly for
    Fractions and ints, within 1e-9 for floats), of length n_vocab if given. Returns its length."""
    try:
        values = list(row)
        exact = all(isinstance(v, (Fraction, int)) and not isinstance(v, bool) for v in values)
        floats = [float(v) for v in values]
    except (TypeError, ValueError):
        raise KitUsageError(f"{where}: {name} must be a row of probabilities, got {_what(row)}") from None
    if len(values) < 2 or (n_vocab is not None and len(values) != n_vocab):
        want = f"{n_vocab} entries" if n_vocab is not None else "at least 2 entries"
        raise KitUsageError(f"{where}: {name} must have {want}, got {len(values)}")
    total = sum(values) if exact else math.fsum(floats)
    if not all(math.isfinite(v) and v >= 0 for v in floats) or (total != 1 if exact else abs(total - 1) > 1e-9):
        raise KitUsageError(f"{where}: {name} is not a probability row (entries >= 0 summing to 1): "
                            f"{[str(v) for v in values[:8]]}{' ...' if len(values) > 8 else ''} sums to {total}; "
                            "normalise it")
    return len(values)


def need_bounded(count, what, where, fix):
    """Raise KitUsageError if an enumeration would walk more than MAX_OUTCOMES paths."""
    if count > MAX_OUTCOMES:
        raise KitUsageError(f"{where}: {what} would enumerate about {count:.3g} paths, more than the kit's bound "
                            f"{MAX_OUTCOMES} (npspec.testing.usage.MAX_OUTCOMES); {fix}")


def largest(fits, start=1):
    """The largest integer k >= start - 1 with fits(k), for fits decreasing in k."""
    k = start
    while fits(k):
        k += 1
    return k - 1


class UniformsExhausted(RuntimeError):
    """A sampler drew more than MAX_UNIFORMS_PER_CALL uniforms in one call: it loops."""

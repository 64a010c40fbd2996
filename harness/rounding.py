"""xfalign's own IEEE round-to-nearest-even of float64 values to bfloat16, float16 and float32.

Input bits must depend on nothing installed: ml_dtypes 0.6.0 casts float64 -> bfloat16 through float32
(two roundings), 0.7.0 rounds once. So the rounding is done here, on the bit patterns, with numpy integer
operations; ml_dtypes is only the container of bfloat16 results.

IEEE semantics: ties to the even pattern; results below the least normal are subnormal (a carry out of the
subnormals gives the least normal), and round to ±0 at or below half the least subnormal; a value rounds to
±Inf iff |x| >= 2^(emax+1) - 2^(emax-M-1) (M stored mantissa bits: the midpoint between the largest finite
value, whose pattern is odd, and 2^(emax+1)); ±0 and ±Inf keep their sign. A NaN becomes the canonical quiet
NaN of its sign: exponent all ones, only the top mantissa bit set (bf16 0x7fc0 / 0xffc0, fp16 0x7e00 / 0xfe00,
fp32 0x7fc00000 / 0xffc00000); the payload is dropped.
"""

from __future__ import annotations

import numpy as np

from harness.dtypes import dtype_name, to_numpy_dtype

# name: (exponent bits, stored mantissa bits, unsigned type of the pattern)
_FORMATS: dict[str, tuple[int, int, type[np.unsignedinteger]]] = {
    "bfloat16": (8, 7, np.uint16), "float16": (5, 10, np.uint16), "float32": (8, 23, np.uint32)}
_MANTISSA = 52  # float64's stored mantissa bits
_BIAS = 1023
_EXP_MASK = np.uint64(0x7FF0_0000_0000_0000)  # also the pattern of +Inf: anything above is a NaN
_MAG_MASK = np.uint64(0x7FFF_FFFF_FFFF_FFFF)
_ONE = np.uint64(1)


def round_float64(values: np.ndarray, dtype: np.dtype | str) -> np.ndarray:
    """`values` (as float64: exact for any float input) rounded to nearest-even in `dtype`: "bfloat16",
    "float16", "float32" (or their numpy dtypes); "float64" returns a float64 copy."""
    name = dtype if isinstance(dtype, str) else dtype_name(dtype)
    x = np.ascontiguousarray(values, dtype=np.float64)
    if name == "float64":
        return x.copy()
    exp_bits, mant_bits, uint = _FORMATS[name]
    bias = (1 << (exp_bits - 1)) - 1
    inf = np.uint64((1 << (exp_bits + mant_bits)) - (1 << mant_bits))  # exponent all ones, mantissa 0
    drop = np.uint64(_MANTISSA - mant_bits)  # low mantissa bits a normal result drops
    rebias = np.uint64((_BIAS - bias) << _MANTISSA)
    min_normal = rebias + (_ONE << np.uint64(_MANTISSA))  # the double pattern of the target's least normal

    bits = x.reshape(-1).view(np.uint64)  # flat: the rare values are found by flat index
    # Normal results (nearly every value): the magnitude with its exponent rebiased to the target's, so that
    # the rounding's carry runs on into the exponent field; the largest finite + a carry is exactly Inf.
    n = bits & _MAG_MASK
    n -= rebias  # wraps around below the target's least normal: those are redone below
    # The rest, few: subnormal and zero results (magnitude below the least normal's) and NaNs (above Inf's),
    # i.e. where magnitude - least normal (= n - 2^52; wrapping around below 0) exceeds Inf - least normal.
    rare = np.flatnonzero(n - (_ONE << np.uint64(_MANTISSA)) > _EXP_MASK - min_normal)
    m = n[rare] + rebias  # their magnitudes
    _round_shift(n, drop)
    np.minimum(n, inf, out=n)  # overflow, and ±Inf (whose rebiased exponent is huge) -> Inf
    if rare.size:
        # A subnormal result: the significand with its leading 1 in units of the least subnormal, i.e. shifted
        # right by one bit more per binade below the least normal; a carry out of the mantissa field is
        # exactly the least normal's pattern. Double subnormals and zeros (exponent 0) are far below any
        # target's least subnormal: the shift, clipped to 63, drops all 53 significand bits and gives 0.
        below = int(min_normal >> np.uint64(_MANTISSA)) - (m >> np.uint64(_MANTISSA)).astype(np.int64)
        sub = (m & ((_ONE << np.uint64(_MANTISSA)) - _ONE)) | (_ONE << np.uint64(_MANTISSA))
        _round_shift(sub, np.clip(below + int(drop), 1, 63).astype(np.uint64))  # NaNs (below < 0): replaced next
        sub[m > _EXP_MASK] = inf | (_ONE << np.uint64(mant_bits - 1))  # NaN -> the quiet NaN
        n[rare] = sub
    out = n.astype(uint)
    out |= np.signbit(x.reshape(-1)).astype(uint) << uint(8 * out.itemsize - 1)  # the sign
    return out.view(to_numpy_dtype(name)).reshape(x.shape)


def _round_shift(n: np.ndarray, shift: np.ndarray | np.uint64) -> None:
    """n >>= shift (each >= 1), rounding to nearest, ties to even: add half - 1, and 1 more when the kept
    part is odd, then truncate. No overflow where n < 2^63 (half <= 2^62); the values that wrapped around
    in round_float64 are replaced after."""
    odd = (n >> shift) & _ONE
    n += (_ONE << (shift - _ONE)) - _ONE
    n += odd
    n >>= shift

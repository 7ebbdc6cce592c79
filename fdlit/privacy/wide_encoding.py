"""Encodings for the secure sum (fdlit.privacy.secure_sum) beyond one 64-bit word an entry.

**Wide fixed point.** A term whose entries must keep a relative precision that 62 bits cannot give
(a softmax weight that may be 1 or 1e-30) is scaled by 2^s and split into L limbs of 32 bits,
two's complement modulo 2^(32 L); each limb travels as one uint64 word of the masked vector. The sum
over n < 2^32 clients of one limb stays below n 2^32 < 2^64, so every limb's sum is exact in Z_{2^64}
(the masks cancel there) and the server rebuilds sum_i round(x_i 2^s) modulo 2^(32 L) by carrying
between limbs. With s = 32 L - 1 - ceil(log2(B n)) the sum of n values in [-B, B] never wraps.

**Secure maximum of a level (an OR per level).** To learn max_i k_i of the clients' levels
k_i in {-1, 0, …, K-1} and nothing else, client i sends K words: word j is a uniform non-zero
random word if k_i >= j, else 0 (a thermometer code). The secure sum of word j is uniform and
non-zero (but for a 2^-64 chance) when some client has k_i >= j, and 0 when none has: the server
reads the largest j with a non-zero sum, which is the maximum level (-1: every client sent -1),
and learns no count of clients (Bonawitz et al. 2017 give the sum; the OR from random non-zero
summands is the standard reduction, e.g. Goldreich 2004, Sec. 7.3).
"""

from __future__ import annotations

import math
import secrets

import numpy as np

LIMB_BITS = 32
LIMB = np.uint64(2**LIMB_BITS - 1)


def wide_scale_bits(bound: float, clients: int, limbs: int) -> int:
    """s of the module docstring: n = ``clients`` values in [-bound, bound] summed in ``limbs`` limbs."""
    return LIMB_BITS * limbs - 1 - math.ceil(math.log2(bound * max(clients, 1)))


def _negate(limbs: np.ndarray) -> np.ndarray:
    """Two's complement of rows of limbs (limb 0 lowest), modulo 2^(32 L)."""
    out = (~limbs) & LIMB
    carry = np.ones(len(out), np.uint64)
    for k in range(out.shape[1]):
        t = out[:, k] + carry
        out[:, k], carry = t & LIMB, t >> np.uint64(LIMB_BITS)
    return out


def wide_encode(x: np.ndarray, bound: float, bits: int, limbs: int) -> np.ndarray:
    """x clipped to [-bound, bound], times 2^bits, rounded: ``limbs`` uint64 words an entry (entry-major)."""
    x = np.clip(np.asarray(x, dtype=np.float64).ravel(), -bound, bound)
    a = np.rint(np.ldexp(np.abs(x), bits))  # an integer below 2^(32 L - 1), exact in float64 (x has 53 bits)
    out = np.zeros((len(a), limbs), np.uint64)
    for k in reversed(range(limbs)):  # exact: each quotient is an integer below 2^32, each remainder exact
        q = np.floor(np.ldexp(a, -LIMB_BITS * k))
        out[:, k] = q.astype(np.uint64)
        a = a - np.ldexp(q, LIMB_BITS * k)
    negative = x < 0
    out[negative] = _negate(out[negative])
    return out.reshape(-1)


def wide_decode(total: np.ndarray, bits: int, limbs: int) -> np.ndarray:
    """The float64 values of summed limbs (``wide_encode``'s layout, each limb summed in Z_{2^64})."""
    sums = total.reshape(-1, limbs).astype(np.uint64)
    out = np.zeros_like(sums)
    carry = np.zeros(len(sums), np.uint64)
    for k in range(limbs):  # carry between limbs: the sum modulo 2^(32 L)
        t = sums[:, k] + carry  # < n 2^32 + 2^32: no wrap for n < 2^32 - 1
        out[:, k], carry = t & LIMB, t >> np.uint64(LIMB_BITS)
    negative = out[:, -1] >> np.uint64(LIMB_BITS - 1) == 1
    out[negative] = _negate(out[negative])
    value = np.zeros(len(out))
    for k in reversed(range(limbs)):  # the largest limb first: float64 keeps the leading 53 bits
        value = value + np.ldexp(out[:, k].astype(np.float64), LIMB_BITS * k - bits)
    return np.where(negative, -value, value)


def wide_error(clients: int, bits: int) -> float:
    """The largest distance between a decoded wide sum of ``clients`` values and the exact sum
    (rounding of each value, plus float64's rounding of the result, below it for these sizes)."""
    return clients * 2.0 ** -(bits + 1)


def level_words(levels: np.ndarray, count: int) -> np.ndarray:
    """A client's thermometer code of its ``levels`` (one per entry, in -1 … count-1): ``count`` words an
    entry, word j uniform non-zero where level >= j, else 0 (entry-major)."""
    levels = np.asarray(levels, dtype=np.int64).ravel()
    on = np.arange(count)[None, :] <= levels[:, None]
    noise = np.frombuffer(secrets.token_bytes(8 * on.size), dtype=np.uint64).reshape(on.shape)
    noise = np.where(noise == 0, np.uint64(1), noise)  # non-zero
    return np.where(on, noise, np.uint64(0)).reshape(-1)


def maximum_level(total: np.ndarray, count: int) -> np.ndarray:
    """The largest level any client sent, per entry, from the summed thermometer codes (-1: none)."""
    set_ = total.reshape(-1, count) != 0
    return np.where(set_.any(1), count - 1 - np.argmax(set_[:, ::-1], axis=1), -1).astype(np.int64)

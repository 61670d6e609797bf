"""Bounded-memory sets of sample hashes, as plain data (numpy arrays): a Bloom filter of the
recent samples (two generations: "seen among the last ``capacity`` to ``2 capacity``") and a
HyperLogLog distinct count of every sample since a reset.

Written here rather than taken from a library: the samples' keys are MD5 prefixes, hashes
already, so a whole batch is checked and added in one compiled loop, where ``datasketch``
(HyperLogLog only; it has no Bloom filter) hashes and updates one item at a time in Python;
and the state must be plain arrays the run's stored state can hold.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

from steplens.stream_jobs.engine.signals.kernels import jit

_POW = 2.0 ** -np.arange(65, dtype=np.float64)  # 2 ** -rank, for the HyperLogLog's sum
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def keys(hashes: list[str]) -> np.ndarray:
    """Each hash's 64-bit key: its first 16 hex digits (any other text: its MD5), mixed
    (splitmix64's finaliser) so that short or patterned hashes spread too."""
    joined = "".join(hashes)
    raw = None
    if len(joined) == 16 * len(hashes):  # the producer's: 16 hex digits each
        try:
            raw = np.frombuffer(bytes.fromhex(joined), dtype=">u8").astype(np.uint64)
        except ValueError:
            raw = None
    if raw is None:
        raw = np.array([_key(h) for h in hashes], dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = raw ^ (raw >> np.uint64(30))
        z = z * _M1
        z ^= z >> np.uint64(27)
        z = z * _M2
        z ^= z >> np.uint64(31)
    return z


def _key(h: str) -> int:
    try:
        return int(h[:16], 16)
    except ValueError:
        return int.from_bytes(hashlib.md5(h.encode(), usedforsecurity=False).digest()[:8], "big")


@dataclass
class Bloom:
    """Two generations of ``2 ** bits_log2`` bits; ``k`` positions per key (double hashing).
    A key is seen when every position is set in one generation; a full generation (``capacity``
    keys added) becomes the old one and a new one starts."""

    bits_log2: int = 18
    k: int = 7
    capacity: int = 25_000  # keys per generation: about 1 % false positives at 2**18 bits
    new: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    old: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    added: int = 0  # keys added to ``new``

    def seen_then_add(self, ks: np.ndarray) -> np.ndarray:
        """Which of the distinct ``ks`` were seen before; then all are added."""
        size = 1 << (self.bits_log2 - 3)
        if len(self.new) != size:
            self.new, self.old, self.added = np.zeros(size, np.uint8), np.zeros(0, np.uint8), 0
        seen = _bloom(ks, self.new, self.old, self.k, self.bits_log2)
        self.added += len(ks) - int(seen.sum())
        if self.added >= self.capacity:
            self.old, self.new, self.added = self.new, np.zeros(size, np.uint8), 0
        return seen


@jit
def _bloom(ks: np.ndarray, new: np.ndarray, old: np.ndarray, k: int, bits: int) -> np.ndarray:
    """Check each key in both generations, then set its bits in ``new`` (in place)."""
    n = len(ks)
    seen = np.zeros(n, np.bool_)
    mask = (np.uint64(1) << np.uint64(bits)) - np.uint64(1)
    has_old = len(old) == len(new)
    for j in range(n):
        h1 = ks[j] & np.uint64(0xFFFFFFFF)
        h2 = (ks[j] >> np.uint64(32)) | np.uint64(1)
        in_new = True
        in_old = has_old
        for i in range(k):
            pos = (h1 + np.uint64(i) * h2) & mask
            byte = np.int64(pos >> np.uint64(3))
            bit = np.uint8(1) << np.uint8(pos & np.uint64(7))
            if new[byte] & bit == 0:
                in_new = False
            if in_old and old[byte] & bit == 0:
                in_old = False
            new[byte] |= bit
        seen[j] = in_new or in_old
    return seen


@dataclass
class Distinct:
    """HyperLogLog with ``2 ** p`` registers: about ``1.04 / sqrt(2 ** p)`` relative error
    (0.8 % at p = 14), linear counting while few registers are set."""

    p: int = 14
    registers: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))

    def add(self, ks: np.ndarray) -> None:
        m = 1 << self.p
        if len(self.registers) != m:
            self.registers = np.zeros(m, np.uint8)
        _hll_add(ks, self.registers, self.p)

    def count(self) -> float:
        m = 1 << self.p
        if len(self.registers) != m:
            return 0.0
        inverse, zeros = _hll_sums(self.registers)
        est = 0.7213 / (1.0 + 1.079 / m) * m * m / inverse
        if est <= 2.5 * m and zeros:
            return m * math.log(m / zeros)
        return est


@jit
def _hll_add(ks: np.ndarray, registers: np.ndarray, p: int) -> None:
    """Each key: its register (its top ``p`` bits) keeps the largest rank (the leading zeros
    of the other bits, plus one)."""
    width = 64 - p
    for j in range(len(ks)):
        idx = np.int64(ks[j] >> np.uint64(width))
        rest = ks[j] << np.uint64(p)
        rank = 1
        while rank <= width and rest & np.uint64(0x8000000000000000) == 0:
            rank += 1
            rest = rest << np.uint64(1)
        registers[idx] = max(registers[idx], rank)


@jit
def _hll_sums(registers: np.ndarray) -> tuple[float, int]:
    """The sum of ``2 ** -register`` and the count of empty registers."""
    total = 0.0
    zeros = 0
    for r in registers:
        total += _POW[r]
        if r == 0:
            zeros += 1
    return total, zeros


def warm_up_kernel() -> None:
    ks = keys(["0123456789abcdef", "fedcba9876543210"])
    Bloom().seen_then_add(ks)
    d = Distinct()
    d.add(ks)
    d.count()

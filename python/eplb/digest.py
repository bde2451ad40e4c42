"""eplb's device digest ("eplb-dev64"): a 64-bit digest of a row's bytes, computed where the row
lives (CPU or CUDA) with torch integer ops, identical on every device for the same bytes.

Contract:
- The row's n bytes, zero-padded to a multiple of 4, are read as little-endian uint32 words w_i;
  acc = sum_i w_i * k_i mod 2**64 with the odd multipliers k_i = (2i + 1) * 0x9E3779B97F4A7C15
  mod 2**64; the digest is fmix64(acc ^ (n * 0xC2B2AE3D27D4EB4F mod 2**64)) (MurmurHash3's
  finalizer). Integer addition modulo 2**64 does not depend on the order of the terms, so every
  reduction order, device and chunking gives the same value; a change of one word always changes
  acc (k_i is odd, so invertible modulo 2**64), and words trade places only at other multipliers.
- `digest_rows(rows)`: the digest of every row of a [rows, n] uint8 tensor (any device), as
  Python ints. On a device, torch integer ops (nothing but the [rows] accumulators is copied to the
  host; work memory is bounded: the words are processed in chunks); on the CPU the library's C++
  loop over the same arithmetic (eplb._eplb.dev64_digests, several GB/s), pinned to the same
  known answers.
- `reference_digest(data)`: the same in plain Python over bytes, for known-answer tests.
- It detects corruption in transit and at rest; it is not cryptographic.
"""
from __future__ import annotations

__all__ = ["KIND", "digest_rows", "digest_selected", "digest_rows_with_torch", "reference_digest", "fmix64"]

KIND = "eplb-dev64"
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_LENGTH_SALT = 0xC2B2AE3D27D4EB4F
_CHUNK_WORDS = 1 << 20  # words per chunk: [rows, chunk] int64 of work memory at most
_multipliers: dict = {}


def fmix64(value: int) -> int:
    """MurmurHash3's 64-bit finalizer (on Python ints, modulo 2**64)."""
    value &= _MASK
    value ^= value >> 33
    value = (value * 0xFF51AFD7ED558CCD) & _MASK
    value ^= value >> 33
    value = (value * 0xC4CEB9FE1A85EC53) & _MASK
    value ^= value >> 33
    return value


def _multipliers_for(start: int, count: int, device):
    """k_i for i in [start, start + count) as an int64 tensor on `device` (two's complement), cached."""
    import numpy as np
    import torch

    key = (start, count, str(device))
    found = _multipliers.get(key)
    if found is None:
        index = np.arange(start, start + count, dtype=np.uint64)
        with np.errstate(over="ignore"):
            values = (index * np.uint64(2) + np.uint64(1)) * np.uint64(_GOLDEN)
        found = torch.from_numpy(values.view(np.int64)).to(device)
        if len(_multipliers) > 64:
            _multipliers.clear()
        _multipliers[key] = found
    return found


def digest_rows(rows) -> list[int]:
    """The digest of every row of `rows` ([count, n] uint8 tensor, any device)."""
    import torch

    if rows.dtype != torch.uint8 or rows.dim() != 2:
        raise ValueError(f"digest_rows takes a [rows, bytes] uint8 tensor, got {rows.dtype} of shape "
                         f"{tuple(rows.shape)}")
    count, length = rows.shape
    if count == 0:
        return []
    if rows.device.type == "cpu" and rows.stride(1) == 1:
        from eplb import _eplb

        base, stride = rows.data_ptr(), rows.stride(0)
        return _eplb.dev64_digests([base + i * stride for i in range(count)], length)
    return digest_rows_with_torch(rows)


def digest_selected(view, slots, index=None) -> list[int]:
    """The digests of rows `slots` of a [rows, n] uint8 view: read in place on the CPU, gathered
    (index_select with `index`, or one made from `slots`) on a device."""
    import torch

    if view.device.type == "cpu" and view.stride(1) == 1:
        from eplb import _eplb

        base, stride = view.data_ptr(), view.stride(0)
        return _eplb.dev64_digests([base + slot * stride for slot in slots], view.shape[1])
    if index is None:
        index = torch.tensor(slots, device=view.device)
    return digest_rows(view.index_select(0, index))


def digest_rows_with_torch(rows) -> list[int]:
    """digest_rows with torch integer ops, whatever the device (what runs on CUDA)."""
    import torch

    count, length = rows.shape
    if length == 0:  # no words (and a [count, 0] tensor has no int32 view): acc = 0, salt = 0
        return [fmix64(0)] * count
    padded = rows
    if length % 4:
        padded = torch.nn.functional.pad(rows, (0, 4 - length % 4))
    padded = padded.contiguous()
    words = padded.view(torch.int32)  # little-endian on every platform torch runs on
    total = torch.zeros(count, dtype=torch.int64, device=rows.device)
    for start in range(0, words.shape[1], _CHUNK_WORDS):
        part = words[:, start:start + _CHUNK_WORDS].to(torch.int64) & 0xFFFFFFFF
        total += (part * _multipliers_for(start, part.shape[1], rows.device)).sum(dim=1)
    salt = (length * _LENGTH_SALT) & _MASK
    return [fmix64((acc & _MASK) ^ salt) for acc in total.tolist()]


def reference_digest(data: bytes) -> int:
    """The digest of `data` in plain Python (slow; for known-answer tests)."""
    padded = bytes(data) + b"\0" * (-len(data) % 4)
    acc = 0
    for i in range(len(padded) // 4):
        word = int.from_bytes(padded[4 * i:4 * i + 4], "little")
        acc = (acc + word * (((2 * i + 1) * _GOLDEN) & _MASK)) & _MASK
    return fmix64(acc ^ ((len(data) * _LENGTH_SALT) & _MASK))

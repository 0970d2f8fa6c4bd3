"""Counter-based sampling noise: a row's draw is a pure function of (its key, the position).

A torch generator cannot be captured per row in a CUDA graph, and one shared
generator makes a seeded request's draw depend on what else is in the batch.
Here each row carries a 64-bit key on the device (`row_key`: a hash of the
request's seed, or a random one for unseeded requests), and the noise of the
token drawn after position `pos` is an integer hash of (key, pos, token id),
made uniform in (0, 1) and then exponential. The same ops run eagerly and
inside a graph, and on any row of any batch, so a seeded request draws the
same tokens alone, in a batch, replayed or not. (It replaced a torch generator
per seeded row, reseeded by (seed, output index) on the host each step: the
tokens a given seed draws changed then; that a seed repeats its tokens did not.)

All arithmetic is int64 holding 32-bit words: every product is a word times
a constant below 2**31, so nothing overflows and the bits are the same on
every device. The mixer is a two-round xor-shift-multiply hash (constants
from Chris Wellons' hash-prospector, bias ~0.1).
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_C1, _C2 = 0x21F0AAAD, 0x735A2D97  # both < 2**31: a 32-bit word times one stays below 2**63
_KEY_MIX = 0x9E3779B97F4A7C15
_INV24 = 1.0 / (1 << 24)


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit hash of each entry of `x` (int64, values in [0, 2**32))."""
    x = x ^ (x >> 16)
    x = (x * _C1) & _M32
    x = x ^ (x >> 15)
    x = (x * _C2) & _M32
    return x ^ (x >> 15)


def row_key(seed: int) -> int:
    """The 62-bit key of a request's seed (any Python int, negative or huge)."""
    h = (seed * _KEY_MIX) & 0xFFFFFFFFFFFFFFFF
    return (h ^ (h >> 31) ^ (seed >> 64)) & 0x3FFFFFFFFFFFFFFF


def column_keys(vocab_size: int, device: torch.device) -> torch.Tensor:
    """[vocab] int64: each token id's word, xored with the row's word before the last mix.
    Hashed ids (not ids) so two rows' streams share no shifted run of values."""
    ids = torch.arange(vocab_size, dtype=torch.int64, device=device)
    return mix32((ids * _C2 + 0x5BD1E995) & _M32)


def step_words(keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[n] int64 32-bit words of each row's draw after `positions` (`keys` [n] from `row_key`)."""
    lo, hi = keys & _M32, (keys >> 32) & _M32
    return mix32(lo ^ mix32(hi ^ mix32(positions & _M32)))


def exponential_noise(words: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """[n, vocab] float32 Exp(1) noise from `step_words` [n] and `column_keys` [vocab]."""
    x = mix32(words[:, None] ^ columns[None, :])
    # 24 bits, centred in their bucket: u in (0, 1), never 0 or 1, exact in float32.
    u = ((x >> 8).float() + 0.5) * _INV24
    return -torch.log(u)

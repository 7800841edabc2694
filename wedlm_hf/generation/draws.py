"""Random numbers keyed on a row, not drawn from a shared stream: a number is a hash of (the row's key, the row's
own forward number, what it is for, its index), so a row's draws are the same whatever rows decode beside it, in
any order, with no per-row generator to carry, join or select (continuous batching). SplitMix64's finaliser
(Steele, Lea and Flood 2014) mixes the key, in int64 arithmetic that wraps as uint64 would.
"""

import torch

_GOLDEN = 0x9E3779B97F4A7C15 - 2**64
_MIX = (0xBF58476D1CE4E5B9 - 2**64, 0x94D049BB133111EB - 2**64)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's `>>` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser."""
    x = (x ^ _shift_right(x, 30)) * _MIX[0]
    x = (x ^ _shift_right(x, 27)) * _MIX[1]
    return x ^ _shift_right(x, 31)


def row_key(seed: int) -> int:
    """The key a request seeded with `seed` samples with: the first draw of a generator seeded with it, so a
    one-row `generate()` after `torch.manual_seed(seed)` (which draws its row's key from the global generator)
    samples the same tokens."""
    return draw_key(torch.Generator().manual_seed(seed))


def draw_key(generator: torch.Generator | None = None) -> int:
    return int(torch.randint(-(2**62), 2**62, (), generator=generator))


def keyed_uniforms(keys: torch.Tensor, forward: torch.Tensor, purpose: int, index: torch.Tensor) -> torch.Tensor:
    """(n, m) numbers in (0, 1), each a function of (`keys` (n,), the row's forward number `forward` (n,),
    `purpose`, its `index` (n, m) or (m,): a slot, a position) and nothing else."""
    base = _mix(keys + _GOLDEN * (forward * 4 + purpose + 1))
    bits = _shift_right(_mix(base[:, None] + _GOLDEN * (index + 1)), 40)  # 24 random bits: exact in float32
    return (bits.float() + 0.5) / 2**24


def draw(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws: per (row, position) the first token whose cumulative probability reaches `uniform`
    times the total (a token of probability 0 is never drawn, as `uniform` > 0)."""
    cumulative = probs.cumsum(-1)
    target = uniform * cumulative[..., -1]
    return (cumulative < target[..., None]).sum(-1).clamp(max=probs.shape[-1] - 1)

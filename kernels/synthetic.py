"""A DiT-like attention problem without weights: smooth fields on a token grid plus 3D (or 2D) RoPE.

Real video/image DiT activations are spatially smooth and their attention is local in (F, H, W) through
RoPE; random Gaussian q/k/v have neither property, so they say nothing about which approximation is
better. This generator gives both: a shared per-head direction (so RoPE makes q.k peak at small
spatial offsets), low-frequency fields (so neighbouring blocks have similar means) and a little noise.
Used by the tests, the demo (`bench/demo.py`) and the benchmarks.
"""
from __future__ import annotations

import math

import torch


def _rope_angles(grid, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """[T, D/2] rotation angles: the D/2 frequency pairs split between the grid axes (like Wan's 3D RoPE)."""
    nd = len(grid)
    half = head_dim // 2
    # like Wan: the time axis gets fewer pairs, the spatial axes share the rest
    sizes = [half // nd] * nd
    sizes[-1] += half - sum(sizes)
    coords = torch.meshgrid(*[torch.arange(n, dtype=torch.float64) for n in grid], indexing="ij")
    parts = []
    for axis, npairs in enumerate(sizes):
        freqs = base ** (-torch.arange(npairs, dtype=torch.float64) / max(npairs, 1))
        parts.append(coords[axis].reshape(-1, 1) * freqs[None, :])
    return torch.cat(parts, dim=1)


def _apply_rope(x: torch.Tensor, ang: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = torch.cos(ang), torch.sin(ang)
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x1 * s + x2 * c
    return out


def dit_like_qkv(grid=(8, 16, 16), *, heads: int = 2, head_dim: int = 64, batch: int = 1, n_prefix: int = 0,
                 sharpness: float = 1.0, noise: float = 0.3, n_waves: int = 12, content: float = 1.0,
                 v_offset: float = 1.0, seed: int = 0,
                 dtype=torch.float32, device="cpu"):
    """q, k, v [batch, heads, n_prefix + prod(grid), head_dim] in raster order of `grid`.

    `sharpness` scales the shared q/k direction that RoPE turns into a local (spatial) preference; `content`
    scales the smooth q/k fields that give broad, content-based attention; `v_offset` is the size of the
    per-channel value offset.
    Prefix tokens (like FLUX text) get unstructured content and no RoPE.
    """
    g = torch.Generator().manual_seed(seed)
    T_grid = math.prod(grid)
    coords = torch.meshgrid(*[torch.arange(n, dtype=torch.float64) / n for n in grid], indexing="ij")
    pos = torch.stack([c.reshape(-1) for c in coords], dim=1)  # [T, nd] in [0, 1)
    nd = len(grid)

    def field(nchan):
        # sum of random low-frequency plane waves, projected to nchan channels
        omega = torch.randint(0, 3, (n_waves, nd), generator=g).double() * 2 * math.pi
        phase = torch.rand(n_waves, generator=g, dtype=torch.float64) * 2 * math.pi
        waves = torch.cos(pos @ omega.T + phase)  # [T, n_waves]
        proj = torch.randn(batch * heads, n_waves, nchan, generator=g, dtype=torch.float64) / math.sqrt(n_waves)
        return (waves[None] @ proj).reshape(batch, heads, T_grid, nchan)

    shared = torch.randn(batch, heads, 1, head_dim, generator=g, dtype=torch.float64)
    shared = shared / shared.norm(dim=-1, keepdim=True) * math.sqrt(head_dim) * sharpness ** 0.5
    ang = _rope_angles(grid, head_dim)
    outs = []
    for role in ("q", "k", "v"):
        x = field(head_dim) + noise * torch.randn(batch, heads, T_grid, head_dim, generator=g, dtype=torch.float64)
        if role != "v":
            x = _apply_rope(content * x + shared, ang)
        else:
            # real value projections carry a per-channel offset (bias); without it a broad attention
            # output averages to ~0 and every relative error looks huge
            x = x + v_offset * torch.randn(batch, heads, 1, head_dim, generator=g, dtype=torch.float64)
        if n_prefix:
            pre = torch.randn(batch, heads, n_prefix, head_dim, generator=g, dtype=torch.float64)
            x = torch.cat([pre, x], dim=2)
        outs.append(x.to(device=device, dtype=dtype))
    return tuple(outs)

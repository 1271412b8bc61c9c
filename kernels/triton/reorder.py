"""Morton reorder as one Triton gather (or scatter) pass over [B, H, T, D]: rows move, the prefix stays.

gather:  out[..., n_prefix + p, :] = x[..., n_prefix + perm[p], :]
scatter: out[..., n_prefix + perm[p], :] = x[..., n_prefix + p, :]     (the inverse of gather with perm)
Rows are D contiguous elements (16-byte vector loads); any batch/head/token strides in, contiguous out.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..dispatch import on_device


@triton.jit
def _permute_rows_kernel(
    X, Y, PERM,
    sx_b, sx_h, sx_t, sy_b, sy_h, sy_t,
    H, T, n_prefix,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr, SCATTER: tl.constexpr,
):
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    o_t = i_t * BLOCK_T + tl.arange(0, BLOCK_T)
    o_d = tl.arange(0, BLOCK_D)
    m_t = o_t < T
    m_p = m_t & (o_t >= n_prefix)
    o_p = tl.load(PERM + (o_t - n_prefix), mask=m_p, other=0).to(tl.int64)
    o_o = tl.where(m_p, n_prefix + o_p, o_t.to(tl.int64))
    m = m_t[:, None] & (o_d < D)[None, :]
    if SCATTER:
        o_src = o_t.to(tl.int64)
        o_dst = o_o
    else:
        o_src = o_o
        o_dst = o_t.to(tl.int64)
    b_x = tl.load(X + i_b * sx_b + i_h * sx_h + o_src[:, None] * sx_t + o_d[None, :], mask=m)
    tl.store(Y + i_b * sy_b + i_h * sy_h + o_dst[:, None] * sy_t + o_d[None, :], b_x, mask=m)


def _permute(x: torch.Tensor, perm: torch.Tensor, n_prefix: int, scatter: bool,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """The gather (or scatter) into a new contiguous [B, H, T, D] tensor, or into `out` (x's shape and dtype,
    any strides with a unit last one: e.g. the caller's [B, L, H, D] memory seen as [B, H, L, D])."""
    if x.dim() != 4:
        raise ValueError(f"expected [B, H, T, D], got shape {tuple(x.shape)}")
    B, H, T, D = x.shape
    if perm.numel() != T - n_prefix:
        raise ValueError(f"perm has {perm.numel()} entries, expected T - n_prefix = {T - n_prefix}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    perm = perm.to(device=x.device)
    if out is not None:
        if out.shape != x.shape or out.dtype != x.dtype or out.stride(-1) != 1:
            raise ValueError("out must have x's shape and dtype and a unit last stride")
        y = out
    else:
        y = torch.empty(B, H, T, D, device=x.device, dtype=x.dtype)
    block_d = triton.next_power_of_2(D)
    block_t = max(1, 4096 // block_d)
    grid = (triton.cdiv(T, block_t), B * H)
    with on_device(x):
        _permute_rows_kernel[grid](
            x, y, perm, x.stride(0), x.stride(1), x.stride(2), y.stride(0), y.stride(1), y.stride(2),
            H, T, n_prefix, D=D, BLOCK_D=block_d, BLOCK_T=block_t, SCATTER=scatter, num_warps=4,
        )
    return y


def gather_tokens(x: torch.Tensor, perm: torch.Tensor, n_prefix: int = 0) -> torch.Tensor:
    """out[..., n_prefix + p, :] = x[..., n_prefix + perm[p], :]; same result as kernels.reorder.apply_reorder."""
    return _permute(x, perm, n_prefix, scatter=False)


def scatter_tokens(x: torch.Tensor, perm: torch.Tensor, n_prefix: int = 0) -> torch.Tensor:
    """out[..., n_prefix + perm[p], :] = x[..., n_prefix + p, :]; undoes gather_tokens(., perm, n_prefix)."""
    return _permute(x, perm, n_prefix, scatter=True)

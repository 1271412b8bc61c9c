"""The output layouts the operator can return (kernels.api's out_layout): q's, or memory in [B, T, H, D] order seen
as [B, H, T, D], so that `out.transpose(1, 2).reshape(B, T, H * D)` - the [B, T, H*D] ComfyUI's attention functions
return - is a view instead of a copy (bench/results/pieces_h200.md: at FLUX.1 1024^2 that copy is 28 MiB read and
written per call)."""
from __future__ import annotations

import torch


def bthd_empty(shape, device, dtype) -> torch.Tensor:
    """An uninitialised [B, H, T, D] tensor whose memory is in [B, T, H, D] order."""
    B, H, T, D = shape
    return torch.empty((B, T, H, D), device=device, dtype=dtype).transpose(1, 2)


def is_bthd(x: torch.Tensor) -> bool:
    """Whether x [B, H, T, D] is dense with its memory in [B, T, H, D] order (sizes of 1 take any stride)."""
    B, H, T, D = x.shape
    return (x.stride(3) == 1 or D == 1) and (H == 1 or x.stride(1) == D) and (T == 1 or x.stride(2) == H * D) and (
        B == 1 or x.stride(0) == T * H * D)


def in_layout(x: torch.Tensor, bthd: bool) -> torch.Tensor:
    """x itself, or (bthd, x not in that order) a copy with its memory in [B, T, H, D] order."""
    if not bthd or is_bthd(x):
        return x
    return bthd_empty(x.shape, x.device, x.dtype).copy_(x)

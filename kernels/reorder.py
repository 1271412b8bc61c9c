"""Morton (Z-order) token reorder: each block of 64 consecutive tokens becomes a compact 4x4x4 (or 8x8)
neighbourhood of the token grid, so the diagonal band means spatial neighbours.

Works for any grid size: Morton codes are computed for every real cell and sorted, so cells outside a
non-power-of-two grid simply do not exist. Prefix tokens (e.g. FLUX text) stay in front, untouched.
"""
from __future__ import annotations

import functools
import math
import threading

import torch

from .config import as_grid

_lock = threading.Lock()
_device_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _check_grid(grid) -> tuple[int, ...]:
    return as_grid(grid)  # 2 or 3 positive integers, else a ValueError naming grid


@functools.lru_cache(maxsize=64)
@torch.inference_mode(False)  # cached: never inference tensors (orders_on)
def _morton_cpu(grid: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    coords = torch.meshgrid(*[torch.arange(n, dtype=torch.int64) for n in grid], indexing="ij")
    coords = [c.reshape(-1) for c in coords]
    nbits = max(max(n - 1, 1).bit_length() for n in grid)
    code = torch.zeros_like(coords[0])
    nd = len(grid)
    for b in range(nbits):
        for d, c in enumerate(coords):
            # the last axis (W) takes the lowest bit of each triple, so a block runs along W first
            code |= ((c >> b) & 1) << (b * nd + (nd - 1 - d))
    perm = torch.argsort(code, stable=True)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel())
    return perm, inv


def morton_order(grid) -> torch.Tensor:
    """perm with perm[new_position] = raster index of the token placed there (int64, CPU, cached)."""
    return _morton_cpu(_check_grid(grid))[0]


def inverse_order(grid) -> torch.Tensor:
    """inv with inv[raster_index] = new position; x_reordered[..., inv, :] restores raster order."""
    return _morton_cpu(_check_grid(grid))[1]


def orders_on(grid, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(perm, inv) on `device`, computed once per (grid, device)."""
    key = (_check_grid(grid), str(device))
    hit = _device_cache.get(key)
    if hit is None:
        # cached for the process: never inference tensors (a first call under ComfyUI's inference_mode would
        # otherwise break every later call that autograd records, e.g. LoRA training in the same process)
        with _lock, torch.inference_mode(False):
            perm, inv = _morton_cpu(key[0])
            hit = (perm.to(device, copy=True), inv.to(device, copy=True))
            _device_cache[key] = hit
    return hit


_full_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def full_order(perm: torch.Tensor, n_prefix: int) -> torch.Tensor:
    """int32 [n_prefix + len(perm)] on perm's device: the identity over the prefix, then n_prefix + perm (the row of
    the caller's tensor that each block-order position reads; the form the Triton kernels take). Cached for the
    permutations `orders_on` hands out: they live as long as the process, so a CUDA graph that captured the cached
    tensor can rely on it, and a call saves the 5 small kernels that build it. Computed anew for any other perm and
    under a stream capture (where it would come from the graph's private pool)."""
    key = (perm.data_ptr(), perm.numel(), int(n_prefix), str(perm.device))
    hit = _full_cache.get(key)
    if hit is not None and hit[0] is perm:
        return hit[1]
    with torch.inference_mode(False):  # cached below: a normal tensor (orders_on)
        full = torch.empty(n_prefix + perm.numel(), dtype=torch.int32, device=perm.device)
        if n_prefix:
            full[:n_prefix] = torch.arange(n_prefix, dtype=torch.int32, device=perm.device)
        full[n_prefix:] = perm.to(dtype=torch.int32) + n_prefix
    capturing = perm.is_cuda and torch.cuda.is_current_stream_capturing()
    if not capturing and any(v[0] is perm for v in list(_device_cache.values())):
        with _lock:
            _full_cache[key] = (perm, full)
    return full


def apply_reorder(x: torch.Tensor, perm: torch.Tensor, n_prefix: int = 0) -> torch.Tensor:
    """Permute the tokens after the prefix along dim -2 of [B, H, T, D]: out[p] = x[n_prefix + perm[p]]."""
    if n_prefix == 0:
        return x.index_select(-2, perm)
    return torch.cat([x[..., :n_prefix, :], x[..., n_prefix:, :].index_select(-2, perm)], dim=-2)


def undo_reorder(x: torch.Tensor, inv: torch.Tensor, n_prefix: int = 0) -> torch.Tensor:
    return apply_reorder(x, inv, n_prefix)


_front_orders: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def front_order(n_prefix: int, grid, n_suffix: int, morton: bool, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(perm, inv) over all T = n_prefix + prod(grid) + n_suffix tokens: x[..., perm, :] puts the prefix, then
    the suffix, then the grid tokens (Morton order when `morton`) in a row; y[..., inv, :] undoes it. Exact tokens
    behind the grid (text last, pads) then sit in front as sink blocks. Cached per (layout, device)."""
    grid = tuple(int(g) for g in grid)
    key = (int(n_prefix), grid, int(n_suffix), bool(morton), str(device))
    hit = _front_orders.get(key)
    if hit is None:
        n_grid = math.prod(grid)
        inner = morton_order(grid) if morton else torch.arange(n_grid)
        perm = torch.cat([torch.arange(n_prefix), torch.arange(n_prefix + n_grid, n_prefix + n_grid + n_suffix),
                          n_prefix + inner])
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel())
        with _lock:
            if len(_front_orders) > 64:
                _front_orders.clear()
            hit = _front_orders[key] = (perm.to(device), inv.to(device))
    return hit

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

from .config import as_grid, env_switch

_lock = threading.Lock()
_device_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _check_grid(grid) -> tuple[int, ...]:
    return as_grid(grid)  # 2 or 3 positive integers, else a ValueError naming grid


# PSA_MORTON_CUBES (off: session 35 on an H100, the cube path 6.7% / 2.6% slower than Morton at 480p / 720p as the node
# calls it, at 0.81x q of peak against 1.74x; bench/results/pieces_h200.md, Session 35): a 3-D grid's "morton" order
# becomes the cube order (cube_split), the same for every backend; the CuTe pair kernel then reads the interior cubes
# straight from the caller's layout
MORTON_CUBES = False


def cubes_enabled() -> bool:
    return env_switch("PSA_MORTON_CUBES", MORTON_CUBES)


def cube_split(grid) -> tuple[int, ...] | None:
    """(Wc, Hc, Fc): the whole 4 x 4 x 4 cubes along W, H and F of a 3-D grid (F, H, W), or None (a 2-D grid, or
    no whole cube)."""
    g = _check_grid(grid)
    if len(g) != 3 or min(g) < 4:
        return None
    return g[2] // 4, g[1] // 4, g[0] // 4


@functools.lru_cache(maxsize=64)
@torch.inference_mode(False)
def _cube_cpu(grid: tuple[int, ...]) -> torch.Tensor:
    """The cube order of a 3-D grid: first every whole 4 x 4 x 4 cube of the interior [4 Fc, 4 Hc, 4 Wc] (cubes in
    raster order, W fastest; raster order inside a cube, w fastest), so block b < Fc Hc Wc is exactly cube b,
    one 5-D TMA box of the caller's raster layout; then the tokens outside those cubes in Morton order."""
    gf, gh, gw = grid
    wc, hc, fc = cube_split(grid)
    r = torch.arange(gf * gh * gw, dtype=torch.int64).reshape(gf, gh, gw)
    inner = r[:4 * fc, :4 * hc, :4 * wc].reshape(fc, 4, hc, 4, wc, 4).permute(0, 2, 4, 1, 3, 5).reshape(-1)
    rest = torch.ones(gf, gh, gw, dtype=torch.bool)
    rest[:4 * fc, :4 * hc, :4 * wc] = False
    morton = _morton_codes_order(grid)
    return torch.cat([inner, morton[rest.reshape(-1)[morton]]])


def cube_blocks(grid, block_size: int = 64) -> int:
    """How many leading blocks of the (cube) order are whole cubes: 0 unless the cube order is on
    (PSA_MORTON_CUBES), the grid is 3-D with a whole cube and blocks are 64 tokens."""
    if block_size != 64 or not cubes_enabled():
        return 0
    s = cube_split(grid)
    return 0 if s is None else s[0] * s[1] * s[2]


@torch.inference_mode(False)
def _morton_codes_order(grid: tuple[int, ...]) -> torch.Tensor:
    coords = torch.meshgrid(*[torch.arange(n, dtype=torch.int64) for n in grid], indexing="ij")
    coords = [c.reshape(-1) for c in coords]
    nbits = max(max(n - 1, 1).bit_length() for n in grid)
    code = torch.zeros_like(coords[0])
    nd = len(grid)
    for b in range(nbits):
        for d, c in enumerate(coords):
            # the last axis (W) takes the lowest bit of each triple, so a block runs along W first
            code |= ((c >> b) & 1) << (b * nd + (nd - 1 - d))
    return torch.argsort(code, stable=True)


@functools.lru_cache(maxsize=64)
@torch.inference_mode(False)  # cached: never inference tensors (orders_on)
def _morton_cpu(grid: tuple[int, ...], cubes: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    perm = _cube_cpu(grid) if cubes and cube_split(grid) is not None else _morton_codes_order(grid)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel())
    return perm, inv


def morton_order(grid) -> torch.Tensor:
    """perm with perm[new_position] = raster index of the token placed there (int64, CPU, cached); the cube order
    (_cube_cpu) for a 3-D grid under PSA_MORTON_CUBES."""
    return _morton_cpu(_check_grid(grid), cubes_enabled())[0]


def inverse_order(grid) -> torch.Tensor:
    """inv with inv[raster_index] = new position; x_reordered[..., inv, :] restores raster order."""
    return _morton_cpu(_check_grid(grid), cubes_enabled())[1]


def orders_on(grid, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(perm, inv) on `device`, computed once per (grid, device)."""
    key = (_check_grid(grid), str(device), cubes_enabled())
    hit = _device_cache.get(key)
    if hit is None:
        # cached for the process: never inference tensors (a first call under ComfyUI's inference_mode would
        # otherwise break every later call that autograd records, e.g. LoRA training in the same process)
        with _lock, torch.inference_mode(False):
            perm, inv = _morton_cpu(key[0], key[2])
            hit = (perm.to(device, copy=True), inv.to(device, copy=True))
            _device_cache[key] = hit
    return hit


def cube_layout(perm: torch.Tensor) -> tuple[tuple[int, ...], int] | None:
    """(grid, whole-cube blocks) when `perm` is a cube order that orders_on handed out (PSA_MORTON_CUBES on), else
    None: how a backend that got only the permutation learns that its first blocks are cubes of the grid."""
    for (grid, _, cubes), (p, _) in list(_device_cache.items()):
        if cubes and p.data_ptr() == perm.data_ptr() and p.numel() == perm.numel() and p.device == perm.device:
            n = cube_blocks(grid)
            return (grid, n) if n else None
    return None


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
    key = (int(n_prefix), grid, int(n_suffix), bool(morton), str(device), cubes_enabled())
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

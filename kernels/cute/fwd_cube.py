"""The cube order's Morton path without copies of its interior (PSA_MORTON_CUBES, PSA_CUTE_CUBE_VIEW), SM90.

Today's Morton path writes block-order copies of q, k and v (1 GB at Wan2.1-14B 480p, 1.74x q of scratch) so that
every 64-token block is one TMA box. The cube order (kernels/reorder.py _cube_cpu) puts the whole 4 x 4 x 4 cubes of
the latent grid [F, H, W] first, in raster order of the cube grid: block b < n_cube is cube b, and an aligned cube of
the caller's raster layout [B, L, H * D] is one 5-D TMA box. Seen as [B, 1, T', D] with the token mode split as
((4, 4, 4), (H, W / 4, H / 4, F / 4)) (w fastest; _cube_view, the grid's sizes dynamic), CuTe builds the kernel's
[64, 128] tile loads and its output store on the caller's tensors with the box (64 columns, 4, 4, 4) and the head,
cube index and batch folded into the fifth dimension, head first (tests/test_cube_view_coords.py checks the fold's
coordinates on the CPU; bench/probes/cube_tma.py, on the GPU, the tiles). The blocks after the cubes (the grid's
last partial slabs: 11% of the tokens at 480p, 7% at 720p) keep copies that the statistics kernel writes as it reads
them (block_stats gather_from), and their output rows go through the permutation (tile_ops._store_rows). The pair
kernel (fwd_pair.py) picks per tile: `cube` builds have a producer that loads block j < n_cube through the view and
the others from the copies (pair_sched._produce_cube), the query tile likewise, and an epilogue that stores a cube by
TMA into the caller's output, the others row by row. Session 35 measured that 7% slower than the copies at 480p (an
H100): the exact loop's K / V stream is slower through 16 runs of 4 rows a tile. So PSA_CUTE_CUBE_KV=0 (session 36)
takes the view for the query tile and the output only (one load and one store per query block), and k and v from
block-order copies of every block as the Morton path has them: no q copy of the cubes and no scatter pass.
"""
from __future__ import annotations

import logging

import torch

import cuda.bindings.driver as cuda  # noqa: F401  (cutlass-dsl's stream type)
import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

from .fwd_pair import PairFwdSm90
from .switches import CUBE_KV, CUBE_VIEW, Q_RS, _env_flag
from .tile_ops import BS


def cube_scalars(grid, n_cube: int) -> tuple[int, ...]:
    """The cube build's scalar arguments: (n_cube, W, H, W / 4, H / 4, F / 4) of a grid (F, H, W)."""
    gf, gh, gw = grid
    return n_cube, gw, gh, gw // 4, gh // 4, gf // 4


def _cube_view(x, gw, gh, wc, hc, fc):
    """[B, H, T, D] (raster tokens of a grid [F, gh, gw], token stride s, head stride sh) -> [B, 1, T', D] over the same
    memory with T' = ((4, 4, 4), (H, wc, hc, fc)): row (w, h, f) of tile (head, cw, ch, cf) is token ((4 cf + f) gh +
    4 ch + h) gw + 4 cw + w of that head. The head leads the tile index on purpose: CuTe folds the tile modes (head,
    cube index, batch) into one TMA dimension whose coordinate unit is the first mode's stride, so that stride must
    divide the others (usable: the caller's [B, L, H * D], head stride D). With the cube index first (stride 4 s) the
    head's stride D / 4 s was rounded up to 1: session 34's first GPU run read and wrote the wrong tiles."""
    s = x.stride[2]
    row = s * gw
    plane = row * gh
    t_shape = ((4, 4, 4), (x.shape[1], wc, hc, fc))
    t_stride = ((s, row, plane), (x.stride[1], 4 * s, 4 * row, 4 * plane))
    return cute.make_tensor(x.iterator, cute.make_layout((x.shape[0], 1, t_shape, x.shape[3]),
                                                         stride=(x.stride[0], x.stride[1], t_stride, x.stride[3])))


class CubePairFwdSm90(PairFwdSm90):
    """The pair kernel with the cube order's interior read and written through _cube_view: q, k, v hold the blocks
    from n_cube on (copies), qc, kc, vc and the output are the caller's [B, H, T, D]; perm (int32 [T]) the cube order,
    through which the copied blocks' output rows go."""

    @cute.jit
    def __call__(self, mQ4: cute.Tensor, mK4: cute.Tensor, mV4: cute.Tensor, mO4: cute.Tensor,
                 mKb4: cute.Tensor, mVm4: cute.Tensor, mH4: cute.Tensor, mVB: cute.Tensor,
                 mIdx: cute.Tensor, mPerm: cute.Tensor, mQc4: cute.Tensor, mKc4: cute.Tensor, mVc4: cute.Tensor,
                 n_vt: cutlass.Int32, scale_log2: cutlass.Float32, scale: cutlass.Float32, n_cube: cutlass.Int32,
                 gw: cutlass.Int32, gh: cutlass.Int32, wc: cutlass.Int32, hc: cutlass.Int32, fc: cutlass.Int32,
                 stream: cuda.CUstream):
        hs = self._host_setup(mQ4, mK4, mV4, mO4, mKb4, mVm4, mH4, 2, 2 * self.kv_stages)
        views = [_cube_view(x, gw, gh, wc, hc, fc) for x in (mQc4, mKc4, mVc4, mO4)]
        hv = self._host_setup(*views, mKb4, mVm4, mH4, 2, 2 * self.kv_stages)
        tma_oc, gOct = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), hv["mO"],
                                                   cute.slice_(hv["sQ_layout"], (None, None, 0)), (BS, self.d))
        self._launch(hs, hv["tmas"][:6] + (tma_oc, gOct), mQ4, mVB, mIdx, mPerm, n_vt, scale_log2, scale, n_cube,
                     stream)


def enabled() -> bool:
    """PSA_CUTE_CUBE_VIEW (CUBE_VIEW): the cube order's interior through the view (else the cube order's blocks are
    all copied, as the Morton order's are)."""
    return _env_flag("PSA_CUTE_CUBE_VIEW", CUBE_VIEW)


def kv_view() -> bool:
    """PSA_CUTE_CUBE_KV (CUBE_KV): k and v through the view as well (else only the query tile and the output; k and
    v as block-order copies of every block)."""
    return _env_flag("PSA_CUTE_CUBE_KV", CUBE_KV)


def forward_cubes(q, k, v, cfg, fperm, grid, n_cube: int, attention, out_bthd: bool = False):
    """Statistics, routing and the cube build's attention for q, k, v [B, H, T, D] in the caller's raster order of
    `grid` (no prefix), fperm the cube order (int32 [T], kernels.reorder.full_order), n_cube its whole-cube blocks;
    attention(q_rest, k_copy, v_copy, out, st, idx, vbias, cfg, perm=fperm, cube=(q, k, v, grid, n_cube, kv)) per
    head chunk. The statistics read every row through fperm. With kv_view() (kv) they copy the rows from n_cube * 64
    on of q, k and v ([3, B, hc, T - n_cube * 64, D], the only scratch beside the statistics); else they copy every
    row of k and v (the Morton path's copies, under its budget: kernels.triton._copy_heads) and q's rows from
    n_cube * 64 on are one index_select into a buffer of their own (480p: 11% of q's rows)."""
    from .. import triton as _kt
    from ..dispatch import log_once
    from ..triton import stats as _stats

    kv = kv_view()
    log_once("cute:cube_view", "piecewise_sparse_attention: PSA_MORTON_CUBES: the CuTe cube build reads the cube "
             "order's interior in place (experimental and off: on an H100 it ran 6.7% slower than the copies at "
             "Wan 480p with k and v through the view, session 35, and 5.4% with them from copies, session 37; "
             "PSA_CUTE_CUBE_VIEW=0 keeps the copies; k and v now "
             f"{'through the view' if kv else 'from copies'}, PSA_CUTE_CUBE_KV)", level=logging.WARNING)

    B, H, T, D = q.shape
    goff = n_cube * BS
    t_rest = T - goff
    out = _kt._output_like(q, out_bthd)
    hc, score_bytes = _kt._chunking(q, cfg, None, None)
    if not kv:  # two copies of every row: the Morton path's budget for them
        hc = _kt._even_chunks(H, min(hc, _kt._copy_heads(q, 2)))
        kvg = torch.empty((2, B, hc, T, D), device=q.device, dtype=q.dtype)
        rows = fperm[goff:]  # (index_select takes the int32 order as it is)
    else:
        rest = torch.empty((3, B, hc, max(t_rest, BS), D), device=q.device, dtype=q.dtype)
    for h0 in range(0, H, hc):
        h1 = min(H, h0 + hc)
        qs, ks, vs = q[:, h0:h1], k[:, h0:h1], v[:, h0:h1]
        if not kv:
            # the query rows after the cubes, in block order (a buffer per chunk: index_select's out contiguous)
            qr = torch.empty((B, h1 - h0, t_rest or BS, D), device=q.device, dtype=q.dtype)
            if t_rest:
                torch.index_select(qs, 2, rows, out=qr)
            r = [qr, kvg[0, :, :h1 - h0], kvg[1, :, :h1 - h0]]
            st = _stats.block_stats(qs, ks, vs, cfg, perm=fperm, gathered=(None, r[1], r[2]))
        else:
            r = [rest[i, :, :h1 - h0, :t_rest or BS] for i in range(3)]
            if t_rest:
                st = _stats.block_stats(qs, ks, vs, cfg, perm=fperm, gathered=tuple(r), gather_from=goff)
            else:  # every block a cube: nothing copied (the kernel gets the rest's buffer, never read)
                st = _stats.block_stats(qs, ks, vs, cfg, perm=fperm)
        idx, vbias = _stats.route(st, cfg, q.dtype, score_bytes=score_bytes)
        attention(*r, out[:, h0:h1], st, idx, vbias, cfg, perm=fperm, cube=(qs, ks, vs, grid, n_cube, kv))
        del st, idx, vbias
    return out


def usable(q, cfg, perm, n_prefix: int):
    """(grid, n_cube) when forward_cubes takes this call, else None: the switch on, a cube order from orders_on over
    every token (no prefix), pisa / pwt where the pair kernel runs, no environment override of its build."""
    from ..reorder import cube_layout
    from .switches import _pair_runs

    if perm is None or n_prefix or cfg.variant not in ("pisa", "pwt") or not enabled():
        return None
    if not _pair_runs(q.shape[2], cfg.variant) or not _env_flag("PSA_CUTE_QRS", Q_RS):
        return None
    if not fold_exact(q):
        return None
    return cube_layout(perm)


def fold_exact(x) -> bool:
    """True when _cube_view's folded TMA dimension is exact for x [B, H, T, D] and its tiles can be addressed without
    a division (pair_sched._cube_tile): the token stride is H head strides and the head stride divides the batch
    stride (the caller's [B, L, H * D] memory or a head chunk of it; a contiguous [B, H, T, D] is not)."""
    sb, sh, st, _ = x.stride()
    return sh > 0 and st == x.shape[1] * sh and (x.shape[0] == 1 or sb % sh == 0)

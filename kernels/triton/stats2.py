"""drop's block statistics (q-bar, k-bar) with the column sums on tensor cores (stats.STATS_TC; issue #11).

`ones[64, BS] x tile` on tensor cores replaces the cross-warp tl.sum of stats._block_stats_kernel, and because the
tiles feed a dot, Triton's software pipeliner stages their loads into shared memory with cp.async ahead of use
(checked in the sm_90a TTGIR, bench/probes/stats2_compile.py), which loads that only feed reductions never get.
bf16 / fp16 tiles: the products with 1.0 are exact and accumulate in float32. H200 (pieces_h200.md, session 4):
0.253 -> 0.183 ms at Wan2.1-14B 480p. Measured and dropped (commit d888c50): the same for pisa / pwt, with the key /
value statistics folded into a pipelined H-sum pass (each K / V tile read once): 1.16-2.24 ms vs 0.84 split.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rows(PERM, o_t, m_t, HAS_PERM: tl.constexpr):
    """int64 rows of the caller's tensor that block-order positions o_t read: PERM[o_t] (Morton), else o_t; the
    statistics kernels here and in stats.py share it."""
    if HAS_PERM:
        o_r = tl.load(PERM + o_t, mask=m_t, other=0).to(tl.int64)
    else:
        o_r = o_t.to(tl.int64)
    return o_r


@triton.jit
def _bf16_parts(x):
    """(hi, lo) bfloat16 parts of float32 x: hi = x rounded, lo = the rest rounded, x = hi + lo + O(2^-17 |x|); the
    products of such parts are exact in a float32 accumulator (the one-pass statistics' squares, the routing
    scores' dots)."""
    hi = x.to(tl.bfloat16)
    return hi, (x - hi.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def _column_split(HC, D: tl.constexpr, DB: tl.constexpr):
    """(block group, column split, batch, head, batch * HC + head, the DB columns) of a statistics program whose
    first grid axis runs over block groups x D // DB column splits."""
    i_gs, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    NSPLIT: tl.constexpr = D // DB
    i_g = i_gs // NSPLIT
    i_s = i_gs % NSPLIT
    return i_g, i_s, i_b, i_h, i_b * HC + i_h, i_s * DB + tl.arange(0, DB)


@triton.jit
def _colsum_dot(ONES, b_x, PREC: tl.constexpr):
    """[BS, DB] -> [64, DB] float32, every row the column sum of b_x (tensor cores: ones x tile)."""
    if PREC == 0:
        return tl.dot(ONES, b_x)  # bf16 / fp16: exact products, float32 accumulation
    else:
        return tl.dot(ONES, b_x, input_precision="tf32x3")  # float32 inputs: float32-accurate sums


@triton.jit
def _qk_sums_tc_kernel(
    Q, K, PERM, QBAR, KBAR,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t,
    HC, T, N, G,
    D: tl.constexpr, DB: tl.constexpr, BS: tl.constexpr, HAS_PERM: tl.constexpr, LOWP: tl.constexpr,
    STAGES: tl.constexpr,
):
    """q-bar and k-bar of G blocks per program, DB columns, the column sums on tensor cores (ones[64, BS] x tile;
    row 0 of the [64, DB] result stored) instead of cross-warp tl.sum: no shared-memory reduction chain per block,
    and the loads are staged (cp.async, STAGES deep) ahead of use."""
    i_g, i_s, i_b, i_h, i_bh, o_d = _column_split(HC, D=D, DB=DB)
    o_m = tl.arange(0, BS)
    o_row = tl.arange(0, 64)
    p_q = Q + i_b * sq_b + i_h * sq_h
    p_k = K + i_b * sk_b + i_h * sk_h
    if LOWP:
        ones = tl.full([64, BS], 1.0, Q.dtype.element_ty)
    else:
        ones = tl.full([64, BS], 1.0, tl.float32)
    j0 = i_g * G
    j1 = tl.minimum(j0 + G, N)
    for j in tl.range(j0, j1, num_stages=STAGES):
        o_t = j * BS + o_m
        m_t = o_t < T
        o_r = _rows(PERM, o_t, m_t, HAS_PERM=HAS_PERM)
        b_q = tl.load(p_q + o_r[:, None] * sq_t + o_d[None, :], mask=m_t[:, None], other=0.0)
        cnt = tl.minimum(T - j * BS, BS).to(tl.float32)
        p_s = (i_bh * N + j) * D + o_d[None, :] + o_row[:, None] * 0
        m_s = (o_row == 0)[:, None] & (o_d[None, :] < D)
        tl.store(QBAR + p_s, _colsum_dot(ones, b_q, PREC=1 - LOWP) / cnt, mask=m_s)
        b_k = tl.load(p_k + o_r[:, None] * sk_t + o_d[None, :], mask=m_t[:, None], other=0.0)
        tl.store(KBAR + p_s, _colsum_dot(ones, b_k, PREC=1 - LOWP) / cnt, mask=m_s)

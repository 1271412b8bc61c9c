"""Block statistics and the H_j sum in one pass over q, k and v (pisa / pwt / cov_bias, 16-bit inputs; issue #11).

`_stats_h_kernel`: one program per G <= D consecutive 64-token blocks of one (batch, head), all D columns, 8 warps.
Every tile feeds a dot, so Triton's software pipeliner stages the q / k / v loads into shared memory (cp.async,
STAGES deep) and nothing in the loop is a cross-warp reduction:

- column sums (q-bar, k-bar, the value sum; q^2 and the centred key squares for PWT) as `ones[16, BS] x tile` on
  tensor cores (mma.sync, M = 16): all 16 rows of the [16, D] result hold the sums, so nothing is reduced; the
  squares as bfloat16 high and low parts (for bfloat16 q the high part is the bfloat16 product, one packed multiply
  per two elements); a block's statistics are picked by row into one [16, D] tile and stored at once (one layout
  conversion per block). The input-dtype k-bar and value means are written after the loop from the float32 k-bar
  and value sums, and q's finiteness is read back there from the stored q-bar / q^2. Session 14 (H200): 959 -> 731
  SASS instructions and 4 -> 2 CTA barriers per block, Wan2.1-14B 480p 0.401 -> 0.358 ms. Measured slower and not
  kept: the squares' sums as float32 FMAs summed inside each warp (523 instructions but 0.462 ms; not profiled: q
  and k then reach registers in the mma accumulator layout, not by ldmatrix) and two programs per block range over
  half the columns each at <= 128 registers (two per SM; 0.409 ms: more instructions, four barriers); session 15:
  the sums as b_x^T x ones[BS, 16] ([D, 16] tiles, M = D: warpgroup MMAs, q / k / v read straight from the staged
  tiles, no mma.sync; 236 registers, 4 barriers): 0.360 vs 0.356 ms at 480p, 0.797 vs 0.796 at 720p, 0.0399 vs
  0.0389 at FLUX.1 (bench/results/stats_h_colt_s15_h200.txt, commit 09b34fd);
- sum_j K_j^T V_j accumulated in a [D, D] float32 register tile (wgmma), without centring: after the loop the
  program subtracts sum_j kbar_j (x) vsum_j (MATH.md: sum_j H_j = K^T V - sum_j n_j kbar_j (x) V-hat_j / n_j,
  exact) with 3xTF32 dots over its blocks' float32 k-bar and value sums (the value sums wait in the program's own
  [D, D] partial slot, hence G <= D), and writes its partial there (HPART[i_bh, i_g]; the routing's scores kernel
  sums a head's partials into H-bar, as before). The products k * v of bf16 / fp16 inputs are exact in float32, so
  this is more accurate than centring first (which rounded the centred keys to the input dtype: H-bar 2.7e-6 vs
  1.7e-3 from float64 on the H200), and float16 keys need no range guard;
- sigma^2 centred on one key row of the program (c): sum (k - c)^2 / n - (kbar - c)^2, so a large common key
  offset does not cancel in float32.

Rows past T repeat row T - 1 (no masks to carry through the pipeline): the short last block is done again
exactly after the loop and its padding rows' share of K^T V taken back. Non-finite inputs: a block whose keys or
values are not all finite contributes no H_j, and an inf stays inf in its own column (MATH.md); the fast path
cannot promise the first (one inf key poisons the whole K^T V partial), so a program whose partial or q sums come
out non-finite redoes its blocks with masked loads and plain reductions (`_exact_blocks`), which never runs on
finite data. With GATHER (Morton) the tiles are also written to QG / KG / VG at their block-order rows.

Replaces stats._block_stats_kernel + stats._hsum_kernel (K and V read twice) where H is needed; drop keeps
stats2's column sums (no values, no H), float32 inputs keep the two passes.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .stats import _stats_load, _stats_write
from .stats2 import _bf16_parts, _rows

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _dot32(a, b, acc, PREC: tl.constexpr):
    """float32 dot at float32 accuracy: 3xTF32 on the GPU, plain float32 under the interpreter."""
    if PREC == 1:
        return tl.dot(a, b, acc, input_precision="tf32x3")
    else:
        return tl.dot(a, b, acc, input_precision="ieee")


@triton.jit
def _colsum(ones, b_x, LOWP: tl.constexpr):
    """[16, D] = ones[16, BS] x b_x[BS, D]: every row holds the column sums of b_x (tensor cores, mma.sync: M = 16;
    input-dtype operands: exact products, float32 accumulation), float32 under the interpreter."""
    acc = tl.zeros([16, b_x.shape[1]], dtype=tl.float32)
    if LOWP:
        return tl.dot(ones.to(b_x.dtype), b_x, acc)
    else:
        return tl.dot(ones, b_x.to(tl.float32), acc, input_precision="ieee")


@triton.jit
def _sqsum(ones, b_x, LOWP: tl.constexpr):
    """[16, D], every row the column sums of b_x^2 (b_x [BS, D]): the squares split into bfloat16 high and low
    parts, two exact-product dots, float32 under the interpreter. bfloat16 b_x: hi = the bfloat16 product (one
    packed multiply per two elements), lo = x^2 - hi, both exact (a bfloat16 square has 16 significant bits);
    else x^2 = hi + lo + O(2^-17 x^2) (float32 products)."""
    acc = tl.zeros([16, b_x.shape[1]], dtype=tl.float32)
    if LOWP:
        onesb = ones.to(tl.bfloat16)
        if b_x.dtype == tl.bfloat16:
            b_hi = b_x * b_x
            b_xf = b_x.to(tl.float32)
            b_lo = (b_xf * b_xf - b_hi.to(tl.float32)).to(tl.bfloat16)
        else:
            b_xf = b_x.to(tl.float32)
            b_hi, b_lo = _bf16_parts(b_xf * b_xf)
        return tl.dot(onesb, b_lo, tl.dot(onesb, b_hi, acc))
    else:
        b_xf = b_x.to(tl.float32)
        return tl.dot(ones, b_xf * b_xf, acc, input_precision="ieee")


@triton.jit
def _exact_blocks(Q, K, V, PERM, KBAR, KBAR_LP, VMEAN_LP, KSIG2, QBAR, Q2, p_vs, p_q, p_k, p_v, sq_t, sk_t, sv_t,
                  i_bh, T, N, j0, j1, D: tl.constexpr, BS: tl.constexpr, NEED_PWT: tl.constexpr,
                  HAS_PERM: tl.constexpr, LOWP: tl.constexpr):
    """The rare path of a program whose fast sums came out non-finite (a non-finite input, or a float32 overflow):
    blocks j0 .. j1 again with masked loads and plain reductions (stats._stats_write: an inf stays inf in its
    own column), then sum_j H_j = (K_j - kbar_j)^T V_j over the blocks whose k-bar and value sum are finite
    (bfloat16 operands: float16's range could not hold centred keys; float32 under the interpreter). Returns that
    [D, D] sum."""
    o_m = tl.arange(0, BS)
    o_d = tl.arange(0, D)
    for j in tl.range(j0, j1, num_stages=1):
        b_q, b_k, b_v = _stats_load(p_q, p_k, p_v, PERM, sq_t, sk_t, sv_t, T, j, True, o_d, BS=BS, NEED_V=True,
                                    HAS_PERM=HAS_PERM)
        _stats_write(b_q, b_k, b_v, KBAR, KBAR_LP, VMEAN_LP, KSIG2, QBAR, Q2, KBAR, Q, K, V, 0, 0, 0, 0, T, N, j,
                     i_bh, 0, o_d, D=D, NSPLIT=1, BS=BS, NEED_PWT=NEED_PWT, NEED_V=True, NEED_FIN=False, GATHER=False,
                     GATHER_Q=False)
        tl.store(p_vs + j * D + o_d, tl.sum(b_v.to(tl.float32), axis=0))
    tl.debug_barrier()  # the k-bar and value sums above, read back by other threads below
    b_h = tl.zeros([D, D], dtype=tl.float32)
    for j in tl.range(j0, j1, num_stages=1):
        o_t = j * BS + o_m
        b_kbar = tl.load(KBAR + (i_bh * N + j) * D + o_d)
        keep = (tl.sum(b_kbar * 0.0 + tl.load(p_vs + j * D + o_d) * 0.0, axis=0) == 0.0).to(tl.int32)
        m_r = o_t < T * keep  # no rows of a dropped block
        o_r = _rows(PERM, o_t, m_r, HAS_PERM=HAS_PERM)
        b_k = tl.load(p_k + o_r[:, None] * sk_t + o_d[None, :], mask=m_r[:, None], other=0.0).to(tl.float32)
        b_v = tl.load(p_v + o_r[:, None] * sv_t + o_d[None, :], mask=m_r[:, None], other=0.0)
        b_kc = tl.where(m_r[:, None], b_k - b_kbar[None, :], 0.0)
        if LOWP:
            b_h = tl.dot(tl.trans(b_kc.to(tl.bfloat16)), b_v.to(tl.bfloat16), b_h)
        else:
            b_h = tl.dot(tl.trans(b_kc), b_v.to(tl.float32), b_h, input_precision="ieee")
    return b_h


@triton.jit
def _stats_h_kernel(
    Q, K, V, PERM, ST32, LP, HPART, QG, KG, VG, QGD, KGD, VGD,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sg_b, sg_h, sg_t, sgq_b, sgq_h, sgq_t,
    HC, T, N, G, NPART, SROW, FLAG, GOFF,
    D: tl.constexpr, BS: tl.constexpr, NEED_PWT: tl.constexpr, HAS_PERM: tl.constexpr, GATHER: tl.constexpr,
    GATHER_Q: tl.constexpr, LOWP: tl.constexpr, PREC: tl.constexpr, STAGES: tl.constexpr, TMA_G: tl.constexpr = 0,
    FIX: tl.constexpr = 0,
):
    """ST32: float32 rows [q-bar, k-bar, (q^2, sigma^2)] x [B, HC, N, D], SROW apart; LP: input dtype [k-bar,
    value mean] the same way. The float32 value sums (for the H correction; G <= D) wait in the program's own
    [D, D] slot of HPART until the partial overwrites them. TMA_G (with GATHER): the block-order copies go out
    through the host TMA descriptors QGD / KGD / VGD ([B, HC, T, D], boxes [1, 1, BS, D]: rows past T clipped by
    the descriptor) instead of per-thread stores through QG / KG / VG. FIX (stats_gl's fix-up launch): only the
    programs whose FLAG [B, HC, NPART] is set run (their sums came out non-finite in stats_gl._stats_gl_kernel).
    GOFF: the copies start at block-order row GOFF (a multiple of BS; rows before it are not copied)."""
    i_g, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh = i_b * HC + i_h
    if FIX:
        if tl.load(FLAG + i_bh * NPART + i_g) == 0:
            return
    QBAR, KBAR = ST32, ST32 + SROW
    Q2, KSIG2 = ST32 + 2 * SROW, ST32 + 3 * SROW  # (PWT only)
    KBAR_LP, VMEAN_LP = LP, LP + SROW
    p_q = Q + i_b * sq_b + i_h * sq_h
    p_k = K + i_b * sk_b + i_h * sk_h
    p_v = V + i_b * sv_b + i_h * sv_h
    j0 = i_g * G
    j1 = tl.minimum(j0 + G, N)
    p_hs = HPART + (i_bh * NPART + i_g).to(tl.int64) * D * D  # this program's [D, D] partial
    p_vs = p_hs - j0 * D  # block j's value sums at p_vs + j D until the partial is stored
    o_g = i_b * sg_b + i_h * sg_h
    o_gq = i_b * sgq_b + i_h * sgq_h  # QG's own strides (it may be a region of another buffer)
    o_m = tl.arange(0, BS)
    o_d = tl.arange(0, D)
    o_e = tl.arange(0, 16)
    NR32: tl.constexpr = 5 if NEED_PWT else 3  # rows of the [16, D] statistics tile stored (row 2: value sums)
    if NEED_PWT:
        # sigma^2's centre: the program's first key row (0 where it is not finite)
        r0 = _rows(PERM, j0 * BS + o_d * 0, o_d >= 0, HAS_PERM=HAS_PERM)
        b_c = tl.load(p_k + r0 * sk_t + o_d).to(tl.float32)  # [D]
        b_c = tl.where(b_c * 0.0 == 0.0, b_c, 0.0)
    ones = tl.full([16, BS], 1.0, tl.float32)
    # [16, D] statistics tile, row e -> ST32 row e (e 2: the value sums, to the partial slot; 3, 4 -> rows 2, 3)
    o_row = (o_e - (o_e > 2).to(tl.int32))[:, None].to(tl.int64) * SROW  # [16, 1]
    b_h = tl.zeros([D, D], dtype=tl.float32)
    for j in tl.range(j0, j1, num_stages=STAGES):
        o_t = j * BS + o_m
        # rows past T repeat row T - 1 (no masks to carry through the pipeline): the short last block is done
        # again exactly after the loop, and their share of K^T V is taken back there
        o_r = _rows(PERM, tl.minimum(o_t, T - 1), o_t >= 0, HAS_PERM=HAS_PERM)
        b_q = tl.load(p_q + o_r[:, None] * sq_t + o_d[None, :])  # [BS, D]
        b_k = tl.load(p_k + o_r[:, None] * sk_t + o_d[None, :])
        b_v = tl.load(p_v + o_r[:, None] * sv_t + o_d[None, :])
        if GATHER and TMA_G:  # (never with GOFF: stats_with_h)
            if GATHER_Q:
                QGD.store([i_b, i_h, j * BS, 0], b_q.reshape([1, 1, BS, D]))
            KGD.store([i_b, i_h, j * BS, 0], b_k.reshape([1, 1, BS, D]))
            VGD.store([i_b, i_h, j * BS, 0], b_v.reshape([1, 1, BS, D]))
        elif GATHER:
            o_gt = (o_t - GOFF).to(tl.int64)
            p_gt = o_g + o_gt[:, None] * sg_t + o_d[None, :]
            m_gt = ((o_t < T) & (o_t >= GOFF))[:, None]
            if GATHER_Q:
                tl.store(QG + o_gq + o_gt[:, None] * sgq_t + o_d[None, :], b_q, mask=m_gt)
            tl.store(KG + p_gt, b_k, mask=m_gt)
            tl.store(VG + p_gt, b_v, mask=m_gt)
        if LOWP:
            b_h = tl.dot(tl.trans(b_k), b_v, b_h)  # [D, BS] x [BS, D], exact products
        else:
            b_h = tl.dot(tl.trans(b_k.to(tl.float32)), b_v.to(tl.float32), b_h, input_precision="ieee")
        # full blocks here (the short last one is redone below): 1 / 64 is exact, as a division would be
        rcnt = 1.0 / tl.minimum(T - j * BS, BS).to(tl.float32)
        # every statistic as a [16, D] tile whose 16 rows are equal (no reductions), the block's statistics
        # selected by row into one tile and one store
        s_q = _colsum(ones, b_q, LOWP=LOWP)
        s_k = _colsum(ones, b_k, LOWP=LOWP)
        s_v = _colsum(ones, b_v, LOWP=LOWP)
        if NEED_PWT:
            s_q2 = _sqsum(ones, b_q, LOWP=LOWP)
            s_kc2 = _sqsum(ones, b_k.to(tl.float32) - b_c[None, :], LOWP=LOWP)
        s_k = s_k * rcnt
        b_o = tl.where(o_e[:, None] == 0, s_q * rcnt, tl.where(o_e[:, None] == 1, s_k, s_v))
        if NEED_PWT:
            b_dc = s_k - b_c[None, :]
            s_sig2 = s_kc2 * rcnt - b_dc * b_dc
            s_sig2 = tl.where(s_sig2 < 0.0, 0.0, s_sig2)  # rounding below 0 -> 0; NaN stays
            b_o = tl.where(o_e[:, None] == 3, s_q2 * rcnt, tl.where(o_e[:, None] == 4, s_sig2, b_o))
        o_s = (i_bh * N + j) * D + o_d[None, :]
        p_o = tl.where(o_e[:, None] == 2, p_vs + j * D + o_d[None, :], ST32 + o_row + o_s)
        tl.store(p_o, b_o, mask=o_e[:, None] < NR32)
    if j1 * BS > T:  # the short last block again, with masked loads (zeros past T)
        tl.debug_barrier()  # after the loop's stores of the same block
        b_q, b_k, b_v = _stats_load(p_q, p_k, p_v, PERM, sq_t, sk_t, sv_t, T, N - 1, True, o_d, BS=BS,
                                    NEED_V=True, HAS_PERM=HAS_PERM)
        # (its input-dtype k-bar and value mean come with the others' below)
        _stats_write(b_q, b_k, b_v, KBAR, KBAR_LP, VMEAN_LP, KSIG2, QBAR, Q2, KBAR, Q, K, V, 0, 0, 0, 0, T, N,
                     N - 1, i_bh, 0, o_d, D=D, NSPLIT=1, BS=BS, NEED_PWT=NEED_PWT, NEED_V=False, NEED_FIN=False,
                     GATHER=False, GATHER_Q=False)
        tl.store(p_vs + (N - 1) * D + o_d, tl.sum(b_v.to(tl.float32), axis=0))
    # this program's k-bar and value sums, written above by other threads, are read back below: sum_j kbar_j (x)
    # vsum_j comes off the raw sum, the input-dtype k-bar and value means are written, q's sums are checked
    tl.debug_barrier()
    b_qbad = tl.zeros([16, D], dtype=tl.float32)
    for c0 in tl.range(j0, j1, 16, num_stages=1):
        o_c = c0 + o_e
        m_c = (o_c < j1)[:, None]
        p_c = (i_bh * N + o_c)[:, None].to(tl.int64) * D + o_d[None, :]
        b_kb = tl.load(KBAR + p_c, mask=m_c, other=0.0)  # [16, D]
        b_vs = tl.load(p_vs + o_c[:, None] * D + o_d[None, :], mask=m_c, other=0.0)
        b_h = _dot32(tl.trans(-b_kb), b_vs, b_h, PREC=PREC)  # - sum_j kbar_j (x) vsum_j
        b_qbad += tl.load(QBAR + p_c, mask=m_c, other=0.0) * 0.0  # NaN once a q sum is not finite
        if NEED_PWT:
            b_qbad += tl.load(Q2 + p_c, mask=m_c, other=0.0) * 0.0
        cnt_c = tl.minimum(T - o_c * BS, BS).to(tl.float32)[:, None]
        tl.store(KBAR_LP + p_c, b_kb.to(KBAR_LP.dtype.element_ty), mask=m_c)
        tl.store(VMEAN_LP + p_c, (b_vs / cnt_c).to(VMEAN_LP.dtype.element_ty), mask=m_c)
    n_pad = j1 * BS - T
    if n_pad > 0:  # the padding rows of the last block repeated row T - 1: take their k^T v back
        r_l = _rows(PERM, (T - 1) + o_e * 0, o_e >= 0, HAS_PERM=HAS_PERM)
        m_l = (o_e == 0)[:, None]
        b_kl = tl.load(p_k + r_l[:, None] * sk_t + o_d[None, :], mask=m_l, other=0.0).to(tl.float32)
        b_vl = tl.load(p_v + r_l[:, None] * sv_t + o_d[None, :], mask=m_l, other=0.0).to(tl.float32)
        b_h = _dot32(tl.trans(b_kl * (-n_pad).to(tl.float32)), b_vl, b_h, PREC=PREC)
    if tl.sum(tl.sum(b_h * 0.0, axis=1), axis=0) + tl.sum(tl.sum(b_qbad, axis=1), axis=0) != 0.0:
        b_h = _exact_blocks(Q, K, V, PERM, KBAR, KBAR_LP, VMEAN_LP, KSIG2, QBAR, Q2, p_vs, p_q, p_k, p_v, sq_t,
                            sk_t, sv_t, i_bh, T, N, j0, j1, D=D, BS=BS, NEED_PWT=NEED_PWT, HAS_PERM=HAS_PERM,
                            LOWP=LOWP)
    tl.debug_barrier()  # every thread has read the value sums the partial now overwrites
    tl.store(p_hs + o_d[:, None] * D + o_d[None, :], b_h)


# knobs (PSA_STATS_H_* override them for a bench process). H200, bench/probes/stats_h.py, session 12, graph replays,
# pwt bf16 Wan2.1-14B 480p raster / the Triton Morton gather, FLUX.1 1024^2 raster (ms): 8 warps 0.401 / 0.661,
# 0.043; 16 warps 0.433 / 0.650, 0.046; 2 / 3 / 4 stages 0.525 / 0.402 / 0.397 and 0.055 / 0.043 / 0.043 (session 14's
# loop, stats_h_s14_h200.txt: 8 warps 0.358 / 0.608, 0.039; 16 warps 0.400 / 0.627, 0.043; 2 / 3 / 4 stages 0.490 /
# 0.357 / 0.358). 226 registers at 8 warps then, 255 now (sm_90a, no spills: bench/probes/stats2_compile.py
# fused), so one program per SM: the programs-per-head choice below counts n_sm slots (its picks, 13 at 480p and 5 at FLUX.1, were the fastest P swept)
STATS_H_WARPS = int(os.environ.get("PSA_STATS_H_WARPS", "8") or 8)
STATS_H_STAGES = int(os.environ.get("PSA_STATS_H_STAGES", "3") or 3)
STATS_H_CTAS_PER_SM = int(os.environ.get("PSA_STATS_H_CTAS_PER_SM", "1") or 1)
# the permuted loop (HAS_PERM: the Morton path) loads each block's 64 row indices before its q / k / v rows, so
# Triton's pipeliner puts that chain over one more of the loop's stages and gives the tiles fewer buffers: sm_90a
# TTGIR with Triton 3.6 (bench/probes/stats2_compile.py perm): 3 stages -> one tile buffer (the raster loop's at 3:
# two), 5 -> two (107,008 bytes of shared memory, 239 registers, no spills), 7 -> three. Session 24's profile of
# the gathered statistics at 480p (A37, bench/results/ncu_stats_s24_h200.md): 8.2 cycles per issued instruction against
# the raster loop's 4.9, one program of 8 warps per SM: latency, not bandwidth. PSA_STATS_PERM_DEEP (default on;
# =0 turns it off, read per call, in the CUDA-graph key) adds STATS_H_PERM_EXTRA stages there. Session 24 on the H200
# (B37, bench/results/stats_perm_deep_s24_h200.txt: graph replays, 3 alternated rounds, outputs bitwise equal, the
# raster and node layouts unchanged): the gathered statistics with the q copy (CuTe's Morton path) 0.751 -> 0.598 ms
# at Wan2.1-14B 480p (63% -> 79% of the copy-rate bound), 1.690 -> 1.340 at 720p, 0.0716 -> 0.0567 at FLUX.1, in
# every round; 7 stages no faster than 5 (0.604 / 0.058 ms). The node's call (switch_stats_perm_deep_s24_h200.txt,
# medians of 5 rounds): 480p 7.299 -> 7.201 ms (4 of 5 rounds), 720p 36.21 -> 35.02 (3 of 5; its rounds spread
# 34.7-37.2 ms), FLUX.1 replayed 0.2677 -> 0.2506 (5 of 5); C37, 720p replayed, 7 rounds: 36.65 -> 36.49 (6 of 7).
# SM90 only (PERM_DEEP_ARCH): before Hopper the pipeliner already gives the permuted loop two buffers at 3 stages,
# and 5 stages would take 147,456 bytes of shared memory (sm_80 / 86 / 89, Triton 3.6), past the 99 KB of an RTX
# 3090 / 4090; other architectures are untimed
STATS_H_PERM_EXTRA = int(os.environ.get("PSA_STATS_H_PERM_EXTRA", "2") or 2)
PERM_DEEP_ARCH = (9,)  # compute capability majors where PSA_STATS_PERM_DEEP applies
STATS_H_PARTS = int(os.environ.get("PSA_STATS_H_PARTS", "0") or 0)  # > 0: this many programs per head (sweeps)
STATS_H_MAX_PARTS = 32  # [D, D] float32 partials per head at most (64 KB each: written once, summed once)


def parts_per_head(n: int, bh: int, n_sm: int, cps: int | None = None, d: int = 128) -> int:
    """P programs per (batch, head), each over G = ceil(n / P) <= d blocks (a program keeps its blocks' value sums in
    its own [d, d] partial): the P that minimises the waves' length, ceil(P bh / slots) x (G + 2) (two blocks' worth
    for a program's start and its partial), so the last wave is nearly full; ties to the smaller P (fewer partials)."""
    p_min = -(-n // d)
    if STATS_H_PARTS > 0:
        return max(p_min, min(n, STATS_H_PARTS))
    slots = max(1, n_sm * (STATS_H_CTAS_PER_SM if cps is None else cps))
    best, best_p = None, p_min
    for p in range(p_min, max(p_min, min(n, STATS_H_MAX_PARTS)) + 1):
        g = -(-n // p)
        if -(-n // g) != p:  # the same G as a smaller P: that P's program count
            continue
        cost = -(-p * bh // slots) * (g + 2)
        if best is None or cost < best:
            best, best_p = cost, p
    return best_p


def stats_with_h(q, k, v, pm, strides, g_args, *, n, bs, need_pwt, has_perm, gather, gather_q, parts, goff=0):
    """Launch _stats_h_kernel with `parts` programs per (batch, head) (parts_per_head: at most D blocks each).
    Returns (st32, lp, hpart): float32 [2 or 4, B, HC, N, D] = q-bar, k-bar (+ q^2, sigma^2 for PWT); input dtype
    [2, B, HC, N, D] = k-bar, value mean; the H partials [B, HC, P, D, D]."""
    B, HC, T, D = q.shape
    g = -(-n // parts)
    p = -(-n // g)
    if g > D:
        raise ValueError(f"stats_with_h: {g} blocks per program > D = {D} (parts_per_head bounds it)")
    st32 = torch.empty(4 if need_pwt else 2, B, HC, n, D, device=q.device, dtype=torch.float32)
    lp = torch.empty(2, B, HC, n, D, device=q.device, dtype=q.dtype)
    hpart = torch.empty(B, HC, p, D, D, device=q.device, dtype=torch.float32)
    # the interpreter's bfloat16 dot is wrong: there every dot takes float32 operands (exact for these inputs)
    lowp = not _INTERPRET
    descs = _copy_descs(g_args[:3], bs, gather_q) if gather and not goff and tma_copy_enabled(q.device) else None
    stages = loop_stages(has_perm, q.device)
    _stats_h_kernel[(p, HC, B)](
        q, k, v, pm, st32, lp, hpart, *g_args[:3], *(descs or g_args[:3]), *strides, *g_args[3:], HC, T, n, g, p,
        B * HC * n * D, st32, goff, D=D, BS=bs,
        NEED_PWT=need_pwt, HAS_PERM=has_perm, GATHER=gather, GATHER_Q=gather_q,
        LOWP=lowp, PREC=0 if _INTERPRET else 1, STAGES=stages, TMA_G=int(descs is not None),
        num_warps=STATS_H_WARPS, num_stages=stages,
    )
    return st32, lp, hpart


def redo_flagged(q, k, v, pm, strides, g_args, st32, lp, hpart, flag, *, n, bs, need_pwt, gathered, gather_q):
    """stats_with_h's kernel again (same arguments) over the programs whose flag [B, HC, P] (int32) is set, writing
    their blocks' statistics, copies and H partial into st32 / lp / hpart; every other program returns at once. The
    Gluon kernels (stats_gl.py) flag the programs whose sums came out non-finite; this kernel's masked path
    (_exact_blocks) then gives MATH.md's non-finite contract."""
    B, HC, T, D = q.shape
    p = flag.shape[-1]
    g = -(-n // p)
    stages = loop_stages(gathered, q.device)
    _stats_h_kernel[(p, HC, B)](
        q, k, v, pm, st32, lp, hpart, *g_args[:3], *g_args[:3], *strides, *g_args[3:], HC, T, n, g, p,
        B * HC * n * D, flag, 0, D=D, BS=bs,
        NEED_PWT=need_pwt, HAS_PERM=gathered, GATHER=gathered, GATHER_Q=gather_q,
        LOWP=not _INTERPRET, PREC=0 if _INTERPRET else 1, STAGES=stages, TMA_G=0, FIX=1,
        num_warps=STATS_H_WARPS, num_stages=stages)


def perm_deep(device) -> bool:
    """PSA_STATS_PERM_DEEP (default on) on a GPU of PERM_DEEP_ARCH; never under the interpreter or on the CPU."""
    if _INTERPRET or device.type != "cuda" or os.environ.get("PSA_STATS_PERM_DEEP", "1").strip() == "0":
        return False
    return torch.cuda.get_device_capability(device)[0] in PERM_DEEP_ARCH


def loop_stages(has_perm: bool, device) -> int:
    """The statistics loop's pipeline depth on `device`: STATS_H_STAGES, plus STATS_H_PERM_EXTRA for the permuted
    loop where perm_deep holds (its tiles then get as many shared-memory buffers as the raster loop's)."""
    return STATS_H_STAGES + (STATS_H_PERM_EXTRA if has_perm and perm_deep(device) else 0)


def tma_copy_enabled(device) -> bool:
    """PSA_STATS_TMA_COPY=1: the Morton path's block-order copies leave the statistics kernel through TMA stores
    (host descriptors, kernels/triton/fwd.py's probe that TMA works on this device) instead of per-thread stores.
    Built in session 23 for the gathered statistics' 0.76 ms at Wan2.1-14B 480p (0.47 for their bytes at the copy
    rate). Session 24 on the H200 (A37): slower, 0.889 -> 0.957 ms under Nsight Compute, the node's call 7.510 ->
    7.543 ms at 480p and 36.54 -> 37.47 at 720p (2 of 5 rounds each): off. What held those statistics was their
    pipeline depth (PSA_STATS_PERM_DEEP), not their stores."""
    if _INTERPRET or device.type != "cuda" or os.environ.get("PSA_STATS_TMA_COPY", "0").strip() != "1":
        return False
    from . import fwd
    return fwd.TensorDescriptor is not None and fwd._tma_ok(device)


def _copy_descs(gs, bs: int, gather_q: bool):
    """TMA descriptors of the three [B, HC, T, D] copies (q's slot repeats k's where q is not copied), or None
    where a stride breaks TMA's rules (then the per-thread stores run)."""
    from . import fwd
    if not all(fwd.tma_aligned(x) for x in gs):
        return None
    return fwd._descs_4d(gs, bs)

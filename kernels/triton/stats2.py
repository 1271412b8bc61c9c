"""Key / value statistics folded into the H-sum pass (stats.STATS_FOLD; issue #11).

The split design (stats._block_stats_kernel for q, k, v, then stats._hsum_kernel over k and v again) reads k and
v twice: ~1.67x the bytes of q, k, v. Here `_kv_hsum_kernel` reads each K / V tile once: G blocks per program,
one [BS, D] tile of k and of v per block (all D columns, so the block's finite flag needs no second program),
and from those tiles writes k-bar (float32 and input dtype), the value mean (input dtype), sigma^2 (PWT),
optionally the block-order copies of k and v (Morton GATHER), and accumulates
sum_j H_j = sum_j (K_j - kbar_j)^T V_j into the [D, D] float32 register accumulator exactly as _hsum_kernel does
(same centring, same operand dtypes per H_DOT), one partial per program. The statistics kernel then reads only q
(stats._block_stats_kernel with NEED_K=False). Total bytes: one read of q, k, v.

The block loop is a tl.range with num_stages: its tile loads feed a tl.dot (through the centring), so Triton's
software pipeliner stages them into shared memory with cp.async ahead of use (checked in the sm_90a TTGIR, see
bench/probes/stats2_compile.py), which the statistics kernel's loads (reductions only) never got.

Non-finite blocks (docs/MATH.md): a block whose keys or values are not all finite contributes no H_j (its k-bar /
sigma^2 / value mean carry the inf/NaN as before); the flag is the same test as stats._stats_write's (k-bar and
the value sum finite), taken here over all D columns at once.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _kv_hsum_kernel(
    K, V, PERM, KBAR, KBAR_LP, VMEAN_LP, KSIG2, KG, VG, HPART,
    sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sg_b, sg_h, sg_t,
    HC, T, N, G, NPART,
    D: tl.constexpr, BS: tl.constexpr, NEED_PWT: tl.constexpr, HAS_PERM: tl.constexpr, GATHER: tl.constexpr,
    H_DOT: tl.constexpr, STAGES: tl.constexpr,
):
    """Program (i_g, head, batch): blocks [i_g * G, min(i_g * G + G, N)) of one (batch, head)."""
    i_g, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh = i_b * HC + i_h
    o_m = tl.arange(0, BS)
    o_d = tl.arange(0, D)
    p_k = K + i_b * sk_b + i_h * sk_h
    p_v = V + i_b * sv_b + i_h * sv_h
    o_g = i_b * sg_b + i_h * sg_h
    b_h = tl.zeros([D, D], dtype=tl.float32)
    j0 = i_g * G
    j1 = tl.minimum(j0 + G, N)
    for j in tl.range(j0, j1, num_stages=STAGES):
        o_t = j * BS + o_m
        m_t = o_t < T
        if HAS_PERM:
            o_r = tl.load(PERM + o_t, mask=m_t, other=0).to(tl.int64)
        else:
            o_r = o_t.to(tl.int64)
        b_k = tl.load(p_k + o_r[:, None] * sk_t + o_d[None, :], mask=m_t[:, None], other=0.0)
        b_v = tl.load(p_v + o_r[:, None] * sv_t + o_d[None, :], mask=m_t[:, None], other=0.0)
        if GATHER:
            p_g = o_g + o_t.to(tl.int64)[:, None] * sg_t + o_d[None, :]
            tl.store(KG + p_g, b_k, mask=m_t[:, None])
            tl.store(VG + p_g, b_v, mask=m_t[:, None])
        cnt = tl.minimum(T - j * BS, BS).to(tl.float32)
        o_s = (i_bh * N + j) * D + o_d
        b_kf = b_k.to(tl.float32)
        b_kbar = tl.sum(b_kf, axis=0) / cnt  # [D]
        b_vs = tl.sum(b_v.to(tl.float32), axis=0)
        tl.store(KBAR + o_s, b_kbar)
        tl.store(KBAR_LP + o_s, b_kbar.to(KBAR_LP.dtype.element_ty))
        tl.store(VMEAN_LP + o_s, (b_vs / cnt).to(VMEAN_LP.dtype.element_ty))
        b_kc = tl.where(m_t[:, None], b_kf - b_kbar[None, :], 0.0)  # centred keys, padding zeroed
        if NEED_PWT:
            tl.store(KSIG2 + o_s, tl.sum(b_kc * b_kc, axis=0) / cnt)
        # finite exactly when k-bar and the value sum are (stats._stats_write's test, over all D columns)
        keep = tl.sum(b_kbar * 0.0 + b_vs * 0.0, axis=0) == 0.0
        b_kc = tl.where(keep, b_kc, 0.0)
        b_vk = tl.where(keep, b_v, tl.zeros_like(b_v))  # NaN * 0 would survive a zeroed key
        if H_DOT == 1:
            b_h += tl.dot(tl.trans(b_kc), b_vk.to(tl.float32), input_precision="tf32")  # float16 (_hsum_kernel)
        elif H_DOT == 2:
            b_h += tl.dot(tl.trans(b_kc), b_vk.to(tl.float32))  # the interpreter
        else:
            b_h += tl.dot(tl.trans(b_kc.to(b_vk.dtype)), b_vk)  # [D, BS] x [BS, D]
    tl.store(HPART + (i_bh * NPART + i_g).to(tl.int64) * D * D + o_d[:, None] * D + o_d[None, :], b_h)


@triton.jit
def _colsum_dot(ONES, b_x, PREC: tl.constexpr):
    """[BS, DB] -> [64, DB] float32, every row the column sum of b_x (tensor cores: ones x tile)."""
    if PREC == 0:
        return tl.dot(ONES, b_x)  # bf16 / fp16: exact products, float32 accumulation
    else:
        return tl.dot(ONES, b_x, input_precision="tf32x3")  # float32 tiles (squares; float32 inputs)


@triton.jit
def _qk_sums_tc_kernel(
    Q, K, PERM, QBAR, Q2, KBAR, QG,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sg_b, sg_h, sg_t,
    HC, T, N, G,
    D: tl.constexpr, DB: tl.constexpr, BS: tl.constexpr, NEED_PWT: tl.constexpr, NEED_K: tl.constexpr,
    HAS_PERM: tl.constexpr, GATHER: tl.constexpr, LOWP: tl.constexpr, STAGES: tl.constexpr,
):
    """q-bar (and q^2 for PWT; k-bar with NEED_K: drop) of G blocks per program, DB columns, the column sums on
    tensor cores (ones[64, BS] x tile; row 0 of the [64, DB] result stored) instead of cross-warp tl.sum: no
    shared-memory reduction chain per block, and since the tiles feed a dot Triton's pipeliner stages their
    loads (cp.async, STAGES deep) ahead of use. q^2: the float32 squares through tf32x3 (float32 accuracy).
    With GATHER the q tiles are also written in block order (QG)."""
    i_gs, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    NSPLIT: tl.constexpr = D // DB
    i_g = i_gs // NSPLIT
    i_s = i_gs % NSPLIT
    i_bh = i_b * HC + i_h
    o_d = i_s * DB + tl.arange(0, DB)
    o_m = tl.arange(0, BS)
    o_row = tl.arange(0, 64)
    p_q = Q + i_b * sq_b + i_h * sq_h
    p_k = K + i_b * sk_b + i_h * sk_h
    o_g = i_b * sg_b + i_h * sg_h
    if LOWP:
        ones = tl.full([64, BS], 1.0, Q.dtype.element_ty)
    else:
        ones = tl.full([64, BS], 1.0, tl.float32)
    ones32 = tl.full([64, BS], 1.0, tl.float32)
    j0 = i_g * G
    j1 = tl.minimum(j0 + G, N)
    for j in tl.range(j0, j1, num_stages=STAGES):
        o_t = j * BS + o_m
        m_t = o_t < T
        if HAS_PERM:
            o_r = tl.load(PERM + o_t, mask=m_t, other=0).to(tl.int64)
        else:
            o_r = o_t.to(tl.int64)
        b_q = tl.load(p_q + o_r[:, None] * sq_t + o_d[None, :], mask=m_t[:, None], other=0.0)
        if GATHER:
            tl.store(QG + o_g + o_t.to(tl.int64)[:, None] * sg_t + o_d[None, :], b_q, mask=m_t[:, None])
        cnt = tl.minimum(T - j * BS, BS).to(tl.float32)
        p_s = (i_bh * N + j) * D + o_d[None, :] + o_row[:, None] * 0
        m_s = (o_row == 0)[:, None] & (o_d[None, :] < D)
        tl.store(QBAR + p_s, _colsum_dot(ones, b_q, PREC=1 - LOWP) / cnt, mask=m_s)
        if NEED_PWT:
            b_qf = b_q.to(tl.float32)
            tl.store(Q2 + p_s, _colsum_dot(ones32, b_qf * b_qf, PREC=1) / cnt, mask=m_s)
        if NEED_K:
            b_k = tl.load(p_k + o_r[:, None] * sk_t + o_d[None, :], mask=m_t[:, None], other=0.0)
            tl.store(KBAR + p_s, _colsum_dot(ones, b_k, PREC=1 - LOWP) / cnt, mask=m_s)

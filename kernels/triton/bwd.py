"""Backward of the piecewise sparse attention (../../shared/MATH.md, Backward): block-sparse FlashAttention-2
style for the exact blocks, and the chain rule through the virtual tokens and every block statistic.

Per query row t of block i (s = scale, p = e(x - m) / den from the forward's saved log2-denominator, so the
exact weights p_tn and the virtual ones p^_tj need no second pass; Delta_t = do_t . o_t; z_t = q_t H-bar):
    exact logit:    dl_tn = p_tn (do_t . v_n - Delta_t)
    virtual logit:  ds_tj = p^_tj (do_t . V^_j + s do_t . z_t - n_j Delta_t)        (j in U_i)
    dq_t  = s sum_n dl_tn k_n + s sum_j ds_tj kbar_j + s G_t do_t H-bar^T + (2 / n_i) q_t * dq2_i
    dk_n += s sum_t dl_tn q_t   (exact)      dv_n += sum_t p_tn do_t   (exact)
with G_t = sum_U p^_tj, dw_ij = [w_ij <= ln Bs] sum_{t in i} ds_tj (zero where the gate closed), and the
statistics' gradients  dkbar_j = s sum_t ds_tj q_t,  dV^_j = sum_t p^_tj do_t,  dH = s sum_t G_t q_t^T do_t,
dq2_i = 1/2 s^2 sum_j dw_ij sig2_j,  dsig2_j = 1/2 s^2 sum_i dw_ij q2_i,  chained to the tokens of block j:
    dk_n += dkbar_j / n_j + (2 / n_j) (k_n - kbar_j) * dsig2_j + (1/N) (v_n - vbar_j) dH^T
    dv_n += dV^_j + (1/N) (k_n - kbar_j) dH
(the k-bar terms inside sigma^2 and H_j vanish: sum_n (k_n - kbar_j) = 0). Routing (the exact sets) is
detached; q-bar and the cov_bias norms only route, so they get no gradient.

Kernels, in launch order (all pointer loads, fp32 accumulation, input-dtype operands on the tensor cores):
  _rows_kernel    per query block: Delta_t = rowsum(do * o) and s do_t . (q_t H-bar)
  _virt_kernel    per tile of virtual tokens, over the query blocks (split over programs when the grid is
                  small): dkbar, dV^ and (pwt) the ungated dw rows
  (torch)         the gate [w <= ln Bs] on dw (w = 1/2 s^2 q2 sig2^T again, float32), dq2 = 1/2 s^2 dw sig2,
                  dsig2 = 1/2 s^2 dw^T q2: three batched [N, N] x [N, D]-sized matmuls
  _dq_kernel      one program per query block: exact blocks through its row list, then the virtual tokens in
                  tiles, the first-order and q^2 terms; writes dq (final) and G_t
  _dh_kernel      dH, split-K over blocks (one [D, D] atomic add per program)
  _dkdv_kernel    one program per KV block: the statistics' chain terms, then the query blocks that route
                  it exactly (column list); writes dk, dv (final)
No fp32 [B, H, T, D] buffer: dq, dk, dv are written once in the input dtype; the scratch is per head chunk:
[N, N] for dw (pwt), [N, D] and [T] vectors otherwise.
"""
from __future__ import annotations

import math
import os
import threading

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _rows_kernel(Q, O, DO, HBAR, HSCALE, DELTA, CZ, sq_b, sq_h, sq_t, so_b, so_h, so_t, sd_b, sd_h, sd_t, HC, T,
                 scale, D: tl.constexpr, BS: tl.constexpr, APPROX: tl.constexpr):
    """Per row: Delta_t = do_t . o_t and (pisa / pwt) s do_t . z_t with z_t = q_t H-bar (HBAR holds
    H-bar / HSCALE, HSCALE per head: float16's range)."""
    i_m, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh = i_b * HC + i_h
    o_t = i_m * BS + tl.arange(0, BS)
    o_d = tl.arange(0, D)
    m_t = o_t < T
    b_o = tl.load(O + i_b * so_b + i_h * so_h + o_t[:, None] * so_t + o_d[None, :], mask=m_t[:, None], other=0.0)
    b_do = tl.load(DO + i_b * sd_b + i_h * sd_h + o_t[:, None] * sd_t + o_d[None, :], mask=m_t[:, None], other=0.0)
    tl.store(DELTA + i_bh * T + o_t, tl.sum(b_o.to(tl.float32) * b_do.to(tl.float32), axis=1), mask=m_t)
    if APPROX:
        b_q = tl.load(Q + i_b * sq_b + i_h * sq_h + o_t[:, None] * sq_t + o_d[None, :], mask=m_t[:, None], other=0.0)
        b_hb = tl.load(HBAR + i_bh * D * D + o_d[:, None] * D + o_d[None, :])  # [D, D]
        b_z = tl.dot(b_q, b_hb)  # [BS, D]  q H-bar / HSCALE
        b_cz = tl.sum(b_do.to(tl.float32) * b_z, axis=1) * (scale * tl.load(HSCALE + i_bh))
        tl.store(CZ + i_bh * T + o_t, b_cz, mask=m_t)


@triton.jit
def _dq_kernel(
    Q, K, V, DO, DQ, LSE, DELTA, ROW_OFF, ROW_J, KBAR, VMEAN, HBAR, HSCALE, VBIAS, DQ2, GSUM, CZ,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sdo_b, sdo_h, sdo_t, sdq_b, sdq_h, sdq_t,
    HC, T, N, N_VIRT, qk_scale, scale,
    D: tl.constexpr, BS: tl.constexpr, BLOCK_V: tl.constexpr, APPROX: tl.constexpr, PWT: tl.constexpr,
):
    LOG2E: tl.constexpr = 1.4426950408889634
    i_m, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh = i_b * HC + i_h
    o_m = tl.arange(0, BS)
    o_d = tl.arange(0, D)
    o_tq = i_m * BS + o_m
    m_tq = o_tq < T
    b_q = tl.load(Q + i_b * sq_b + i_h * sq_h + o_tq[:, None] * sq_t + o_d[None, :], mask=m_tq[:, None], other=0.0)
    b_do = tl.load(DO + i_b * sdo_b + i_h * sdo_h + o_tq[:, None] * sdo_t + o_d[None, :], mask=m_tq[:, None],
                   other=0.0)
    # rows past T get an infinite denominator: every weight of theirs is exactly 0
    b_lse = tl.load(LSE + i_bh * T + o_tq, mask=m_tq, other=float("inf"))  # [BS], log2 units
    b_delta = tl.load(DELTA + i_bh * T + o_tq, mask=m_tq, other=0.0)
    b_dq = tl.zeros([BS, D], dtype=tl.float32)
    if PWT:
        # q2_i = mean_t q_t^2: dq_t += (2 / n_i) q_t * dq2_i (dq2 from the gated dw, bwd host); folded into the
        # accumulator up front (it is scaled by s at the end), so q is not needed elementwise after the loops
        cnt_q = tl.minimum(T - i_m * BS, BS).to(tl.float32)
        b_dq2 = tl.load(DQ2 + (i_bh * N + i_m) * D + o_d)  # [D] float32
        b_dq += b_q.to(tl.float32) * (b_dq2 * (2.0 / (cnt_q * scale)))[None, :]

    # exact blocks S_i (ascending row list)
    p_k = K + i_b * sk_b + i_h * sk_h
    p_v = V + i_b * sv_b + i_h * sv_h
    r0 = tl.load(ROW_OFF + i_bh * N + i_m)
    r1 = tl.load(ROW_OFF + i_bh * N + i_m + 1)
    for r in range(r0, r1):
        b_j = tl.load(ROW_J + r)
        o_tk = b_j * BS + o_m
        m_k = o_tk < T
        b_k = tl.load(p_k + o_tk[:, None] * sk_t + o_d[None, :], mask=m_k[:, None], other=0.0)  # [BS, D]
        b_v = tl.load(p_v + o_tk[:, None] * sv_t + o_d[None, :], mask=m_k[:, None], other=0.0)
        b_s = tl.dot(b_q, tl.trans(b_k)) * qk_scale  # [BS, BS]
        b_p = tl.math.exp2(b_s - b_lse[:, None])
        b_p = tl.where(m_k[None, :], b_p, 0.0)
        b_dp = tl.dot(b_do, tl.trans(b_v))
        b_ds = b_p * (b_dp - b_delta[:, None])
        b_dq += tl.dot(b_ds.to(b_k.dtype), b_k)

    if APPROX:
        b_cz = tl.load(CZ + i_bh * T + o_tq, mask=m_tq, other=0.0)  # [BS]  s do . (q H-bar), _rows_kernel
        b_g = tl.zeros([BS], dtype=tl.float32)
        o_v = tl.arange(0, BLOCK_V)
        p_vb = VBIAS + (i_bh * N + i_m) * N
        p_kbar = KBAR + i_bh * N * D
        p_vmean = VMEAN + i_bh * N * D
        n_last = (T - (N - 1) * BS) * 1.0
        for v0 in range(0, N_VIRT, BLOCK_V):
            o_j = v0 + o_v
            m_j = o_j < N
            b_kb = tl.load(p_kbar + o_j[:, None] * D + o_d[None, :], mask=m_j[:, None], other=0.0)  # [BV, D]
            b_bias = tl.load(p_vb + o_j, mask=m_j, other=float("-inf")).to(tl.float32)
            b_s = tl.dot(b_q, tl.trans(b_kb)) * qk_scale + (b_bias * LOG2E)[None, :]  # [BS, BV]
            b_p = tl.math.exp2(b_s - b_lse[:, None])  # p^ = e(s-hat) / den; 0 on exact blocks (-inf bias)
            b_cnt = tl.where(o_j == N - 1, n_last, BS * 1.0)
            b_vm = tl.load(p_vmean + o_j[:, None] * D + o_d[None, :], mask=m_j[:, None], other=0.0)
            b_dpv = tl.dot(b_do, tl.trans(b_vm)) * b_cnt[None, :]  # do . V-hat_j
            b_ds = b_p * (b_dpv + b_cz[:, None] - b_cnt[None, :] * b_delta[:, None])
            b_dq += tl.dot(b_ds.to(b_kb.dtype), b_kb)
            b_g += tl.sum(b_p, axis=1)
        b_dq = b_dq * scale
        # first-order term: dz_t = s G_t do_t, dq_t += dz_t H-bar^T (H-bar loaded again: a [D, D] tile held
        # across the loop would only cost registers)
        b_hb = tl.load(HBAR + i_bh * D * D + o_d[:, None] * D + o_d[None, :])
        b_dq += tl.dot(b_do, tl.trans(b_hb)) * (scale * tl.load(HSCALE + i_bh) * b_g)[:, None]
        tl.store(GSUM + i_bh * T + o_tq, b_g, mask=m_tq)
    else:
        b_dq = b_dq * scale
    tl.store(DQ + i_b * sdq_b + i_h * sdq_h + o_tq[:, None] * sdq_t + o_d[None, :], b_dq.to(DQ.dtype.element_ty),
             mask=m_tq[:, None])


@triton.jit
def _dh_kernel(
    Q, DO, GSUM, DH, sq_b, sq_h, sq_t, sdo_b, sdo_h, sdo_t, HC, T, N, G, scale,
    D: tl.constexpr, BS: tl.constexpr,
):
    """dH = s sum_t G_t q_t^T do_t over G query blocks per program, one atomic add of the [D, D] partial."""
    i_g, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh = i_b * HC + i_h
    o_m = tl.arange(0, BS)
    o_d = tl.arange(0, D)
    b_acc = tl.zeros([D, D], dtype=tl.float32)
    j0 = i_g * G
    j1 = tl.minimum(j0 + G, N)
    for j in range(j0, j1):
        o_t = j * BS + o_m
        m_t = o_t < T
        b_q = tl.load(Q + i_b * sq_b + i_h * sq_h + o_t[:, None] * sq_t + o_d[None, :], mask=m_t[:, None], other=0.0)
        b_do = tl.load(DO + i_b * sdo_b + i_h * sdo_h + o_t[:, None] * sdo_t + o_d[None, :], mask=m_t[:, None],
                       other=0.0)
        b_gs = tl.load(GSUM + i_bh * T + o_t, mask=m_t, other=0.0)
        b_qg = (b_q.to(tl.float32) * b_gs[:, None]).to(b_q.dtype)
        b_acc += tl.dot(tl.trans(b_qg), b_do)  # [D, BS] x [BS, D]
    tl.atomic_add(DH + i_bh * D * D + o_d[:, None] * D + o_d[None, :], b_acc * scale)


@triton.jit
def _virt_kernel(
    Q, DO, LSE, DELTA, CZ, KBAR, VMEAN, VBIAS, DKBAR, DVHAT, DW,
    sq_b, sq_h, sq_t, sdo_b, sdo_h, sdo_t,
    HC, T, N, QB_PER_PROG, qk_scale, scale,
    D: tl.constexpr, BS: tl.constexpr, BLOCK_V: tl.constexpr, ATOMIC: tl.constexpr, PWT: tl.constexpr,
):
    """dkbar_j = s sum_t ds_tj q_t and dV^_j = sum_t p^_tj do_t for BLOCK_V virtual tokens j, over the query
    blocks [i0, i0 + QB_PER_PROG) of this program (atomic adds when several programs share a tile); for pwt
    also the ungated dw_ij = sum_{t in i} ds_tj (each (i, j) written by exactly one program)."""
    LOG2E: tl.constexpr = 1.4426950408889634
    i_v, i_s, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b = i_bh // HC
    i_h = i_bh % HC
    o_m = tl.arange(0, BS)
    o_d = tl.arange(0, D)
    o_j = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    m_j = o_j < N
    b_kb = tl.load(KBAR + (i_bh * N + o_j[:, None]) * D + o_d[None, :], mask=m_j[:, None], other=0.0)  # [BV, D]
    b_vm = tl.load(VMEAN + (i_bh * N + o_j[:, None]) * D + o_d[None, :], mask=m_j[:, None], other=0.0)
    n_last = (T - (N - 1) * BS) * 1.0
    b_cnt = tl.where(o_j == N - 1, n_last, BS * 1.0)
    b_dkb = tl.zeros([BLOCK_V, D], dtype=tl.float32)
    b_dvh = tl.zeros([BLOCK_V, D], dtype=tl.float32)
    i0 = i_s * QB_PER_PROG
    i1 = tl.minimum(i0 + QB_PER_PROG, N)
    for i in range(i0, i1):
        b_bias = tl.load(VBIAS + (i_bh * N + i) * N + o_j, mask=m_j, other=float("-inf")).to(tl.float32)  # [BV]
        o_t = i * BS + o_m
        m_t = o_t < T
        b_q = tl.load(Q + i_b * sq_b + i_h * sq_h + o_t[:, None] * sq_t + o_d[None, :], mask=m_t[:, None], other=0.0)
        b_do = tl.load(DO + i_b * sdo_b + i_h * sdo_h + o_t[:, None] * sdo_t + o_d[None, :], mask=m_t[:, None],
                       other=0.0)
        b_lse = tl.load(LSE + i_bh * T + o_t, mask=m_t, other=float("inf"))
        b_delta = tl.load(DELTA + i_bh * T + o_t, mask=m_t, other=0.0)
        b_cz = tl.load(CZ + i_bh * T + o_t, mask=m_t, other=0.0)
        b_st = tl.dot(b_kb, tl.trans(b_q)) * qk_scale + (b_bias * LOG2E)[:, None]  # [BV, BS]
        b_pt = tl.math.exp2(b_st - b_lse[None, :])
        b_dpvt = tl.dot(b_vm, tl.trans(b_do)) * b_cnt[:, None]
        b_dst = b_pt * (b_dpvt + b_cz[None, :] - b_cnt[:, None] * b_delta[None, :])
        b_dkb += tl.dot(b_dst.to(b_q.dtype), b_q)
        b_dvh += tl.dot(b_pt.to(b_do.dtype), b_do)
        if PWT:
            tl.store(DW + (i_bh * N + i) * N + o_j, tl.sum(b_dst, axis=1), mask=m_j)
    b_dkb = b_dkb * scale
    p_o = (i_bh * N + o_j[:, None]) * D + o_d[None, :]
    if ATOMIC:
        tl.atomic_add(DKBAR + p_o, b_dkb, mask=m_j[:, None])
        tl.atomic_add(DVHAT + p_o, b_dvh, mask=m_j[:, None])
    else:
        tl.store(DKBAR + p_o, b_dkb, mask=m_j[:, None])
        tl.store(DVHAT + p_o, b_dvh, mask=m_j[:, None])


@triton.jit
def _dkdv_kernel(
    Q, K, V, DO, DK, DV, LSE, DELTA, COL_OFF, COL_I, DKBAR, DVHAT, DSIG2, DH,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sdo_b, sdo_h, sdo_t,
    sdk_b, sdk_h, sdk_t, sdv_b, sdv_h, sdv_t,
    HC, T, N, qk_scale, scale,
    D: tl.constexpr, BS: tl.constexpr, APPROX: tl.constexpr, PWT: tl.constexpr,
):
    i_n, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh = i_b * HC + i_h
    o_m = tl.arange(0, BS)
    o_d = tl.arange(0, D)
    o_tk = i_n * BS + o_m
    m_tk = o_tk < T
    b_k = tl.load(K + i_b * sk_b + i_h * sk_h + o_tk[:, None] * sk_t + o_d[None, :], mask=m_tk[:, None], other=0.0)
    b_v = tl.load(V + i_b * sv_b + i_h * sv_h + o_tk[:, None] * sv_t + o_d[None, :], mask=m_tk[:, None], other=0.0)
    b_dk = tl.zeros([BS, D], dtype=tl.float32)
    b_dv = tl.zeros([BS, D], dtype=tl.float32)
    if APPROX:
        # the statistics' chain terms for every token of this block (exact for some query rows or not), put
        # into the accumulators up front, where registers are free (dk is scaled by s at the end)
        cnt = tl.minimum(T - i_n * BS, BS).to(tl.float32)
        o_s = (i_bh * N + i_n) * D + o_d
        b_kf = b_k.to(tl.float32)
        b_kc = tl.where(m_tk[:, None], b_kf - (tl.sum(b_kf, axis=0) / cnt)[None, :], 0.0)  # k - kbar_j
        b_dk += tl.where(m_tk[:, None], (tl.load(DKBAR + o_s) / (cnt * scale))[None, :], 0.0)
        if PWT:
            b_dk += b_kc * (tl.load(DSIG2 + o_s) * (2.0 / (cnt * scale)))[None, :]
        # [D, D] float32 dH, multiplied in the input dtype on the tensor cores (like H-bar in the forward)
        b_dh = tl.load(DH + i_bh * D * D + o_d[:, None] * D + o_d[None, :]).to(b_k.dtype)
        inv_n = 1.0 / N
        b_dv += tl.dot(b_kc.to(b_k.dtype), b_dh) * inv_n
        b_vf = b_v.to(tl.float32)
        b_vc = tl.where(m_tk[:, None], b_vf - (tl.sum(b_vf, axis=0) / cnt)[None, :], 0.0)  # v - vbar_j
        b_dv += tl.where(m_tk[:, None], tl.load(DVHAT + o_s)[None, :], 0.0)
        b_dk += tl.dot(b_vc.to(b_k.dtype), tl.trans(b_dh)) * (inv_n / scale)
    p_q = Q + i_b * sq_b + i_h * sq_h
    p_do = DO + i_b * sdo_b + i_h * sdo_h
    # the query blocks i with this KV block in S_i (ascending column list)
    c0 = tl.load(COL_OFF + i_bh * N + i_n)
    c1 = tl.load(COL_OFF + i_bh * N + i_n + 1)
    for c in range(c0, c1):
        b_i = tl.load(COL_I + c)
        o_tq = b_i * BS + o_m
        m_tq = o_tq < T
        b_q = tl.load(p_q + o_tq[:, None] * sq_t + o_d[None, :], mask=m_tq[:, None], other=0.0)  # [BS, D]
        b_do = tl.load(p_do + o_tq[:, None] * sdo_t + o_d[None, :], mask=m_tq[:, None], other=0.0)
        b_lse = tl.load(LSE + i_bh * T + o_tq, mask=m_tq, other=float("inf"))
        b_delta = tl.load(DELTA + i_bh * T + o_tq, mask=m_tq, other=0.0)
        b_st = tl.dot(b_k, tl.trans(b_q)) * qk_scale  # [BS(k), BS(q)]
        b_pt = tl.math.exp2(b_st - b_lse[None, :])
        b_pt = tl.where(m_tk[:, None], b_pt, 0.0)
        b_dv += tl.dot(b_pt.to(b_do.dtype), b_do)
        b_dpt = tl.dot(b_v, tl.trans(b_do))
        b_dst = b_pt * (b_dpt - b_delta[None, :])
        b_dk += tl.dot(b_dst.to(b_q.dtype), b_q)
    b_dk = b_dk * scale
    tl.store(DK + i_b * sdk_b + i_h * sdk_h + o_tk[:, None] * sdk_t + o_d[None, :], b_dk.to(DK.dtype.element_ty),
             mask=m_tk[:, None])
    tl.store(DV + i_b * sdv_b + i_h * sdv_h + o_tk[:, None] * sdv_t + o_d[None, :], b_dv.to(DV.dtype.element_ty),
             mask=m_tk[:, None])


def _configs(pairs):
    if _INTERPRET:
        return [triton.Config({}, num_warps=4, num_stages=1)]
    # not yet timed on the H200 (bench/train_step.py is the measurement): the autotuner picks among these on the
    # first shape seen, per (head_dim, variant family). sm_90a ptxas at D 128 (tests/triton_aot_case.py): at 4 warps
    # the dq kernel spills 200-650 bytes (pisa / pwt) and the dk/dv kernel 2 KB (pwt); at 8 warps <= 12 and 0
    return [triton.Config({}, num_warps=w, num_stages=st) for w, st in pairs]


def _virt_configs():
    if _INTERPRET:
        return [triton.Config({"BLOCK_V": 64}, num_warps=4, num_stages=1)]
    # sm_90a ptxas (tests/triton_aot_case.py): BLOCK_V 64 spills ~100 bytes at 8 warps, 32 none; 32 re-reads q
    # and do twice as often. Not yet timed: the autotuner decides
    return [triton.Config({"BLOCK_V": bv}, num_warps=w, num_stages=st) for bv, w, st in ((32, 8, 2), (64, 8, 2), (32, 4, 2))]


_KEY = ["D", "APPROX", "PWT"]
# triton's Autotuner keeps the launch in flight on itself: one thread at a time in these (several GPUs of one
# process each run their backward in their own autograd thread)
_tune_lock = threading.Lock()
_dq_tuned = triton.autotune(configs=_configs(((8, 2), (8, 3), (4, 2))), key=_KEY)(_dq_kernel)
_dkdv_tuned = triton.autotune(configs=_configs(((8, 2), (8, 3), (4, 2))), key=_KEY)(_dkdv_kernel)
# atomic adds into dkbar / dV^ when programs share a tile: zeroed before every benchmark run and the final one
_virt_tuned = triton.autotune(configs=_virt_configs(), key=["D", "PWT", "ATOMIC"],
                              reset_to_zero=["DKBAR", "DVHAT"])(_virt_kernel)


def _n_sm(device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def block_lists(vbias: torch.Tensor):
    """The exact sets as row and column lists (CSR) from the forward's bias rows (-inf = exact block).

    vbias [B, HC, N, N] -> (row_off [B*HC*N + 1], row_j, col_off [B*HC*N + 1], col_i, has_virtual): row
    (b, h, i) holds the KV blocks j in S_i ascending, column (b, h, j) the query blocks i with j in S_i,
    ascending. One host sync (the number of exact pairs)."""
    B, HC, n, _ = vbias.shape
    exact = vbias == float("-inf")
    nz = torch.nonzero(exact.view(-1, n))  # [nnz, 2] = (b*HC*N + i, j), row-major order
    rows, j = nz[:, 0], nz[:, 1]
    row_cnt = exact.sum(-1).view(-1)
    col_cnt = exact.sum(-2).view(-1)
    zero = torch.zeros(1, device=vbias.device, dtype=torch.int64)
    row_off = torch.cat([zero, row_cnt.cumsum(0)]).to(torch.int32)
    col_off = torch.cat([zero, col_cnt.cumsum(0)]).to(torch.int32)
    bh = rows // n
    i = rows % n
    order = torch.sort((bh * n + j) * n + i).indices
    col_i = i[order].to(torch.int32)
    has_virtual = nz.shape[0] < exact.numel()
    return row_off, j.to(torch.int32), col_off, col_i, has_virtual


def _mark(prof, name):
    """Record a CUDA event after the stage `name` (bench/train_step.py's breakdown); no-op without `prof`."""
    if prof is not None:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        prof.append((name, ev))


def attention_backward(do, q, k, v, o, lse, vbias, st, cfg, dq, dk, dv, prof=None):
    """dq, dk, dv (written in place, [B, HC, T, D] views) of one head chunk.

    lse: float32 [B, HC, T] (fwd.attention(..., lse=)), vbias [B, HC, N, N] contiguous (the forward's bias
    rows), st: the forward's statistics (kbar_lp, vmean_lp, hbar_lp and its per-head scale hbar_scale
    [B, HC] float32; q2, ksig2 for pwt), all contiguous.
    prof: optional list that receives (stage, CUDA event) pairs, for timing the stages."""
    B, HC, T, D = q.shape
    bs = cfg.block_size
    n = -(-T // bs)
    s = float(cfg.scale)
    qk_scale = s * 1.4426950408889634
    half_s2 = 0.5 * s * s
    ln_b = math.log(bs)
    dev = q.device
    f32 = torch.float32
    approx = cfg.variant in ("pisa", "pwt")
    pwt = cfg.variant == "pwt"
    _mark(prof, "start")
    row_off, row_j, col_off, col_i, has_virtual = block_lists(vbias)
    _mark(prof, "block_lists")
    # no virtual token anywhere (density 1): the approximate branch contributes nothing, G = 0
    approx = approx and has_virtual
    pwt = pwt and approx
    n_virt = n if approx else 0

    delta = torch.empty(B, HC, T, device=dev, dtype=f32)
    cz = torch.empty(B, HC, T, device=dev, dtype=f32) if approx else delta
    hbar = st.hbar_lp if approx else delta
    hscale = st.hbar_scale if approx else delta  # [B, HC] float32: H-bar = hbar_lp * hscale
    _rows_kernel[(n, HC, B)](
        q, o, do, hbar, hscale, delta, cz, q.stride(0), q.stride(1), q.stride(2), o.stride(0), o.stride(1), o.stride(2),
        do.stride(0), do.stride(1), do.stride(2), HC, T, s, D=D, BS=bs, APPROX=approx,
        num_warps=4 if _INTERPRET else 8, num_stages=1)
    _mark(prof, "rows")

    dummy = delta
    if approx:
        dkbar = torch.zeros(B, HC, n, D, device=dev, dtype=f32)
        dvhat = torch.zeros(B, HC, n, D, device=dev, dtype=f32)
        dw = torch.empty(B, HC, n, n, device=dev, dtype=f32) if pwt else dummy
        # enough programs to fill the GPU: the query blocks are split over programs (atomic adds) when the
        # tiles of virtual tokens alone are too few (counted at 64 tokens per tile)
        tiles = triton.cdiv(n, 64) * B * HC
        split = max(1, min(n, math.ceil(2 * _n_sm(dev) / tiles)))
        per = triton.cdiv(n, split)
        split = triton.cdiv(n, per)
        with _tune_lock:
            _virt_tuned[lambda meta: (triton.cdiv(n, meta["BLOCK_V"]), split, B * HC)](
                q, do, lse, delta, cz, st.kbar_lp, st.vmean_lp, vbias, dkbar, dvhat, dw,
                q.stride(0), q.stride(1), q.stride(2), do.stride(0), do.stride(1), do.stride(2),
                HC, T, n, per, qk_scale, s, D=D, BS=bs, ATOMIC=split > 1, PWT=pwt)
        _mark(prof, "virtual")
        if pwt:
            # the gate in float32 from the same statistics the forward's w came from (a NaN w is gated too);
            # dw is zero on exact blocks already (p^ = 0 there)
            w = torch.matmul(st.q2, st.ksig2.transpose(-1, -2)).mul_(half_s2)
            dw.masked_fill_(~(w <= ln_b), 0.0)
            del w
            dq2 = torch.matmul(dw, st.ksig2).mul_(half_s2)  # [B, HC, N, D]
            dsig2 = torch.matmul(dw.transpose(-1, -2), st.q2).mul_(half_s2)
        else:
            dq2 = dsig2 = dkbar
        _mark(prof, "gate_dq2_dsig2")
    else:
        dkbar = dvhat = dq2 = dsig2 = dummy

    gsum = torch.empty(B, HC, T, device=dev, dtype=f32) if approx else dummy
    with _tune_lock:
        _dq_tuned[(n, HC, B)](
            q, k, v, do, dq, lse, delta, row_off, row_j,
            st.kbar_lp if approx else dummy, st.vmean_lp if approx else dummy, hbar, hscale, vbias, dq2, gsum, cz,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
            dq.stride(0), dq.stride(1), dq.stride(2),
            HC, T, n, n_virt, qk_scale, s,
            D=D, BS=bs, BLOCK_V=64, APPROX=approx, PWT=pwt)
    _mark(prof, "dq")

    if approx:
        dh = torch.zeros(B, HC, D, D, device=dev, dtype=f32)
        g = max(1, math.ceil(n * B * HC / (4 * _n_sm(dev))))
        _dh_kernel[(triton.cdiv(n, g), HC, B)](
            q, do, gsum, dh, q.stride(0), q.stride(1), q.stride(2), do.stride(0), do.stride(1), do.stride(2),
            HC, T, n, g, s, D=D, BS=bs, num_warps=1 if _INTERPRET else 8, num_stages=1 if _INTERPRET else 2)
        _mark(prof, "dh")
    else:
        dh = dummy
    with _tune_lock:
        _dkdv_tuned[(n, HC, B)](
            q, k, v, do, dk, dv, lse, delta, col_off, col_i, dkbar, dvhat, dsig2, dh,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
            dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
            HC, T, n, qk_scale, s, D=D, BS=bs, APPROX=approx, PWT=pwt)
    _mark(prof, "dkdv")
    return dq, dk, dv

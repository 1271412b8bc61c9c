"""Routing in two Triton kernels, for any block count up to 16384 (1M tokens): scores, then top-k selection.

1. `_scores_kernel`, one program per [64 x 64] tile of (query block, KV block) pairs of one (batch, head):
   score = s qbar.kbar (+ log(hnorm + 1e-6)) (+ min(w, ln Bs) for PWT, w = 1/2 s^2 q2.sigma2) on tensor cores
   (SCORE_PREC: three bfloat16 dots of high / low parts on the GPU, ~1e-5 relative; 3xTF32, float32-accurate,
   on request; plain float32 under the interpreter), NaN/inf scores clamped, forced blocks
   (band, sinks) at +inf; writes the float32 score and the virtual-token bias row (the gated w, 0 for PISA).
   Its tile (0, 0) also reduces the statistics' H_j partials into H-bar (float32 and input dtype).
2. the select kernel, per query block the K_i = max(k, #forced) best by a bit search for the K_i-th largest
   order-preserving key (ties by lower block id); writes the ascending index list (-1 padded) and marks the
   chosen blocks -inf in the bias row. SELECT_IMPL picks it: "pieces" (kernels/triton/select.py: one warp per
   program, one bit per step, the row in one or two power-of-two pieces) or "bits" (`_select_kernel` here:
   ROWS query blocks per 4-warp program over one power-of-two tile, two bits per step).
The scores cost 4 N^2 bytes per (batch, head) of scratch, for one sub-chunk of heads at a time. Measured and
dropped: a select kernel that computes its own scores for N <= 256 (one launch fewer, but its 3xTF32 operand
tiles spilled: FLUX.1 1024^2 routing 0.056 ms); the bfloat16 parts of the score operands split once per call by a
kernel of their own instead of in every tile (session 25, commit 4db87dff; Nsight Compute had F2F at 20% of the
scores kernel's stall samples): bitwise the same lists, but route() with the forward's score budget went 1.070 ->
1.039 ms at Wan2.1-14B 720p, 0.183 -> 0.209 at 480p and 0.056 -> 0.087 at FLUX.1 (the split pass costs more than
the conversions it saves below 720p; 32- and 64-wide slices on the split parts were slower everywhere and round
differently; bench/results/score_presplit_s25_h200.txt); the scores' rows padded to a multiple of 64 floats so that
the scores kernel's stores and the select kernels' loads are aligned vectors (session 25, commit 88f14ae; sm_90a: the
720p select's 40 scalar loads -> 10 LDG.128, 476 -> 306 shuffles, 167 -> 137 registers): bitwise the same, route()
0.979 -> 0.984 ms at 720p (faster in 0 of 5 rounds), 0.182 -> 0.182 at 480p (bench/results/route_pad_s25_h200.txt).
Both routing kernels wait on latency more than they issue: fewer instructions did not buy time.
"""
from __future__ import annotations

import functools
import logging
import math
import os

import torch
import triton
import triton.language as tl

try:
    from triton.runtime.errors import OutOfResources
except ImportError:  # older Triton
    from triton.runtime.autotuner import OutOfResources

from ..config import SparseConfig
from ..routing import forced_mask
from . import route_gl
from .select import _count_ge3, _two_bits
from .stats2 import _bf16_parts

log = logging.getLogger("piecewise_sparse_attention")

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# 3xTF32 on the tensor cores is float32-accurate (the ranking must match the float32 reference up to ties);
# the interpreter computes its dots in numpy float32 anyway
_PREC = "ieee" if _INTERPRET else "tf32x3"
BIAS_SLACK = 64  # elements of the bias storage past its last row (route(): a 64-token virtual tile's overrun)
ROUTE_KERNEL_MAX_N = 16384  # above this, torch routing (the [ROWS, NP2] keys would not fit a program)


@triton.jit
def _dot_bf16x3(a, b, acc, EMU: tl.constexpr):
    """acc + a @ b^T for float32 a [M, K], b [N, K] from three bfloat16 dots of their high / low parts (a = a_hi
    + a_lo + O(2^-17 |a|)): each product within ~2^-16 of |a||b| relative, accumulated in float32, at half the
    tensor time and shared-memory bytes of 3xTF32; the small terms first. EMU (the interpreter, whose bfloat16
    dots are wrong): the same parts as float32, float32 dots."""
    a_hi, a_lo = _bf16_parts(a)
    b_hi, b_lo = _bf16_parts(b)
    if EMU:
        a_hi, a_lo = a_hi.to(tl.float32), a_lo.to(tl.float32)
        b_hi, b_lo = tl.trans(b_hi.to(tl.float32)), tl.trans(b_lo.to(tl.float32))
        acc = tl.dot(a_hi, b_lo, acc, input_precision="ieee")
        acc = tl.dot(a_lo, b_hi, acc, input_precision="ieee")
        return tl.dot(a_hi, b_hi, acc, input_precision="ieee")
    else:
        b_hi, b_lo = tl.trans(b_hi), tl.trans(b_lo)
        acc = tl.dot(a_hi, b_lo, acc)
        acc = tl.dot(a_lo, b_hi, acc)
        return tl.dot(a_hi, b_hi, acc)


@triton.jit
def _score_tile(QBAR, KBAR, Q2, KSIG2, HNORM, i_bh, o_i, o_j, N, band, n_sink, scale, half_s2, ln_b,
                D: tl.constexpr, DK: tl.constexpr, PWT: tl.constexpr, COV: tl.constexpr, PREC: tl.constexpr,
                SPLIT: tl.constexpr = 0, OFF64: tl.constexpr = 0):
    """(rank score with forced blocks at +inf, gated w) of the (o_i, o_j) pairs of one (batch, head); the
    D-long dot products in DK-wide slices (float32 operand tiles stay small: no spills). SPLIT = 1: the dots
    as three bfloat16 dots (_dot_bf16x3) instead of tl.dot at PREC."""
    o_k = tl.arange(0, DK)
    m_i = o_i < N
    m_j = o_j < N
    if OFF64:  # int64 offset tiles from the tensors' start
        p_r = (i_bh * N + o_i)[:, None].to(tl.int64) * D + o_k[None, :]
        p_c = (i_bh * N + o_j)[:, None].to(tl.int64) * D + o_k[None, :]
    else:  # one int64 base per (batch, head), int32 offsets (N * D < 2^31)
        h_off = (i_bh * N).to(tl.int64) * D
        QBAR += h_off
        KBAR += h_off
        Q2 += h_off
        KSIG2 += h_off
        p_r = o_i[:, None] * D + o_k[None, :]
        p_c = o_j[:, None] * D + o_k[None, :]
    b_s = tl.zeros([o_i.shape[0], o_j.shape[0]], dtype=tl.float32)
    b_w = tl.zeros([o_i.shape[0], o_j.shape[0]], dtype=tl.float32)
    for d0 in range(0, D, DK):
        b_a = tl.load(QBAR + p_r + d0, mask=m_i[:, None], other=0.0)
        b_b = tl.load(KBAR + p_c + d0, mask=m_j[:, None], other=0.0)
        if SPLIT:
            b_s = _dot_bf16x3(b_a, b_b, b_s, EMU=PREC == "ieee")
        else:
            b_s += tl.dot(b_a, tl.trans(b_b), input_precision=PREC)
        if PWT:
            b_a2 = tl.load(Q2 + p_r + d0, mask=m_i[:, None], other=0.0)
            b_b2 = tl.load(KSIG2 + p_c + d0, mask=m_j[:, None], other=0.0)
            if SPLIT:
                b_w = _dot_bf16x3(b_a2, b_b2, b_w, EMU=PREC == "ieee")
            else:
                b_w += tl.dot(b_a2, tl.trans(b_b2), input_precision=PREC)
    b_s = b_s * scale
    if COV:
        b_hn = tl.load(HNORM + i_bh * N + o_j, mask=m_j, other=1.0)
        b_s += tl.log(b_hn + 1e-6)[None, :]
    if PWT:
        b_w = b_w * half_s2
        b_s += tl.minimum(b_w, ln_b)
        b_vb = tl.where(b_w <= ln_b, b_w, 0.0)  # gates a NaN w too, like kernels.routing.pwt_bonus
    else:
        b_vb = b_w
    # NaN/inf in the inputs must not break the ranking
    b_s = tl.where(b_s != b_s, -1e30, b_s)
    b_s = tl.minimum(tl.maximum(b_s, -1e30), 1e30)
    d_ij = o_i[:, None] - o_j[None, :]
    forced = ((d_ij <= band) & (d_ij >= -band)) | (o_j[None, :] < n_sink)
    b_s = tl.where(forced, float("inf"), b_s)
    return b_s, b_vb


@triton.jit
def _final_hbar(HPART, HBAR, HBAR_LP, i_bh, NPART, inv_n, t, P, D: tl.constexpr, RB: tl.constexpr):
    """H-bar of one (batch, head) = inv_n * the sum of its statistics programs' partials; program t of the
    head's P programs reduces the row slices t, t + P, ... of RB rows each."""
    o_r = tl.arange(0, RB)
    o_d = tl.arange(0, D)
    for s0 in range(t * RB, D, P * RB):
        p_rc = (s0 + o_r)[:, None] * D + o_d[None, :]
        b_h = tl.zeros([RB, D], dtype=tl.float32)
        for p in range(0, NPART):
            b_h += tl.load(HPART + (i_bh * NPART + p).to(tl.int64) * D * D + p_rc)
        b_h = b_h * inv_n
        tl.store(HBAR + i_bh.to(tl.int64) * D * D + p_rc, b_h)
        tl.store(HBAR_LP + i_bh.to(tl.int64) * D * D + p_rc, b_h.to(HBAR_LP.dtype.element_ty))


@triton.jit
def _final_hbar_kernel(HPART, HBAR, HBAR_LP, NPART, inv_n, D: tl.constexpr, RB: tl.constexpr):
    """H-bar of (batch, head) program_id(0) from its partials, the rows split over program_id(1): the scores
    kernel's FINAL_H step on its own (the same function: the same sums), for route_gl's Gluon scores."""
    _final_hbar(HPART, HBAR, HBAR_LP, tl.program_id(0), NPART, inv_n, tl.program_id(1), tl.num_programs(1), D=D,
                RB=RB)


@triton.jit
def _scores_kernel(
    QBAR, KBAR, Q2, KSIG2, HNORM, SCORE, VBIAS, HPART, HBAR, HBAR_LP,
    N, NPART, HC, H0, HSUB, band, n_sink, scale, half_s2, ln_b, inv_n,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DK: tl.constexpr, PWT: tl.constexpr, COV: tl.constexpr,
    FINAL_H: tl.constexpr, PREC: tl.constexpr, SPLIT: tl.constexpr, OFF64: tl.constexpr = 0,
):
    # heads H0 .. H0 + HSUB of every batch element; the scores are those of this sub-chunk only
    i_m, i_n, i_loc = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh = (i_loc // HSUB) * HC + H0 + i_loc % HSUB
    o_i = i_m * BM + tl.arange(0, BM)
    o_j = i_n * BN + tl.arange(0, BN)
    b_s, b_vb = _score_tile(QBAR, KBAR, Q2, KSIG2, HNORM, i_bh, o_i, o_j, N, band, n_sink, scale, half_s2,
                            ln_b, D=D, DK=DK, PWT=PWT, COV=COV, PREC=PREC, SPLIT=SPLIT, OFF64=OFF64)
    m_ij = (o_i < N)[:, None] & (o_j < N)[None, :]
    if OFF64:
        o_ij = o_i[:, None].to(tl.int64) * N + o_j[None, :]
    else:
        o_ij = o_i[:, None] * N + o_j[None, :]  # int32: N^2 < 2^31
    tl.store(SCORE + i_loc.to(tl.int64) * N * N + o_ij, b_s, mask=m_ij)
    tl.store(VBIAS + i_bh.to(tl.int64) * N * N + o_ij, b_vb.to(VBIAS.dtype.element_ty), mask=m_ij)
    if FINAL_H:
        _final_hbar(HPART, HBAR, HBAR_LP, i_bh, NPART, inv_n, i_m * tl.num_programs(1) + i_n,
                    tl.num_programs(0) * tl.num_programs(1), D=D, RB=16)


@triton.jit
def _select_kernel(
    SCORE, IDX, VBIAS,
    N, NSEL, HC, H0, HSUB, k_budget, band, n_sink,
    NP2: tl.constexpr, ROWS: tl.constexpr, KP2: tl.constexpr,
):
    i_r, i_loc = tl.program_id(0), tl.program_id(1)
    i_bh = (i_loc // HSUB) * HC + H0 + i_loc % HSUB
    o_i = i_r * ROWS + tl.arange(0, ROWS)
    m_i = o_i < N
    o_j = tl.arange(0, NP2)
    m_j = o_j < N
    # only the keys stay live through the search: offsets, masks and the forced set are rebuilt after it
    # (fewer registers, more programs per SM; the search is a latency-bound chain of block reductions)
    b_s = tl.load(SCORE + (i_loc.to(tl.int64) * N + o_i)[:, None] * N + o_j[None, :],
                  mask=m_i[:, None] & m_j[None, :], other=float("-inf"))
    b_s = tl.where(m_j[None, :], b_s, float("-inf"))
    d_ij = o_i[:, None] - o_j[None, :]
    forced = (((d_ij <= band) & (d_ij >= -band)) | (o_j[None, :] < n_sink)) & m_j[None, :]
    n_forced = tl.sum(forced.to(tl.int32), axis=1)
    k_i = tl.maximum(n_forced, k_budget)  # [ROWS]
    # order-preserving unsigned key of a float32
    b_bits = b_s.to(tl.int32, bitcast=True)
    b_key = (b_bits ^ ((b_bits >> 31) | (-2147483647 - 1))).to(tl.uint32, bitcast=True)
    # largest t with #(key >= t) >= k_i, built from the top bit down two bits per step: the counts of the three
    # candidates t | 01, t | 10, t | 11 travel in one int64 sum (16-bit fields: NP2 <= 16384), so a step costs
    # one block reduction. The search stops as soon as every row's #(key >= t) is exactly k_i (the chosen set
    # is then known: typically ~20 of the 32 bits for float scores, ~10 steps)
    b_t = tl.zeros([ROWS], dtype=tl.uint32)
    b_n = tl.full([ROWS], NP2, dtype=tl.int32)  # #(key >= b_t): every key is >= 0
    bit = 30  # the lower bit of the pair
    todo = tl.max((b_n != k_i).to(tl.int32), axis=0)
    while (bit >= 0) & (todo > 0):
        one = tl.full([ROWS], 1, dtype=tl.uint32) << bit.to(tl.uint32)
        c1 = b_t | one
        c2 = b_t | (one << 1)
        c3 = c2 | one
        b_t, b_n = _two_bits(_count_ge3(b_key, c1, c2, c3), b_t, b_n, c1, c2, c3, k_i)
        todo = tl.max((b_n != k_i).to(tl.int32), axis=0)
        bit -= 2
    m_ij = m_i[:, None] & (o_j < N)[None, :]
    gt = b_key > b_t[:, None]
    eq = b_key == b_t[:, None]
    n_gt = tl.sum(gt.to(tl.int32), axis=1)
    n_eq = tl.sum(eq.to(tl.int32), axis=1)
    take = k_i - n_gt  # how many of the blocks tied at the threshold are kept
    if tl.max(n_eq - take, axis=0) > 0:
        # a real tie across the threshold (rare): keep the lowest block ids among the tied
        sel = (gt | (eq & (tl.cumsum(eq.to(tl.int32), axis=1) <= take[:, None]))) & m_ij
    else:
        sel = (gt | eq) & m_ij
    pos = tl.cumsum(sel.to(tl.int32), axis=1) - 1
    p_idx = IDX + (i_bh * N + o_i)[:, None].to(tl.int64) * NSEL
    tl.store(p_idx + pos, o_j[None, :] + 0 * pos, mask=sel)
    o_k = tl.arange(0, KP2)
    tl.store(p_idx + o_k[None, :], tl.full([ROWS, KP2], -1, tl.int32),
             mask=m_i[:, None] & (o_k[None, :] >= k_i[:, None]) & (o_k[None, :] < NSEL))
    p_o = VBIAS + (i_bh.to(tl.int64) * N + o_i)[:, None] * N + o_j[None, :]
    tl.store(p_o, tl.full([ROWS, NP2], float("-inf"), tl.float32).to(VBIAS.dtype.element_ty), mask=sel)


def _select(score, idx, vbias, n, kmax, HC, h0, hs, k, common, programs):
    """The select kernel SELECT_IMPL names over the scores of heads h0 .. h0 + hs (`programs` of them)."""
    kp2 = max(16, triton.next_power_of_2(kmax))
    if SELECT_IMPL == "pieces":
        from . import select as ks
        na, nb, rows, warps = ks.pieces_shape(n)
        ks._select_pieces_kernel[(triton.cdiv(n, rows), programs)](
            score, idx, vbias, n, kmax, HC, h0, hs, k, *common,
            NA=na, NB=nb, ROWS=rows, KP2=kp2, BITS=ks.SELECT_BITS, INTERP=ks.search_steps(), num_warps=warps,
            **({"maxnreg": ks.SELECT_MAXNREG} if ks.SELECT_MAXNREG and not _INTERPRET else {}),
        )
    else:
        np2, rows, warps = _select_shape(n)
        _select_kernel[(triton.cdiv(n, rows), programs)](
            score, idx, vbias, n, kmax, HC, h0, hs, k, *common, NP2=np2, ROWS=rows, KP2=kp2, num_warps=warps,
        )


def bias_dtype(dtype: torch.dtype) -> torch.dtype:
    """Storage of the per-(query block, KV block) virtual-token bias: -inf marks an exact block, else the
    gated PWT bonus w (0 for PISA). float16 for 16-bit inputs (w <= ln Bs, so the rounding is <= 2e-3 in
    the logit); float32 otherwise."""
    return torch.float16 if dtype in (torch.float16, torch.bfloat16) else torch.float32


@functools.lru_cache(maxsize=256)
def _max_forced(n: int, band: int, n_sink: int) -> int:
    return int(forced_mask(n, n, band, n_sink, "cpu").sum(-1).max())


_route_failed = False


def route_in_kernel(n: int) -> bool:
    """Whether route() takes the Triton kernels for N KV blocks, or torch."""
    return n <= ROUTE_KERNEL_MAX_N and not _route_failed


def kernel_scratch_bytes(n: int) -> int:
    """Bytes per (batch, head) the kernel routing allocates beyond its outputs: the float32 scores."""
    return 4 * n * n


def set_route_failed(e) -> None:
    global _route_failed
    _route_failed = True
    log.warning("piecewise_sparse_attention: triton routing kernel out of resources (%s); routing with "
                "torch.topk from now on", str(e)[:160])


# tuning knobs (bench/pieces.py --sweep, bench/results/pieces_h200.md): keys per select program and its warps.
# 2048 keys at 4 warps: Wan2.1-14B routing 0.255 ms at 480p (8192 keys: 0.40), 2.08 ms at 720p (2.73)
SELECT_KEYS = 2048
SELECT_WARPS = 4
# the scores kernel's D slices and warps (H200, bench/results/pieces_h200.md): the whole D = 128 in one 3xTF32
# dot at 4 warps, although it spills (~1 KB stack per thread, cuobjdump), took 0.135-0.143 ms at Wan2.1-14B 480p
# and 0.75-0.79 ms at 720p; 16-wide slices at 8 warps (158 registers, no stack) took 0.312 and 1.68 ms (an
# unpipelined chain of small loads and dots). The interpreter keeps 16-wide slices: its numpy dot rounds the
# 128-long sums differently per output column, which breaks exact ties the tests rely on
SCORE_DK = 16 if _INTERPRET else 128
SCORE_WARPS = 4
# the scores kernel's output tile and load pipeline (defaults: 64 x 64, unpipelined). H200 (bench/pieces.py
# --sweep, 2026-12-01 session 6, Wan2.1-14B 720p routing): 64 x 64 at 32-wide slices and 3 stages 1.173 ms vs
# 1.167 default, 128 x 64 1.214, the 8-warp and 64 x 128 configs 1.61-1.76: the defaults stay
SCORE_BM = 64
SCORE_BN = 64
SCORE_STAGES = 1
# int64 offset tiles (True) or int32 offsets from one int64 base per head (False); None: per precision, as measured
# on the H200 (session 13, the scores kernel alone at Wan2.1-14B 720p): 3xTF32 0.67 ms with int64 tiles (which
# spill 352 bytes) against 0.81 with int32 offsets (no spills); bfloat16 x3 0.51 with int32 against 0.56
SCORE_OFF64 = None
# a register cap for the scores kernel (None: ptxas's choice, 253-255 at 4 warps: two programs per SM). H200 (session
# 13, 720p): 128 doubled the 3xTF32 scores' time (1.55 vs 0.82 ms), bfloat16 x3 at D slices of 32 0.55 vs 0.51
SCORE_MAXNREG = None
# the scores' dot products: "tf32x3" (float32-accurate; "ieee" under the interpreter), "bf16x3" (three bfloat16
# dots of high / low parts, ~1e-5 relative per term), "tf32" (one TF32 dot: a timing yardstick, ~5e-4).
# PSA_SCORE_PREC overrides it per call. H200 (bench/probes/route_sweep.py, session 13): the scores at Wan2.1-14B
# 720p 0.82 ms (tf32x3) -> 0.51 (bf16x3); its lists differ from tf32x3's in 69 of 47,280 rows, every swap between
# blocks whose float64 scores lie within 3e-5 of the row's score spread (bfloat16 inputs round the block means
# themselves far more). The interpreter keeps the float32-accurate dots (its bfloat16 conversions do not round
# to nearest; tests/triton_interp_cases.py checks the emulated split separately)
SCORE_PREC = "tf32x3" if _INTERPRET else "bf16x3"


def score_prec() -> str:
    p = os.environ.get("PSA_SCORE_PREC", "").strip() or SCORE_PREC
    if p not in ("tf32x3", "bf16x3", "tf32"):
        raise ValueError(f"PSA_SCORE_PREC={p!r}: expected tf32x3, bf16x3 or tf32")
    return p
# which select kernel: "pieces" (kernels/triton/select.py: one warp per program, the row in one or two
# power-of-two pieces, its own knobs there) or "bits" (_select_kernel above, SELECT_KEYS / SELECT_WARPS)
SELECT_IMPL = "pieces"


def _select_shape(n: int) -> tuple[int, int, int]:
    """(NP2, ROWS, num_warps): each program holds SELECT_KEYS keys (64 per thread at 4 warps); 1 row at least."""
    np2 = max(16, triton.next_power_of_2(n))
    if np2 <= SELECT_KEYS:
        return np2, max(1, min(16, SELECT_KEYS // np2)), SELECT_WARPS
    return np2, 1, max(SELECT_WARPS, 8)


@torch.no_grad()
def route(st, cfg: SparseConfig, dtype: torch.dtype, *, score_bytes: int = 256 * 2**20):
    """(idx [B, HC, Nq, K] int32 ascending, -1 padded; vbias [B, HC, Nq, N] float16/32) for TritonStats `st`;
    also fills st.hbar / st.hbar_lp from st.hpart. Same result as kernels.routing.route up to ties and
    float32 summation order. Compile constants: NP2 (N rounded up to a power of two) and the variant flags."""
    B, HC, n, D = st.kbar.shape
    if not route_in_kernel(n):
        _finalize_torch(st, n, dtype)
        return route_torch(st, cfg, dtype)
    k = cfg.budget(n)
    kmax = max(k, _max_forced(n, cfg.band, cfg.n_sink_blocks))
    dev = st.kbar.device
    pwt = cfg.variant == "pwt"
    cov = bool(cfg.cov_bias)
    idx = torch.empty((B, HC, n, kmax), device=dev, dtype=torch.int32)
    # BIAS_SLACK elements of storage past the end: the CuTe pair kernel's unclamped bias loads (PSA_CUTE_BIAS_SLACK)
    # may read up to 63 columns past a row, which the next row or this slack holds (their values are never used)
    vbias = torch.empty(B * HC * n * n + BIAS_SLACK, device=dev, dtype=bias_dtype(dtype))[:B * HC * n * n].view(
        B, HC, n, n)
    scale = float(cfg.scale)
    dummy = st.kbar
    final_h = st.hpart is not None and not st.hbar_ready
    if final_h:
        st.hbar = torch.empty(B, HC, D, D, device=dev, dtype=torch.float32)
        st.hbar_lp = torch.empty(B, HC, D, D, device=dev, dtype=dtype)
    hargs = (st.hpart, st.hbar, st.hbar_lp) if final_h else (dummy, dummy, dummy)
    npart = st.hpart.shape[2] if final_h else 0
    # the float32 scores exist for one sub-chunk of heads at a time (score_bytes: its budget)
    hsub = max(1, min(HC, int(score_bytes // max(1, B * 4 * n * n))))
    hsub = -(-HC // -(-HC // hsub))  # spread evenly
    score = torch.empty(B * hsub, n, n, device=dev, dtype=torch.float32)
    stat_args = (st.qbar, st.kbar, st.q2 if pwt else dummy, st.ksig2 if pwt else dummy,
                 st.hnorm if cov else dummy)
    common = (cfg.band, cfg.n_sink_blocks)
    prec = score_prec()
    off64 = SCORE_OFF64 if SCORE_OFF64 is not None else prec == "tf32x3"
    regs = {"maxnreg": SCORE_MAXNREG} if SCORE_MAXNREG and not _INTERPRET else {}
    gluon = route_gl.usable(st, cfg, prec)  # PSA_ROUTE_GLUON: the scores as a Gluon kernel on SM90 (route_gl.py)
    try:
        if gluon and final_h:  # H-bar's reduction, which the Triton scores kernel does on the side
            _final_hbar_kernel[(B * HC, D // 16)](*hargs, npart, 1.0 / n, D=D, RB=16)
        for h0 in range(0, HC, hsub):
            hs = min(hsub, HC - h0)
            gluon = gluon and route_gl.scores(
                st, score, vbias, n=n, hc=HC, h0=h0, hs=hs, band=cfg.band, n_sink=cfg.n_sink_blocks, scale=scale,
                half_s2=0.5 * scale * scale, ln_b=math.log(cfg.block_size), pwt=pwt)
            if not gluon:
                _scores_kernel[(triton.cdiv(n, SCORE_BM), triton.cdiv(n, SCORE_BN), B * hs)](
                    *stat_args, score, vbias, *hargs, n, npart, HC, h0, hs, *common, scale, 0.5 * scale * scale,
                    math.log(cfg.block_size), 1.0 / n, D=D, BM=SCORE_BM, BN=SCORE_BN, DK=min(SCORE_DK, D), PWT=pwt,
                    COV=cov, FINAL_H=final_h, PREC=_PREC if prec != "tf32" else prec,
                    SPLIT=int(prec == "bf16x3"), OFF64=int(off64), num_warps=SCORE_WARPS, num_stages=SCORE_STAGES,
                    **regs,
                )
            _select(score, idx, vbias, n, kmax, HC, h0, hs, k, common, B * hs)
    except OutOfResources as e:
        set_route_failed(e)
        _finalize_torch(st, n, dtype)
        return route_torch(st, cfg, dtype)
    if final_h:
        if dtype == torch.float16:  # the kernel's float16 copy can overflow: scaled per head instead
            from .stats import lowp_hbar
            st.hbar_lp, st.hbar_scale = lowp_hbar(st.hbar, dtype)
        st.hbar_ready = True
    return idx, vbias


def _finalize_torch(st, n, dtype):
    from .stats import finalize_hbar
    finalize_hbar(st, n, dtype)


@torch.no_grad()
def route_torch(st, cfg: SparseConfig, dtype: torch.dtype):
    """(idx [B, HC, Nq, K] int32 ascending, -1 padded; vbias [B, HC, Nq, N] view of an N+1 wide buffer).

    The same arithmetic as kernels.routing.route (score, cov_bias, PWT rank bonus, forced band and sinks
    at +inf, top-k with forced blocks inside the budget), without materialising the bool mask and the
    float32 w separately: the virtual-token bias carries both. The fallback above ROUTE_KERNEL_MAX_N.
    """
    scale = float(cfg.scale)
    nq, n = st.qbar.shape[-2], st.kbar.shape[-2]
    score = torch.matmul(st.qbar, st.kbar.transpose(-1, -2)).mul_(scale)  # [B, HC, Nq, N]
    if cfg.cov_bias:
        score.add_(torch.log(st.hnorm + 1e-6)[..., None, :])
    vbias = torch.zeros(*score.shape[:-1], n + 1, device=score.device, dtype=bias_dtype(dtype))
    if cfg.variant == "pwt":
        ln_b = math.log(cfg.block_size)
        w = torch.matmul(st.q2, st.ksig2.transpose(-1, -2)).mul_(0.5 * scale * scale)
        gate = ~(w <= ln_b)  # decided in float32, like the reference (a NaN w is gated too)
        score.add_(w.clamp_(max=ln_b))  # ranking bonus min(w, ln Bs)
        vbias[..., :n].copy_(w.masked_fill_(gate, 0.0))  # where not gated, clamped w == w
        del w, gate
    score = torch.nan_to_num_(score, nan=-1e30, posinf=1e30, neginf=-1e30)
    forced = forced_mask(nq, n, cfg.band, cfg.n_sink_blocks, score.device)
    score.masked_fill_(forced, float("inf"))
    k = cfg.budget(n)
    n_forced = forced.sum(-1)
    kmax = int(max(k, int(n_forced.max())))
    if kmax == k:
        # every row keeps exactly k (forced blocks at +inf are among them): no order needed
        top = torch.topk(score, k, dim=-1, sorted=False).indices
    else:
        top = torch.topk(score, kmax, dim=-1, sorted=True).indices
        keep = torch.arange(kmax, device=top.device) < torch.clamp(n_forced, min=k)[:, None]
        top = torch.where(keep, top, n)
    del score
    # the spare column N absorbs the padding entries
    vbias.scatter_(-1, top, float("-inf"))
    # ascending lists: sort 16-bit keys where N allows (a quarter of int64's radix passes)
    idx = torch.sort(top.to(torch.int16 if n < 2**15 else torch.int32), dim=-1).values.to(torch.int32)
    return (torch.where(idx < n, idx, -1) if kmax != k else idx), vbias[..., :n]


def vbias_from_routing(routing, dtype: torch.dtype) -> torch.Tensor:
    """The kernel's virtual-token bias from a kernels.routing.Routing (exact -> -inf, else gated w)."""
    return routing.w.to(bias_dtype(dtype)).masked_fill(routing.exact, float("-inf"))

"""Block statistics in Triton (the routing lives in route.py). For pisa / pwt / cov_bias with 16-bit inputs the
default is stats_h.py's one pass over q, k, v (statistics and H partials together); the two kernels below serve
drop, float32 inputs and PSA_STATS_H=0.

`_block_stats_kernel`: one program per 64-token block of one (batch, head) and half of the columns (by default;
STATS_BLOCKS groups blocks per program) writes the float32 k-bar, q-bar (and q^2, sigma^2 for PWT) used for
routing, the k-bar and value means in the input dtype that the attention kernel multiplies on tensor cores, and
whether the block is finite; with a Morton permutation it can also write q, k, v in block order (GATHER), so
the reorder rides on this read. `_hsum_kernel` (pisa / pwt / cov_bias): G blocks
per program accumulate sum_j H_j = sum_j (K_j - kbar_j)^T V_j in registers ([D, D] float32, tensor cores), with
k-bar read back instead of reduced in the loop, and write that partial once; the routing sums the partials of
a head into H-bar (no atomics, no memset, bitwise reproducible). Measured and dropped: one kernel doing both
(k and v read once; its [D, D] accumulator next to three tiles took 255 registers and a stack, one CTA per SM:
1.63 ms vs 0.78 at Wan2.1-14B 480p); again with the key / value statistics folded into a cp.async-pipelined
H-sum pass (1.16-1.22 ms vs 0.84, H200 2026-12-01, commit d888c50). Real token counts everywhere; padding never
counts. drop's q-bar / k-bar: column sums on tensor cores (stats2.py, STATS_TC).

Non-finite inputs (docs/MATH.md): a block whose keys or values are not all finite contributes no H_j
to H-bar (its own k-bar / sigma^2 / value mean carry the inf/NaN to exactly the rows that give it weight),
so one inf key element cannot turn every row of its head NaN through the first-order term.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..config import SparseConfig

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
from .stats2 import _column_split, _qk_sums_tc_kernel, _rows
from .route import (bias_dtype, kernel_scratch_bytes, route, route_in_kernel, route_torch,  # noqa: F401
                    set_route_failed, vbias_from_routing)


@triton.jit
def _block_stats_kernel(
    Q, K, V, PERM,
    KBAR, KBAR_LP, VMEAN_LP, KSIG2, QBAR, Q2, FIN, QG, KG, VG,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sg_b, sg_h, sg_t, sgq_b, sgq_h, sgq_t,
    HC, T, N, G, GOFF,
    D: tl.constexpr, DB: tl.constexpr, BS: tl.constexpr, NEED_PWT: tl.constexpr, NEED_V: tl.constexpr,
    NEED_FIN: tl.constexpr, HAS_PERM: tl.constexpr, PREFETCH: tl.constexpr, GATHER: tl.constexpr,
    GATHER_Q: tl.constexpr = True,
):
    """One program per (G consecutive blocks, DB of the D columns): every statistic is per column, so the D
    columns split over D // DB programs, each holding [BS, DB] tiles. Means, mean squares, centred key
    variance, and (for H-bar) FIN[i_bh, j, s] = 1 when the block's keys and values in these columns are all
    finite. With PREFETCH the next block's tiles are loaded (into registers, in the input dtype) before this
    block's reductions run, so a program always has a load in flight (Triton's pipeliner does not stage loads
    that feed reductions rather than dots). With GATHER (and PERM) the tiles read through the permutation are
    also written, in block order, to KG / VG (strides sg_*) and QG with GATHER_Q (its own strides sgq_*: it
    may be a region of another buffer): the Morton gather rides on the statistics' read. Only block-order rows from
    GOFF on are copied, to row (row - GOFF) of the copies (the cube order's interior is read in place)."""
    NSPLIT: tl.constexpr = D // DB
    i_g, i_s, i_b, i_h, i_bh, o_d = _column_split(HC, D=D, DB=DB)
    p_q = Q + i_b * sq_b + i_h * sq_h
    p_k = K + i_b * sk_b + i_h * sk_h
    p_v = V + i_b * sv_b + i_h * sv_h
    o_g = i_b * sg_b + i_h * sg_h
    o_gq = i_b * sgq_b + i_h * sgq_h
    j0 = i_g * G
    j1 = tl.minimum(j0 + G, N)
    if PREFETCH:
        b_q, b_k, b_v = _stats_load(p_q, p_k, p_v, PERM, sq_t, sk_t, sv_t, T, j0, True, o_d, BS=BS,
                                    NEED_V=NEED_V or GATHER, HAS_PERM=HAS_PERM)
        for j in range(j0, j1):
            n_q, n_k, n_v = _stats_load(p_q, p_k, p_v, PERM, sq_t, sk_t, sv_t, T, j + 1, j + 1 < j1, o_d, BS=BS,
                                        NEED_V=NEED_V or GATHER, HAS_PERM=HAS_PERM)
            _stats_write(b_q, b_k, b_v, KBAR, KBAR_LP, VMEAN_LP, KSIG2, QBAR, Q2, FIN, QG, KG, VG, o_g, sg_t, o_gq,
                         sgq_t, T, N, j, i_bh, i_s, o_d, D=D, NSPLIT=NSPLIT, BS=BS, NEED_PWT=NEED_PWT, NEED_V=NEED_V,
                         NEED_FIN=NEED_FIN, GATHER=GATHER, GATHER_Q=GATHER_Q, GOFF=GOFF)
            b_q, b_k, b_v = n_q, n_k, n_v
    else:
        for j in range(j0, j1):
            b_q, b_k, b_v = _stats_load(p_q, p_k, p_v, PERM, sq_t, sk_t, sv_t, T, j, True, o_d, BS=BS,
                                        NEED_V=NEED_V or GATHER, HAS_PERM=HAS_PERM)
            _stats_write(b_q, b_k, b_v, KBAR, KBAR_LP, VMEAN_LP, KSIG2, QBAR, Q2, FIN, QG, KG, VG, o_g, sg_t, o_gq,
                         sgq_t, T, N, j, i_bh, i_s, o_d, D=D, NSPLIT=NSPLIT, BS=BS, NEED_PWT=NEED_PWT, NEED_V=NEED_V,
                         NEED_FIN=NEED_FIN, GATHER=GATHER, GATHER_Q=GATHER_Q, GOFF=GOFF)


@triton.jit
def _stats_load(p_q, p_k, p_v, PERM, sq_t, sk_t, sv_t, T, j, ok, o_d, BS: tl.constexpr, NEED_V: tl.constexpr,
                HAS_PERM: tl.constexpr):
    """Block j's [BS, DB] tiles of q, k (and v) in the input dtype (zeros past T, or everywhere when not ok)."""
    o_t = j * BS + tl.arange(0, BS)
    m_t = (o_t < T) & ok
    o_r = _rows(PERM, o_t, m_t, HAS_PERM=HAS_PERM)
    b_q = tl.load(p_q + o_r[:, None] * sq_t + o_d[None, :], mask=m_t[:, None], other=0.0)
    b_k = tl.load(p_k + o_r[:, None] * sk_t + o_d[None, :], mask=m_t[:, None], other=0.0)
    if NEED_V:
        b_v = tl.load(p_v + o_r[:, None] * sv_t + o_d[None, :], mask=m_t[:, None], other=0.0)
    else:
        b_v = b_k
    return b_q, b_k, b_v


@triton.jit
def _stats_write(b_q, b_k, b_v, KBAR, KBAR_LP, VMEAN_LP, KSIG2, QBAR, Q2, FIN, QG, KG, VG, o_g, sg_t, o_gq, sgq_t,
                 T, N, j, i_bh, i_s, o_d, D: tl.constexpr, NSPLIT: tl.constexpr, BS: tl.constexpr,
                 NEED_PWT: tl.constexpr, NEED_V: tl.constexpr, NEED_FIN: tl.constexpr, GATHER: tl.constexpr,
                 GATHER_Q: tl.constexpr, GOFF=0):
    """Block j's statistics from its tiles (real token counts; padding rows are zeros); with GATHER the tiles
    themselves too, at their block-order rows less GOFF (rows before GOFF are not copied)."""
    o_t = j * BS + tl.arange(0, BS)
    m_t = o_t < T
    if GATHER:
        o_c = (o_t - GOFF).to(tl.int64)
        m_c = (m_t & (o_t >= GOFF))[:, None]
        p_g = o_g + o_c[:, None] * sg_t + o_d[None, :]
        if GATHER_Q:
            tl.store(QG + o_gq + o_c[:, None] * sgq_t + o_d[None, :], b_q, mask=m_c)
        tl.store(KG + p_g, b_k, mask=m_c)
        tl.store(VG + p_g, b_v, mask=m_c)
    cnt = tl.minimum(T - j * BS, BS).to(tl.float32)
    o_s = (i_bh * N + j) * D + o_d
    b_q = b_q.to(tl.float32)
    b_k = b_k.to(tl.float32)
    tl.store(QBAR + o_s, tl.sum(b_q, axis=0) / cnt)
    if NEED_PWT:
        tl.store(Q2 + o_s, tl.sum(b_q * b_q, axis=0) / cnt)
    b_kbar = tl.sum(b_k, axis=0) / cnt  # [DB]
    tl.store(KBAR + o_s, b_kbar)
    if NEED_PWT:
        b_kc = tl.where(m_t[:, None], b_k - b_kbar[None, :], 0.0)  # centred keys, padding zeroed
        tl.store(KSIG2 + o_s, tl.sum(b_kc * b_kc, axis=0) / cnt)
    if NEED_V:
        b_vs = tl.sum(b_v.to(tl.float32), axis=0)
        tl.store(KBAR_LP + o_s, b_kbar.to(KBAR_LP.dtype.element_ty))
        tl.store(VMEAN_LP + o_s, (b_vs / cnt).to(VMEAN_LP.dtype.element_ty))
        if NEED_FIN:
            # k-bar and the value sum are finite exactly when these keys and values are (short of a float32
            # overflow of the sum, which then also counts as non-finite)
            b_f = tl.sum(b_kbar * 0.0 + b_vs * 0.0, axis=0)
            tl.store(FIN + (i_bh * N + j) * NSPLIT + i_s, (b_f == 0.0).to(tl.int32))


@triton.jit
def _hsum_kernel(
    K, V, PERM, KBAR, FIN, HPART,
    sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
    HC, T, N, G, NPART,
    D: tl.constexpr, BS: tl.constexpr, NSPLIT: tl.constexpr, HAS_PERM: tl.constexpr, H_DOT: tl.constexpr,
):
    """sum_j H_j = sum_j (K_j - kbar_j)^T V_j over G blocks per program, k-bar and the finite flag read from
    _block_stats_kernel (no reduction in the loop: a GEMM-like pipelined stream of K/V tiles); one [D, D]
    float32 partial per program (HPART[i_bh, i_g])."""
    i_g, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh = i_b * HC + i_h
    o_m = tl.arange(0, BS)
    o_d = tl.arange(0, D)
    p_k = K + i_b * sk_b + i_h * sk_h
    p_v = V + i_b * sv_b + i_h * sv_h
    b_h = tl.zeros([D, D], dtype=tl.float32)
    j0 = i_g * G
    j1 = tl.minimum(j0 + G, N)
    for j in range(j0, j1):
        o_t = j * BS + o_m
        m_t = o_t < T
        if HAS_PERM:  # inline, not _rows: that call moved this kernel's sm_90a schedule (967 -> 983 instructions)
            o_r = tl.load(PERM + o_t, mask=m_t, other=0).to(tl.int64)
        else:
            o_r = o_t.to(tl.int64)
        keep = tl.min(tl.load(FIN + (i_bh * N + j) * NSPLIT + tl.arange(0, NSPLIT)), axis=0) != 0
        m_r = m_t & keep
        b_k = tl.load(p_k + o_r[:, None] * sk_t + o_d[None, :], mask=m_r[:, None], other=0.0)
        b_v = tl.load(p_v + o_r[:, None] * sv_t + o_d[None, :], mask=m_r[:, None], other=0.0)
        b_kbar = tl.load(KBAR + (i_bh * N + j) * D + o_d)
        b_kc = tl.where(m_r[:, None], b_k.to(tl.float32) - b_kbar[None, :], 0.0)
        if H_DOT == 1:
            # float16 inputs: centred keys can exceed float16's range (|k| near 6e4); float32 operands on
            # TF32 tensor cores keep float16's mantissa without its range
            b_h += tl.dot(tl.trans(b_kc), b_v.to(tl.float32), input_precision="tf32")
        elif H_DOT == 2:
            b_h += tl.dot(tl.trans(b_kc), b_v.to(tl.float32))  # the interpreter (its bf16 dot is wrong)
        else:
            b_h += tl.dot(tl.trans(b_kc.to(b_v.dtype)), b_v)  # [D, BS] x [BS, D]
    tl.store(HPART + (i_bh * NPART + i_g).to(tl.int64) * D * D + o_d[:, None] * D + o_d[None, :], b_h)


@triton.jit
def _hnorm_kernel(
    K, V, PERM, HBAR32, HNORM,
    sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
    HC, T, N,
    D: tl.constexpr, BS: tl.constexpr, HAS_PERM: tl.constexpr,
):
    """||H_j - H-bar||_F per block (cov_bias only): a second pass, since H-bar is known only after the first."""
    j, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh = i_b * HC + i_h
    o_m = tl.arange(0, BS)
    o_d = tl.arange(0, D)
    o_t = j * BS + o_m
    m_t = o_t < T
    o_r = _rows(PERM, o_t, m_t, HAS_PERM=HAS_PERM)
    cnt = tl.minimum(T - j * BS, BS).to(tl.float32)
    b_k = tl.load(K + i_b * sk_b + i_h * sk_h + o_r[:, None] * sk_t + o_d[None, :], mask=m_t[:, None], other=0.0)
    b_kf = b_k.to(tl.float32)
    b_kc = tl.where(m_t[:, None], b_kf - (tl.sum(b_kf, axis=0) / cnt)[None, :], 0.0)
    b_v = tl.load(V + i_b * sv_b + i_h * sv_h + o_r[:, None] * sv_t + o_d[None, :], mask=m_t[:, None], other=0.0)
    b_hj = tl.dot(tl.trans(b_kc), b_v.to(tl.float32), input_precision="ieee")  # [D, D], full float32
    b_hbar = tl.load(HBAR32 + i_bh * D * D + o_d[:, None] * D + o_d[None, :])
    b_diff = b_hj - b_hbar
    tl.store(HNORM + i_bh * N + j, tl.sqrt(tl.sum(tl.sum(b_diff * b_diff, axis=1), axis=0)))


@dataclass
class TritonStats:
    """Per (batch, head-chunk) statistics; float32 for routing, input dtype for the attention kernel.

    H-bar arrives as `hpart` (per-program partial sums of H_j) from block_stats; the routing's first kernel
    (route.route) reduces it into `hbar` / `hbar_lp` in place (finalize_hbar does it on its own)."""
    kbar: torch.Tensor  # [B, HC, N, D] float32
    qbar: torch.Tensor  # [B, HC, N, D] float32
    q2: torch.Tensor | None  # [B, HC, N, D] float32 (PWT)
    ksig2: torch.Tensor | None  # [B, HC, N, D] float32 (PWT)
    kbar_lp: torch.Tensor | None  # [B, HC, N, D] input dtype (pisa / pwt)
    vmean_lp: torch.Tensor | None  # [B, HC, N, D] input dtype (V-hat / n_j; pisa / pwt)
    hbar: torch.Tensor | None  # [B, HC, D, D] float32
    hbar_lp: torch.Tensor | None  # [B, HC, D, D] input dtype (float16: hbar / hbar_scale)
    hnorm: torch.Tensor | None  # [B, HC, N] float32 (cov_bias)
    hpart: torch.Tensor | None = None  # [B, HC, P, D, D] float32 partial sums of H_j (P programs per head)
    hbar_ready: bool = False
    # float16 only: [B, HC] float32 power of two >= 1 with hbar_lp = hbar / hbar_scale (None: scale 1)
    hbar_scale: torch.Tensor | None = None


def _n_sm(device) -> int:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(torch.device(device)).multi_processor_count
    return 4


def _env_num(name: str, default, cast):
    """A positive number from the environment, else `default` (unset, malformed, zero or negative)."""
    try:
        x = cast(os.environ.get(name, "").strip() or default)
    except ValueError:
        return default
    return x if x > 0 else default


# tuning knobs (bench/pieces.py --sweep; H200 numbers in bench/results/pieces_h200.md): the per-block kernel at
# 4 warps beat 8 (Wan2.1-14B 480p pwt statistics 0.78 vs 1.24 ms with [64, 128] tiles; one warp, below, beats
# both). Programs over several blocks, with or without the next block's tiles prefetched into registers, measured
# slower than one block per program (480p / 720p pwt statistics: 8 blocks + prefetch 0.90 / 2.02 ms at 64
# columns, 1.08 / 2.37 at 32; one block, 64 columns 0.84 / 1.91; run 6 of pieces_h200.md): the prefetch doubles
# the live tiles (246-255 registers, 2 CTAs per SM) and three one-block CTAs per SM already keep as many bytes in
# flight.
# H-sum programs per SM (a float) and pipeline stages; PSA_HSUM_* set them for a bench process (read at import).
# H200 (bench/pieces.py --sweep, session 6; profiler, 20 calls): 4 programs per SM 0.240 -> 0.205 ms at Wan2.1-14B
# 480p, 0.543 -> 0.445 at 720p against 2 (1: 0.235 / 0.536; 8: 0.219 / 0.463; 2 or 4 stages, 4 warps slower at
# both); at FLUX.1 1024^2 it would make 4-block programs (0.036 ms vs 0.026-0.027 for 7-14 blocks), hence the
# floor of 8 blocks per program
HSUM_CTAS_PER_SM = _env_num("PSA_HSUM_CTAS_PER_SM", 4, float)
HSUM_MIN_BLOCKS = 8
HSUM_WARPS = 8  # at D >= 128 (4 below)
HSUM_STAGES = _env_num("PSA_HSUM_STAGES", 3, int)
# one warp per program over 32 columns (every row sum stays inside the warp: 5 barriers per block in the sm_90a
# SASS instead of 25 at 4 warps over 64 columns). H200, torch.profiler kernel time of the pwt statistics kernel
# (bench/pieces.py --sweep, 2026-12-01 session 6): Wan2.1-14B 480p 0.600 -> 0.333 ms, FLUX.1 1024^2 0.055 ->
# 0.027 ms; 16 columns 0.338 / 0.034, two warps 0.375 / 0.036 at 32 columns, 0.634 / 0.057 at 16
STATS_WARPS = 1
STATS_DB = 32  # columns per statistics program
STATS_BLOCKS = 1  # blocks per statistics program (a loop; with STATS_PREFETCH the next block's loads fly
STATS_PREFETCH = False  # while this one's reductions run)
STATS_MIN_WAVES = 8  # at least this many statistics programs per SM before blocks are grouped
# STATS_TC: drop's q-bar / k-bar by stats2._qk_sums_tc_kernel: column sums as ones x tile on tensor cores,
# STATS_TC_BLOCKS blocks per program in a loop whose loads the pipeliner stages (STATS_TC_STAGES deep; plain
# tl.sum programs get no cp.async). H200 (bench/results/pieces_h200.md, session 4): 0.253 -> 0.183 ms at
# Wan2.1-14B 480p, 0.569 -> 0.398 at 720p with 64 columns; for pisa / pwt (with the key / value statistics folded
# into the H-sum pass) it measured slower (1.16-2.24 vs 0.85 ms), so only drop uses it
STATS_TC = os.environ.get("PSA_STATS_TC", "1") == "1"
STATS_TC_BLOCKS = 8
STATS_TC_STAGES = 3
STATS_TC_DB = 64
STATS_TC_WARPS = 4


def stats_h_enabled() -> bool:
    """pisa / pwt / cov_bias statistics and H partials in one pass (stats_h.py); PSA_STATS_H=0: the statistics
    kernel, then the H-sum pass (read per call)."""
    return os.environ.get("PSA_STATS_H", "1").strip() != "0"


def stats_h_parts(n: int, bh: int, device=None, d: int = 128) -> int:
    """Programs (H partials) per (batch, head) of the one-pass statistics for `bh` (batch, head) pairs."""
    from . import stats_h
    return stats_h.parts_per_head(n, bh, _n_sm(device) if device is not None else 132, d=d)


def stats_blocks_per_program(n: int, programs_per_block: int, device=None) -> int:
    """Blocks each statistics program loops over: STATS_BLOCKS, fewer when the grid would not fill STATS_MIN_WAVES
    programs per SM."""
    n_sm = _n_sm(device) if device is not None else 132
    fill = max(1, (n * programs_per_block) // (STATS_MIN_WAVES * n_sm))
    return max(1, min(STATS_BLOCKS, fill, n))


def blocks_per_program(n: int, bh: int, device=None, per_sm: int | None = None) -> int:
    """G blocks per H-sum program: about `per_sm` programs per SM over all (batch, head) pairs, at least
    HSUM_MIN_BLOCKS blocks each (never more than the head has) and at most 64 partials of H per head
    (P = ceil(N / G))."""
    n_sm = _n_sm(device) if device is not None else 132
    per_sm = HSUM_CTAS_PER_SM if per_sm is None else per_sm
    return max(min(HSUM_MIN_BLOCKS, n), math.ceil(n / 64), math.ceil(n * bh / (per_sm * n_sm)))


def block_stats(q, k, v, cfg: SparseConfig, *, perm: torch.Tensor | None = None, need_pwt: bool | None = None,
                need_h: bool | None = None, need_hnorm: bool | None = None,
                gathered: tuple | None = None, gather_from: int = 0) -> TritonStats:
    """Statistics of [B, HC, T, D] views (any batch/head/token strides, unit last stride): programs over
    blocks, then (pisa / pwt / cov_bias) the H_j partial sums in a GEMM-like pass over K and V.

    gathered: with `perm`, three [B, HC, T, D] outputs (unit last stride; k's and v's with one set of strides, q's
    with its own) that receive q, k and v in block (permuted) order, the first may be None (q not copied: the
    Triton attention reads its rows through the permutation); the H pass then reads the k, v copies without the
    permutation. gather_from (a multiple of the block size): only block-order rows from it on are copied, into
    copies of T - gather_from rows (the cube order: its interior cubes are read in place); the H pass then reads
    through the permutation."""
    B, HC, T, D = q.shape
    bs = cfg.block_size
    n = -(-T // bs)
    dev = q.device
    approx = cfg.variant in ("pisa", "pwt")
    need_pwt = cfg.variant == "pwt" if need_pwt is None else need_pwt
    need_h = (approx or cfg.cov_bias) if need_h is None else need_h
    need_hnorm = cfg.cov_bias if need_hnorm is None else need_hnorm
    need_v = approx or need_h
    f32 = torch.float32
    # one pass for 16-bit inputs on the GPU (every dtype under the interpreter); float32 keeps the two passes
    fused = need_h and stats_h_enabled() and (_INTERPRET or q.dtype in (torch.bfloat16, torch.float16))
    if not fused:
        kbar = torch.empty(B, HC, n, D, device=dev, dtype=f32)
        qbar = torch.empty_like(kbar)
        q2 = torch.empty_like(kbar) if need_pwt else None
        ksig2 = torch.empty_like(kbar) if need_pwt else None
        kbar_lp = torch.empty(B, HC, n, D, device=dev, dtype=q.dtype) if need_v else None
        vmean_lp = torch.empty_like(kbar_lp) if need_v else None
    else:
        q2 = ksig2 = None
    hpart = None
    dummy = q if fused else kbar
    h_dot = 2 if _INTERPRET else (1 if q.dtype == torch.float16 else 0)
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2))
    pm = perm if perm is not None else dummy
    if gathered is not None:
        if perm is None:
            raise ValueError("block_stats: gathered outputs need a perm")
        qg, kg, vg = gathered
        g_shape = (B, HC, T - gather_from, D)
        if gather_from % bs or not 0 <= gather_from < T:
            raise ValueError(f"block_stats: gather_from {gather_from} must be a multiple of {bs} below T = {T}")
        if kg is None or vg is None or kg.stride(-1) != 1 or vg.stride() != kg.stride() or not all(
                x is None or (x.shape == g_shape and x.stride(-1) == 1 and x.dtype == q.dtype) for x in (qg, kg, vg)):
            raise ValueError(f"block_stats: gathered outputs must be {list(g_shape)} in q's dtype (unit last stride), "
                             "the k and v copies with one set of strides")
        qs = kg.stride() if qg is None else qg.stride()
        g_args = (kg if qg is None else qg, kg, vg, kg.stride(0), kg.stride(1), kg.stride(2), qs[0], qs[1], qs[2])
    else:
        g_args = (q, k, v, 0, 0, 0, 0, 0, 0)
    db = min(STATS_DB, D)
    nsplit = D // db
    fin = torch.empty(B, HC, n, nsplit, device=dev, dtype=torch.int32) if need_h and not fused else None
    if fused:  # one pass over q, k, v: statistics and the H partials (the statistics as views of two buffers)
        from . import stats_gl
        from .stats_h import stats_with_h
        parts = stats_h_parts(n, B * HC, dev, D)
        res = None
        if stats_gl.usable(q, k, v, perm, gathered, gather_from):  # PSA_STATS_GLUON: the Gluon kernels (stats_gl.py)
            res = stats_gl.stats_with_h_checked(q, k, v, pm, strides, g_args, n=n, bs=bs, need_pwt=need_pwt,
                                                parts=parts, perm=perm, gathered=gathered)
        st32, lp, hpart = res if res is not None else stats_with_h(
            q, k, v, pm, strides, g_args, n=n, bs=bs, need_pwt=need_pwt, has_perm=perm is not None,
            gather=gathered is not None, gather_q=gathered is not None and gathered[0] is not None, parts=parts,
            goff=gather_from)
        qbar, kbar, kbar_lp, vmean_lp = st32[0], st32[1], lp[0], lp[1]
        if need_pwt:
            q2, ksig2 = st32[2], st32[3]
    elif STATS_TC and not need_v and not need_pwt and gathered is None:  # drop: q-bar, k-bar on tensor cores
        db = min(STATS_TC_DB, D)
        gs = max(1, min(STATS_TC_BLOCKS, n))
        _qk_sums_tc_kernel[(triton.cdiv(n, gs) * (D // db), HC, B)](
            q, k, pm, qbar, kbar, *strides[:6], HC, T, n, gs, D=D, DB=db, BS=bs, HAS_PERM=perm is not None,
            LOWP=q.dtype in (torch.bfloat16, torch.float16), STAGES=STATS_TC_STAGES,
            num_warps=STATS_TC_WARPS, num_stages=STATS_TC_STAGES,
        )
    else:
        gs = stats_blocks_per_program(n, B * HC * nsplit, dev)
        _block_stats_kernel[(triton.cdiv(n, gs) * nsplit, HC, B)](
            q, k, v, pm, kbar, kbar_lp if need_v else dummy, vmean_lp if need_v else dummy,
            ksig2 if need_pwt else dummy, qbar, q2 if need_pwt else dummy, fin if need_h else dummy, *g_args[:3],
            *strides, *g_args[3:], HC, T, n, gs, gather_from, D=D, DB=db, BS=bs, NEED_PWT=need_pwt, NEED_V=need_v,
            NEED_FIN=need_h, HAS_PERM=perm is not None, PREFETCH=STATS_PREFETCH, GATHER=gathered is not None,
            GATHER_Q=gathered is not None and gathered[0] is not None, num_warps=STATS_WARPS,
        )
    if gathered is not None and not gather_from:  # the H pass (and the norms) read the copies in block order
        k, v, perm, pm = kg, vg, None, dummy
        strides = (0, 0, 0, k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2))
    if need_h and not fused:
        g = blocks_per_program(n, B * HC, dev)
        npart = triton.cdiv(n, g)
        hpart = torch.empty(B, HC, npart, D, D, device=dev, dtype=f32)
        _hsum_kernel[(npart, HC, B)](
            k, v, pm, kbar, fin, hpart, *strides[3:], HC, T, n, g, npart, D=D, BS=bs, NSPLIT=nsplit,
            HAS_PERM=perm is not None, H_DOT=h_dot, num_warps=HSUM_WARPS if D >= 128 else 4, num_stages=HSUM_STAGES,
        )
    st = TritonStats(kbar, qbar, q2, ksig2, kbar_lp, vmean_lp, None, None, None, hpart)
    if need_hnorm:
        finalize_hbar(st, n, q.dtype)
        hnorm = torch.empty(B, HC, n, device=dev, dtype=f32)
        _hnorm_kernel[(n, HC, B)](
            k, v, pm, st.hbar, hnorm,
            k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
            HC, T, n, D=D, BS=bs, HAS_PERM=perm is not None, num_warps=8 if D >= 128 else 4,
        )
        st.hnorm = hnorm
    return st


def finalize_hbar(st: TritonStats, n: int, dtype: torch.dtype) -> None:
    """H-bar = (1/N) sum of the partials, in torch (cov_bias, tests); route() does it inside its first kernel."""
    if st.hpart is None or st.hbar_ready:
        return
    st.hbar = st.hpart.sum(2).div_(n)
    st.hbar_lp, st.hbar_scale = lowp_hbar(st.hbar, dtype)
    st.hbar_ready = True


def lowp_hbar(hbar: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(hbar / scale in `dtype`, scale [B, HC] or None): for float16 the per-head power of two >= 1 that
    keeps max |hbar / scale| <= 2^14 (moderate keys and values already give an H-bar above 65504; the
    attention kernel multiplies q (H-bar / scale) back by scale in float32); None (scale 1) for other dtypes
    (bfloat16 has float32's range). No host sync."""
    if dtype != torch.float16:
        return hbar.to(dtype), None
    amax = hbar.abs().amax(dim=(-1, -2))
    scale = torch.exp2(torch.ceil(torch.log2(amax * 2.0 ** -14))).clamp_(min=1.0)
    scale = torch.where(torch.isfinite(scale), scale, torch.ones_like(scale))
    return (hbar / scale[..., None, None]).to(dtype), scale

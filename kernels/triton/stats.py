"""Block statistics in one Triton pass over q, k, v, and routing with a few batched torch ops.

One program reads G consecutive 64-token blocks of one (batch, head) and writes, per block, the float32
k-bar, q-bar (and q^2, sigma^2 for PWT) used for routing, plus the k-bar and value means in the input dtype
that the attention kernel multiplies on tensor cores. H-bar is never built per block: each program keeps
sum_j H_j = sum_j (K_j - kbar_j)^T V_j of its blocks in registers ([D, D] float32) and adds it to the head's
sum with one atomic add per element. Real token counts everywhere; padding never counts.
"""
from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

try:
    from triton.runtime.errors import OutOfResources
except ImportError:  # older Triton
    from triton.runtime.autotuner import OutOfResources

from ..config import SparseConfig

log = logging.getLogger("piecewise_sparse_attention")
from ..routing import forced_mask


@triton.jit
def _block_stats_kernel(
    Q, K, V, PERM,
    KBAR, KBAR_LP, VMEAN_LP, KSIG2, QBAR, Q2,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
    HC, T, N,
    D: tl.constexpr, BS: tl.constexpr, NEED_PWT: tl.constexpr, HAS_PERM: tl.constexpr,
):
    """One program per block: means, sums of squares, centred key variance (no serial loop: latency)."""
    j, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh = i_b * HC + i_h
    o_m = tl.arange(0, BS)
    o_d = tl.arange(0, D)
    o_t = j * BS + o_m
    m_t = o_t < T
    if HAS_PERM:
        o_r = tl.load(PERM + o_t, mask=m_t, other=0).to(tl.int64)
    else:
        o_r = o_t.to(tl.int64)
    cnt = tl.minimum(T - j * BS, BS).to(tl.float32)
    b_k = tl.load(K + i_b * sk_b + i_h * sk_h + o_r[:, None] * sk_t + o_d[None, :], mask=m_t[:, None],
                  other=0.0).to(tl.float32)  # [BS, D]
    b_v = tl.load(V + i_b * sv_b + i_h * sv_h + o_r[:, None] * sv_t + o_d[None, :], mask=m_t[:, None],
                  other=0.0).to(tl.float32)
    b_q = tl.load(Q + i_b * sq_b + i_h * sq_h + o_r[:, None] * sq_t + o_d[None, :], mask=m_t[:, None],
                  other=0.0).to(tl.float32)
    b_kbar = tl.sum(b_k, axis=0) / cnt  # [D]
    o_s = (i_bh * N + j) * D + o_d
    tl.store(KBAR + o_s, b_kbar)
    tl.store(KBAR_LP + o_s, b_kbar.to(KBAR_LP.dtype.element_ty))
    tl.store(VMEAN_LP + o_s, (tl.sum(b_v, axis=0) / cnt).to(VMEAN_LP.dtype.element_ty))
    tl.store(QBAR + o_s, tl.sum(b_q, axis=0) / cnt)
    if NEED_PWT:
        b_kc = tl.where(m_t[:, None], b_k - b_kbar[None, :], 0.0)  # centred keys, padding zeroed
        tl.store(KSIG2 + o_s, tl.sum(b_kc * b_kc, axis=0) / cnt)
        tl.store(Q2 + o_s, tl.sum(b_q * b_q, axis=0) / cnt)


@triton.jit
def _hsum_kernel(
    K, V, PERM, HSUM,
    sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
    HC, T, N, G,
    D: tl.constexpr, BS: tl.constexpr, HAS_PERM: tl.constexpr,
):
    """sum_j H_j = sum_j (K_j - kbar_j)^T V_j over G blocks per program (split-K), one atomic add of the
    [D, D] float32 partial per program. The blocks are those of the (permuted) token order; blocks whose H_j
    is not finite are skipped (H-bar = (1/N) sum of the finite H_j, kernels.routing.block_stats)."""
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
        if HAS_PERM:
            o_r = tl.load(PERM + o_t, mask=m_t, other=0).to(tl.int64)
        else:
            o_r = o_t.to(tl.int64)
        cnt = tl.minimum(T - j * BS, BS).to(tl.float32)
        b_k = tl.load(p_k + o_r[:, None] * sk_t + o_d[None, :], mask=m_t[:, None], other=0.0)
        b_v = tl.load(p_v + o_r[:, None] * sv_t + o_d[None, :], mask=m_t[:, None], other=0.0)
        b_kf = b_k.to(tl.float32)
        b_kc = tl.where(m_t[:, None], b_kf - (tl.sum(b_kf, axis=0) / cnt)[None, :], 0.0)
        # non-finite contract: halved before the cast, |k - kbar| <= 2 max|k| fits a float16 (doubled below;
        # exact scaling); a block whose H_j is not finite (an inf/NaN key or value) is left out of the sum
        b_hj = tl.dot(tl.trans((b_kc * 0.5).to(b_v.dtype)), b_v)  # [D, BS] x [BS, D]
        b_fin = tl.min(tl.min((tl.abs(b_hj) < float("inf")).to(tl.int32), axis=1), axis=0)
        b_h += tl.where(b_fin > 0, b_hj, 0.0)
    tl.atomic_add(HSUM + i_bh * D * D + o_d[:, None] * D + o_d[None, :], b_h * 2.0)


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
    if HAS_PERM:
        o_r = tl.load(PERM + o_t, mask=m_t, other=0).to(tl.int64)
    else:
        o_r = o_t.to(tl.int64)
    cnt = tl.minimum(T - j * BS, BS).to(tl.float32)
    b_k = tl.load(K + i_b * sk_b + i_h * sk_h + o_r[:, None] * sk_t + o_d[None, :], mask=m_t[:, None], other=0.0)
    b_kf = b_k.to(tl.float32)
    b_kc = tl.where(m_t[:, None], b_kf - (tl.sum(b_kf, axis=0) / cnt)[None, :], 0.0)
    b_v = tl.load(V + i_b * sv_b + i_h * sv_h + o_r[:, None] * sv_t + o_d[None, :], mask=m_t[:, None], other=0.0)
    b_hj = tl.dot(tl.trans(b_kc), b_v.to(tl.float32), input_precision="ieee")  # [D, D], full float32
    b_hbar = tl.load(HBAR32 + i_bh * D * D + o_d[:, None] * D + o_d[None, :])
    b_diff = b_hj - b_hbar
    tl.store(HNORM + i_bh * N + j, tl.sqrt(tl.sum(tl.sum(b_diff * b_diff, axis=1), axis=0)))


@triton.jit
def _route_kernel(
    QBAR, KBAR, Q2, KSIG2, HNORM, IDX, VBIAS,
    N, NSEL, k_budget, band, n_sink, svb_i, scale, half_s2, ln_b,
    D: tl.constexpr, NP2: tl.constexpr, ROWS: tl.constexpr, DK: tl.constexpr,
    PWT: tl.constexpr, COV: tl.constexpr,
):
    """Routing for ROWS query blocks of one (batch, head), scores never leave registers:
    score = s qbar.kbar (+ log(hnorm + 1e-6)) (+ min(w, ln Bs)); forced blocks at +inf; the K_i = max(k,
    #forced) best by a 32-step bit-by-bit search for the K_i-th largest key (ties by lower block id);
    writes the ascending index list and the bias row (-inf = exact, else the gated w or 0)."""
    i_r, i_bh = tl.program_id(0), tl.program_id(1)
    o_i = i_r * ROWS + tl.arange(0, ROWS)
    m_i = o_i < N
    o_j = tl.arange(0, NP2)
    m_j = o_j < N
    o_k = tl.arange(0, DK)
    b_s = tl.zeros([ROWS, NP2], dtype=tl.float32)
    b_w = tl.zeros([ROWS, NP2], dtype=tl.float32)
    # [ROWS, DK] x [DK, NP2] in full float32, one operand tile in shared memory at a time
    for d0 in range(0, D, DK):
        p_r = (i_bh * N + o_i)[:, None] * D + d0 + o_k[None, :]
        p_c = (i_bh * N + o_j)[:, None] * D + d0 + o_k[None, :]
        b_a = tl.load(QBAR + p_r, mask=m_i[:, None], other=0.0)
        b_b = tl.load(KBAR + p_c, mask=m_j[:, None], other=0.0)
        b_s += tl.dot(b_a, tl.trans(b_b), input_precision="ieee")
    if PWT:
        for d0 in range(0, D, DK):
            p_r = (i_bh * N + o_i)[:, None] * D + d0 + o_k[None, :]
            p_c = (i_bh * N + o_j)[:, None] * D + d0 + o_k[None, :]
            b_a = tl.load(Q2 + p_r, mask=m_i[:, None], other=0.0)
            b_b = tl.load(KSIG2 + p_c, mask=m_j[:, None], other=0.0)
            b_w += tl.dot(b_a, tl.trans(b_b), input_precision="ieee")
    b_s = b_s * scale
    if COV:
        b_hn = tl.load(HNORM + i_bh * N + o_j, mask=m_j, other=1.0)
        b_s += tl.log(b_hn + 1e-6)[None, :]
    if PWT:
        b_w = b_w * half_s2
        b_s += tl.minimum(b_w, ln_b)
    # NaN/inf in the inputs must not break the ranking
    b_s = tl.where(b_s != b_s, -1e30, b_s)
    b_s = tl.minimum(tl.maximum(b_s, -1e30), 1e30)
    d_ij = o_i[:, None] - o_j[None, :]
    forced = ((d_ij <= band) & (d_ij >= -band)) | (o_j[None, :] < n_sink)
    forced = forced & m_j[None, :]
    b_s = tl.where(forced, float("inf"), b_s)
    b_s = tl.where(m_j[None, :], b_s, float("-inf"))
    n_forced = tl.sum(forced.to(tl.int32), axis=1)
    k_i = tl.maximum(n_forced, k_budget)  # [ROWS]
    # order-preserving unsigned key of a float32
    b_bits = b_s.to(tl.int32, bitcast=True)
    b_key = (b_bits ^ ((b_bits >> 31) | (-2147483647 - 1))).to(tl.uint32, bitcast=True)
    b_key = tl.where(b_bits < 0, (~b_bits).to(tl.uint32, bitcast=True), b_key)
    # largest t with #(key >= t) >= k_i, built from the top bit down
    b_t = tl.zeros([ROWS], dtype=tl.uint32)
    for bit in tl.static_range(31, -1, -1):
        b_c = b_t | (1 << bit)
        n_ge = tl.sum((b_key >= b_c[:, None]).to(tl.int32), axis=1)
        b_t = tl.where(n_ge >= k_i, b_c, b_t)
    gt = b_key > b_t[:, None]
    eq = b_key == b_t[:, None]
    n_gt = tl.sum(gt.to(tl.int32), axis=1)
    eq_rank = tl.cumsum(eq.to(tl.int32), axis=1)
    sel = gt | (eq & (eq_rank <= (k_i - n_gt)[:, None]))
    pos = tl.cumsum(sel.to(tl.int32), axis=1) - 1
    m_ij = m_i[:, None] & m_j[None, :]
    tl.store(IDX + (i_bh * N + o_i)[:, None].to(tl.int64) * NSEL + pos, o_j[None, :] + 0 * pos,
             mask=sel & m_ij)
    if PWT:
        b_vb = tl.where(b_w <= ln_b, b_w, 0.0)  # gates a NaN w too, like kernels.routing.pwt_bonus
    else:
        b_vb = tl.zeros([ROWS, NP2], dtype=tl.float32)
    b_vb = tl.where(sel, float("-inf"), b_vb)
    tl.store(VBIAS + (i_bh * N + o_i)[:, None].to(tl.int64) * svb_i + o_j[None, :],
             b_vb.to(VBIAS.dtype.element_ty), mask=m_ij)


@dataclass
class TritonStats:
    """Per (batch, head-chunk) statistics; float32 for routing, input dtype for the attention kernel."""
    kbar: torch.Tensor  # [B, HC, N, D] float32
    qbar: torch.Tensor  # [B, HC, N, D] float32
    q2: torch.Tensor | None  # [B, HC, N, D] float32 (PWT)
    ksig2: torch.Tensor | None  # [B, HC, N, D] float32 (PWT)
    kbar_lp: torch.Tensor  # [B, HC, N, D] input dtype
    vmean_lp: torch.Tensor  # [B, HC, N, D] input dtype (V-hat / n_j)
    hbar: torch.Tensor | None  # [B, HC, D, D] float32
    hbar_lp: torch.Tensor | None  # [B, HC, D, D] input dtype: hbar / hbar_scale
    hbar_scale: torch.Tensor | None  # [B, HC] float32 power of two >= 1 keeping hbar_lp in a float16's range
    hnorm: torch.Tensor | None  # [B, HC, N] float32 (cov_bias)


def _n_sm(device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def block_stats(q, k, v, cfg: SparseConfig, *, perm: torch.Tensor | None = None, need_pwt: bool | None = None,
                need_h: bool | None = None, need_hnorm: bool | None = None) -> TritonStats:
    """Statistics of [B, HC, T, D] views (any batch/head/token strides, unit last stride)."""
    B, HC, T, D = q.shape
    bs = cfg.block_size
    n = -(-T // bs)
    dev = q.device
    approx = cfg.variant in ("pisa", "pwt")
    need_pwt = cfg.variant == "pwt" if need_pwt is None else need_pwt
    need_h = (approx or cfg.cov_bias) if need_h is None else need_h
    need_hnorm = cfg.cov_bias if need_hnorm is None else need_hnorm
    f32 = torch.float32
    kbar = torch.empty(B, HC, n, D, device=dev, dtype=f32)
    qbar = torch.empty_like(kbar)
    q2 = torch.empty_like(kbar) if need_pwt else None
    ksig2 = torch.empty_like(kbar) if need_pwt else None
    kbar_lp = torch.empty(B, HC, n, D, device=dev, dtype=q.dtype)
    vmean_lp = torch.empty_like(kbar_lp)
    grid = (n, HC, B)
    dummy = kbar
    _block_stats_kernel[grid](
        q, k, v, perm if perm is not None else dummy,
        kbar, kbar_lp, vmean_lp, ksig2 if need_pwt else dummy, qbar, q2 if need_pwt else dummy,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        HC, T, n, D=D, BS=bs, NEED_PWT=need_pwt, HAS_PERM=perm is not None, num_warps=4,
    )
    if need_h:
        hsum = torch.zeros(B, HC, D, D, device=dev, dtype=f32)
        # split-K over blocks: ~4 programs per SM, each summing G blocks in registers before one atomic add
        g = max(1, math.ceil(n * B * HC / (4 * _n_sm(dev))))
        _hsum_kernel[(triton.cdiv(n, g), HC, B)](
            k, v, perm if perm is not None else dummy, hsum,
            k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
            HC, T, n, g, D=D, BS=bs, HAS_PERM=perm is not None, num_warps=8 if D >= 128 else 4, num_stages=3,
        )
    hbar = hbar_lp = hnorm = None
    hbar_scale = None
    if need_h:
        hbar = hsum.div_(n)
        hbar_lp, hbar_scale = lowp_hbar(hbar, q.dtype)
    if need_hnorm:
        hnorm = torch.empty(B, HC, n, device=dev, dtype=f32)
        _hnorm_kernel[(n, HC, B)](
            k, v, perm if perm is not None else dummy, hbar, hnorm,
            k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
            HC, T, n, D=D, BS=bs, HAS_PERM=perm is not None, num_warps=8 if D >= 128 else 4,
        )
    return TritonStats(kbar, qbar, q2, ksig2, kbar_lp, vmean_lp, hbar, hbar_lp, hbar_scale, hnorm)


def lowp_hbar(hbar: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(hbar / scale in `dtype`, scale [B, HC]): for float16 the per-head power of two >= 1 that keeps
    max |hbar / scale| <= 2^14 (moderate keys and values already give an H-bar above 65504; the attention
    kernel multiplies q (H-bar / scale) back by scale in float32); 1 for other dtypes (bfloat16 has float32's
    range). No host sync."""
    if dtype != torch.float16:
        return hbar.to(dtype), torch.ones(hbar.shape[:-2], device=hbar.device, dtype=torch.float32)
    amax = hbar.abs().amax(dim=(-1, -2))
    scale = torch.exp2(torch.ceil(torch.log2(amax * 2.0 ** -14))).clamp_(min=1.0)
    scale = torch.where(torch.isfinite(scale), scale, torch.ones_like(scale))
    return (hbar / scale[..., None, None]).to(dtype), scale


def bias_dtype(dtype: torch.dtype) -> torch.dtype:
    """Storage of the per-(query block, KV block) virtual-token bias: -inf marks an exact block, else the
    gated PWT bonus w (0 for PISA). float16 for 16-bit inputs (w <= ln Bs, so the rounding is <= 2e-3 in
    the logit); float32 otherwise."""
    return torch.float16 if dtype in (torch.float16, torch.bfloat16) else torch.float32


@torch.no_grad()
def route_torch(st: TritonStats, cfg: SparseConfig, dtype: torch.dtype):
    """(idx [B, HC, Nq, K] int32 ascending, -1 padded; vbias [B, HC, Nq, N] view of an N+1 wide buffer).

    The same arithmetic as kernels.routing.route (score, cov_bias, PWT rank bonus, forced band and sinks
    at +inf, top-k with forced blocks inside the budget), without materialising the bool mask and the
    float32 w separately: the virtual-token bias carries both.
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


@functools.lru_cache(maxsize=256)
def _max_forced(n: int, band: int, n_sink: int) -> int:
    return int(forced_mask(n, n, band, n_sink, "cpu").sum(-1).max())


@torch.no_grad()
def route(st: TritonStats, cfg: SparseConfig, dtype: torch.dtype):
    """(idx [B, HC, Nq, K] int32 ascending, -1 padded; vbias [B, HC, Nq, N] float16/32) in one kernel: the
    [Nq, N] scores stay in registers. Same result as kernels.routing.route up to ties and float32
    summation order. NP2 (N rounded up to a power of two) is a compile constant: one compile per octave."""
    B, HC, n, D = st.kbar.shape
    np2 = max(16, triton.next_power_of_2(n))
    if not route_in_kernel(n):
        return route_torch(st, cfg, dtype)
    k = cfg.budget(n)
    kmax = max(k, _max_forced(n, cfg.band, cfg.n_sink_blocks))
    idx = torch.full((B, HC, n, kmax), -1, device=st.kbar.device, dtype=torch.int32)
    vbias = torch.empty(B, HC, n, n, device=st.kbar.device, dtype=bias_dtype(dtype))
    rows = 16
    pwt = cfg.variant == "pwt"
    scale = float(cfg.scale)
    dummy = st.kbar
    try:
        _route_kernel[(triton.cdiv(n, rows), B * HC)](
            st.qbar, st.kbar, st.q2 if pwt else dummy, st.ksig2 if pwt else dummy,
            st.hnorm if cfg.cov_bias else dummy, idx, vbias,
            n, kmax, k, cfg.band, cfg.n_sink_blocks, vbias.stride(2), scale, 0.5 * scale * scale,
            math.log(cfg.block_size),
            # [NP2, DK] float32 operand tiles, single-buffered: 32 KiB at N=512, 64 KiB at N=1024
            D=D, NP2=np2, ROWS=rows, DK=32 if np2 <= 256 else 16, PWT=pwt, COV=bool(cfg.cov_bias),
            num_warps=4 if np2 <= 512 else 8, num_stages=1,
        )
    except OutOfResources as e:
        _set_route_failed(e)
        return route_torch(st, cfg, dtype)
    return idx, vbias


# above this many KV blocks (T > 65536 at Bs 64) the [16, NP2] score rows would spill: torch routing
_ROUTE_KERNEL_MAX_N = 1024
_route_failed = False


def route_in_kernel(n: int) -> bool:
    """Whether route() takes the Triton kernel (scores in registers) for N KV blocks, or torch."""
    return max(16, triton.next_power_of_2(n)) <= _ROUTE_KERNEL_MAX_N and not _route_failed


def _set_route_failed(e):
    global _route_failed
    _route_failed = True
    log.warning("piecewise_sparse_attention: triton routing kernel out of resources (%s); routing with "
                "torch.topk from now on", str(e)[:160])


def vbias_from_routing(routing, dtype: torch.dtype) -> torch.Tensor:
    """The kernel's virtual-token bias from a kernels.routing.Routing (exact -> -inf, else gated w)."""
    return routing.w.to(bias_dtype(dtype)).masked_fill(routing.exact, float("-inf"))

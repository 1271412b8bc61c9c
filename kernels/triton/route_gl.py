"""The routing scores as a Gluon kernel on SM90 (issue #11; PSA_ROUTE_GLUON=1; off: slower than the Triton kernel
on the H200, session 29).

Why: route.py's `_scores_kernel` (Triton) took 0.51-0.66 ms at Wan2.1-14B 720p (40 heads, 1182 blocks) where its work
is ~0.15 ms of tensor-core time and 0.08 ms of stores (the float32 scores and the bias rows): Nsight Compute (session
25) found it latency-bound, 255 registers, two programs of 4 warps per SM (12.5% occupancy), its bfloat16 splits
(F2F) and unpipelined loads waiting in every 64 x 64 tile. Here one program owns a query block's row of tiles:
- its query-side operands (q-bar; pwt: q^2) are split once into bfloat16 high / low parts in shared memory and serve
  every KV tile of the row; per KV tile only the k-bar (pwt: sigma^2) tile is split;
- each dot is route.py's three bfloat16 products in its order (hi x lo, lo x hi, hi x hi, the small terms first) on
  wgmma with float32 accumulation, the next tile's float32 loads issued under the products;
- 96 KiB of shared memory and 248 registers (sm_90a, no spills): two programs per SM.
The epilogue is `_score_tile`'s (scale, PWT bonus and gated bias, NaN / inf clamps, forced band and sinks at +inf).
H-bar's reduction, which the Triton scores kernel does on the side, runs as route._final_hbar_kernel (the same
function, so the same sums). The scores are not bit-for-bit the Triton kernel's (the tensor cores' summation order
within a product and the float32 sums), so lists can differ where two blocks' scores tie to ~1e-5 of the row's spread.

Covers what the node runs from MIN_BLOCKS KV blocks on: bf16x3 scores (PSA_SCORE_PREC's default), head dim 128, pisa /
pwt without cov_bias, on SM90 with Triton's Gluon; anything else, or a build failure (logged once per device), runs
the Triton kernel.
"""
from __future__ import annotations

import logging
import os

import torch

try:  # Triton's Gluon (experimental; its API is pinned by the Triton this was written against)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait
    _cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
    HAVE_GLUON = True
except Exception:  # noqa: BLE001  (any import failure: older Triton, no NVIDIA backend)
    HAVE_GLUON = False

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
BM = 64  # query blocks per program row and KV blocks per tile
WARPS = 4  # one warpgroup
# below this many KV blocks a row of tiles is too short to pay for its program (FLUX.1 1024^2: 72 blocks, 2 rows of 2
# tiles per head, 48 programs for 132 SMs, where the Triton kernel runs 96 one-tile programs): the Triton kernel
MIN_BLOCKS = 256

if HAVE_GLUON:
    @gluon.jit
    def _split_store(x, s_hi, s_lo):
        """float32 x = hi + lo + O(2^-17 |x|) (stats2._bf16_parts): both bfloat16 parts into shared memory."""
        hi = x.to(gl.bfloat16)
        s_hi.store(hi)
        s_lo.store((x - hi.to(gl.float32)).to(gl.bfloat16))

    @gluon.jit
    def _dot3(a_hi, a_lo, b_hi, b_lo, acc):
        """acc + A B^T from the parts, route._dot_bf16x3's order (the small terms first), issued asynchronously."""
        acc = warpgroup_mma(a_hi, b_lo.permute([1, 0]), acc, is_async=True)
        acc = warpgroup_mma(a_lo, b_hi.permute([1, 0]), acc, is_async=True)
        return warpgroup_mma(a_hi, b_hi.permute([1, 0]), acc, is_async=True)

    @gluon.jit
    def _scores_gl_kernel(QBAR, KBAR, Q2, KSIG2, SCORE, VBIAS, N, HC, H0, HSUB, band, n_sink, scale, half_s2, ln_b,
                          D: gl.constexpr, BM: gl.constexpr, PWT: gl.constexpr):
        """Program (query block row i_m, local head i_loc): scores and bias rows of every (query, KV) block pair of
        that row, route._scores_kernel's outputs (SCORE: this sub-chunk's heads; VBIAS: all heads)."""
        i_m = gl.program_id(0)
        i_loc = gl.program_id(1)
        i_bh = (i_loc // HSUB) * HC + H0 + i_loc % HSUB
        # float32 operand tiles: a warp reads one 512-byte row per instruction
        LD: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [gl.num_warps(), 1], [1, 0])
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                      instr_shape=[16, BM, 16])
        SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, D], gl.bfloat16)
        o_r = gl.arange(0, BM, layout=gl.SliceLayout(1, LD))
        o_d = gl.arange(0, D, layout=gl.SliceLayout(0, LD))
        base = i_bh.to(gl.int64) * N * D
        rows = i_m * BM + o_r
        p_a = base + rows[:, None].to(gl.int64) * D + o_d[None, :]
        m_a = (rows < N)[:, None]
        a_hi = gl.allocate_shared_memory(gl.bfloat16, [BM, D], SL)
        a_lo = gl.allocate_shared_memory(gl.bfloat16, [BM, D], SL)
        b_hi = gl.allocate_shared_memory(gl.bfloat16, [BM, D], SL)
        b_lo = gl.allocate_shared_memory(gl.bfloat16, [BM, D], SL)
        _split_store(gl.load(QBAR + p_a, mask=m_a, other=0.0), a_hi, a_lo)
        if PWT:
            a2_hi = gl.allocate_shared_memory(gl.bfloat16, [BM, D], SL)
            a2_lo = gl.allocate_shared_memory(gl.bfloat16, [BM, D], SL)
            _split_store(gl.load(Q2 + p_a, mask=m_a, other=0.0), a2_hi, a2_lo)
        else:
            a2_hi = a_hi
            a2_lo = a_lo
        r_i = i_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, ACC))
        c_0 = gl.arange(0, BM, layout=gl.SliceLayout(0, ACC))
        o_row = r_i * N
        p_s = SCORE + i_loc.to(gl.int64) * N * N
        p_v = VBIAS + i_bh.to(gl.int64) * N * N
        x_b = gl.load(KBAR + base + o_r[:, None].to(gl.int64) * D + o_d[None, :], mask=(o_r < N)[:, None], other=0.0)
        for j in range(0, gl.cdiv(N, BM)):
            # (the tile's offsets recomputed per tile: kept live across the loop, their 64 int64 values spill)
            cols = j * BM + o_r
            p_b = base + cols[:, None].to(gl.int64) * D + o_d[None, :]
            m_b = (cols < N)[:, None]
            _cta_barrier()  # every warp is past the last products' wait: b_hi / b_lo are free
            _split_store(x_b, b_hi, b_lo)
            fence_async_shared()
            _cta_barrier()  # every warp's part is in before the warpgroup's products read it
            acc = _dot3(a_hi, a_lo, b_hi, b_lo, gl.zeros([BM, BM], gl.float32, ACC))
            if PWT:
                x_w = gl.load(KSIG2 + p_b, mask=m_b, other=0.0)  # under the products
            acc = warpgroup_mma_wait(0, deps=[acc])
            w = gl.zeros([BM, BM], gl.float32, ACC)
            if PWT:
                _cta_barrier()
                _split_store(x_w, b_hi, b_lo)
                fence_async_shared()
                _cta_barrier()
                w = _dot3(a2_hi, a2_lo, b_hi, b_lo, w)
            # the next k-bar tile's loads under the products (masked off past the last tile)
            nxt = cols + BM
            x_b = gl.load(KBAR + base + nxt[:, None].to(gl.int64) * D + o_d[None, :], mask=(nxt < N)[:, None],
                          other=0.0)
            if PWT:
                w = warpgroup_mma_wait(0, deps=[w])
            # route._score_tile's epilogue
            c_j = j * BM + c_0
            s = acc * scale
            if PWT:
                w = w * half_s2
                s += gl.minimum(w, ln_b)
                vb = gl.where(w <= ln_b, w, 0.0)  # gates a NaN w too
            else:
                vb = w
            s = gl.where(s != s, -1e30, s)
            s = gl.minimum(gl.maximum(s, -1e30), 1e30)
            d_ij = r_i[:, None] - c_j[None, :]
            forced = ((d_ij <= band) & (d_ij >= -band)) | (c_j[None, :] < n_sink)
            s = gl.where(forced, float("inf"), s)
            o_ij = o_row[:, None] + c_j[None, :]  # int32 within the head (N^2 < 2^31)
            m_ij = (r_i < N)[:, None] & (c_j < N)[None, :]
            gl.store(p_s + o_ij, s, mask=m_ij)
            gl.store(p_v + o_ij, vb.to(VBIAS.dtype.element_ty), mask=m_ij)

_log = logging.getLogger("piecewise_sparse_attention")
_broken: dict[str, str] = {}  # device -> why the Gluon kernel failed there (then the Triton kernel runs, logged once)


def enabled() -> bool:
    """PSA_ROUTE_GLUON=1 (read per call, in the CUDA-graph key): this kernel where usable() holds. Off: session 29 on
    the H200 (bench/results/route_gl_ab_s29_h200.txt, 5 alternated rounds) passed its 15 GPU tests and the forward
    ones with it, but route() took 1.072 -> 1.366 ms at Wan2.1-14B 720p (the scores 0.535 -> 0.830) and 0.183 ->
    0.187 at 480p, slower in every round; fewer SASS instructions per tile did not make the row-walking programs
    faster than the Triton kernel's one-tile programs."""
    return os.environ.get("PSA_ROUTE_GLUON", "0").strip() == "1"


def usable(st, cfg, prec: str) -> bool:
    """The scores of pisa / pwt (no cov_bias) at head dim 128 in bf16x3 on SM90 from MIN_BLOCKS KV blocks on, from
    contiguous float32 statistics."""
    if not (HAVE_GLUON and enabled()) or _INTERPRET or prec != "bf16x3" or cfg.cov_bias:
        return False
    kb = st.kbar
    if not kb.is_cuda or kb.shape[-1] != 128 or kb.shape[-2] < MIN_BLOCKS or str(kb.device) in _broken:
        return False
    if torch.cuda.get_device_capability(kb.device) != (9, 0):
        return False
    xs = (st.qbar, st.kbar) + ((st.q2, st.ksig2) if cfg.variant == "pwt" else ())
    return all(x is not None and x.dtype == torch.float32 and x.is_contiguous() for x in xs)


def scores(st, score, vbias, *, n, hc, h0, hs, band, n_sink, scale, half_s2, ln_b, pwt) -> bool:
    """route._scores_kernel's launch for heads h0 .. h0 + hs of every batch element (without H-bar's reduction);
    False when the Gluon kernel fails to build or launch here (logged once per device: the caller runs Triton's)."""
    B = st.kbar.shape[0]
    q2, ks2 = (st.q2, st.ksig2) if pwt else (st.qbar, st.kbar)
    try:
        _scores_gl_kernel[(-(-n // BM), B * hs)](
            st.qbar, st.kbar, q2, ks2, score, vbias, n, hc, h0, hs, band, n_sink, scale, half_s2, ln_b,
            D=st.kbar.shape[-1], BM=BM, PWT=pwt, num_warps=WARPS)
    except Exception as e:  # noqa: BLE001  (a Triton whose Gluon API differs: the Triton kernel instead)
        _broken[str(st.kbar.device)] = f"{type(e).__name__}: {e}"
        _log.warning("piecewise_sparse_attention: the Gluon routing scores kernel failed on %s (%s); the Triton "
                     "scores kernel runs instead", st.kbar.device, _broken[str(st.kbar.device)][:300])
        return False
    return True

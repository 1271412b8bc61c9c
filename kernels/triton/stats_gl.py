"""Block statistics and the H partials in one pass, as Gluon kernels (Triton's lower-level language; issue #11).

Why: stats_h._stats_h_kernel (Triton) reads q, k and v once but ran at ~70% of that read's bound on the H200
(Wan2.1-14B 480p 0.354 ms against 0.25; session 14's profile: 731 SASS instructions and 2 CTA barriers per 64-token
block, the mma.sync column sums queued behind the K^T V wgmma on the tensor pipe, one 8-warp program per SM). Triton
picks the layout of a reduction, so its column sums had to be tensor-core products against a ones tile (and the
squares bfloat16 high / low parts). Gluon lets the kernel pick the layout and split the warps:

- persistent: one CTA per SM walks (batch, head, partial) items of G blocks (stats_h.parts_per_head's split);
- a loader warp brings each block's q / k / v tiles in by TMA into a STAGES-deep ring (ready / empty mbarriers;
  rows past T are the descriptor's zero fill, so no masked loads and no redone last block), running on across items;
- 8 consumer warps, each owning 16 columns of every tile and all 64 rows (RED: 2 x 2 elements per thread and step,
  4 x 8 threads per warp; rows 2 apart, which the 128-byte swizzle puts in different banks): every column sum is
  16 float32 adds in a thread and two shuffle levels, no cross-warp step; q^2 and the centred key squares are float32
  FMAs of exact products (16-bit squares are exact in float32), no tensor cores;
- sum_j K_j^T V_j on wgmma from the staged tiles (K^T a transposed shared-memory view) into a [D, D] float32
  accumulator (2 warpgroups x 64 rows); each block's kbar_j (x) vsum_j comes off it in float32 once its wgmma is done
  (MATH.md's exact identity, as stats_h; no value sums kept for after the loop); one partition barrier per block
  before the slot is freed.

The Morton path (`_stats_gl_gather_kernel`): SM90 has no TMA gather, so 4 loader warps copy each block's 64 rows
through the permutation with 16-byte cp.async (each loader thread's copies arrive on the slot's barrier when they
land), and the consumers send the staged tiles out to their block-order copies with TMA stores (their reads of the
slot waited for before it is freed), so q, k and v are read once and written once.

Same outputs as stats_h.stats_with_h (st32, lp, hpart). Non-finite inputs: an item whose partial or q sums come out
non-finite sets its flag, and stats_h.redo_flagged runs stats_h's kernel again over the flagged programs only (the
others return at once), whose masked path gives MATH.md's non-finite contract. Built against Triton 3.6 (the H200
image's) and compiled by CI's 3.8 (tests/test_triton_compile.py); without Gluon, for float32 inputs, head dims
other than 128, GPUs other than SM90 or views TMA refuses, stats_h runs; a Gluon kernel that fails to build is
logged once and stats_h runs from then on.
"""
from __future__ import annotations

import logging
import os

import torch

from ..config import env_switch
from .stats import _n_sm

try:  # Triton's Gluon (experimental; its API is pinned by the Triton this was written against)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    # a CTA barrier: gl.thread_barrier in Triton 3.6 (the H200 image), gl.barrier in 3.8
    _cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
    HAVE_GLUON = True
except Exception:  # noqa: BLE001  (any import failure: older Triton, no NVIDIA backend)
    HAVE_GLUON = False

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
STAGES = int(os.environ.get("PSA_STATS_GL_STAGES", "4") or 4)


if HAVE_GLUON:
    @gluon.jit
    def _gl_item(item, HC, N, G, NPART):
        """Work item -> (batch, head, first block, block count, partial index)."""
        i_g = item % NPART
        bh = item // NPART
        j0 = i_g * G
        return bh // HC, bh % HC, j0, gl.minimum(j0 + G, N) - j0, i_g

    @gluon.jit
    def _gl_loader(q_desc, k_desc, v_desc, sq, sk, sv, ready, empty, HC, N, G, NPART, n_items, BS: gl.constexpr,
                   STAGES: gl.constexpr, TILE_BYTES: gl.constexpr):
        """The worker warp: every block of this CTA's items, its q / k / v tiles into the ring once the consumers
        have freed the slot (the ring runs on across items, so the next item's tiles load under this one's end)."""
        c = 0
        for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
            i_b, i_h, j0, n_j, i_g = _gl_item(item, HC, N, G, NPART)
            for it in range(n_j):
                s = c % STAGES
                mbarrier.wait(empty.index(s), (c // STAGES) & 1)
                mbarrier.expect(ready.index(s), TILE_BYTES)
                row = (j0 + it) * BS
                tma.async_copy_global_to_shared(q_desc, [i_b, i_h, row, 0], ready.index(s), sq.index(s))
                tma.async_copy_global_to_shared(k_desc, [i_b, i_h, row, 0], ready.index(s), sk.index(s))
                tma.async_copy_global_to_shared(v_desc, [i_b, i_h, row, 0], ready.index(s), sv.index(s))
                c += 1

    @gluon.jit
    def _gl_consumer(sq, sk, sv, ready, empty, ST32, LP, HPART, FLAG, qg_desc, kg_desc, vg_desc, HC, T, N, G, NPART,
                     SROW, n_items, D: gl.constexpr, BS: gl.constexpr, NEED_PWT: gl.constexpr, STAGES: gl.constexpr,
                     COPY: gl.constexpr):
        """The 8 consumer warps, per item: every block's statistics (stored as they come), sum_j H_j (the H
        partial, stored at the item's end) and the item's non-finite flag. COPY (the Morton gather): the staged
        k and v tiles (2: and q's) go out to their block-order copies by TMA stores, issued as a block's tiles
        arrive and waited for (their reads of the slot) before the slot is freed."""
        dt: gl.constexpr = sq.dtype
        # every column sum inside one warp: 8 warps x 16 columns, 4 x 8 threads, 2 x 2 elements per step
        RED: gl.constexpr = gl.BlockedLayout([2, 2], [4, 8], [1, gl.num_warps()], [1, 0])
        COL: gl.constexpr = gl.SliceLayout(0, RED)
        ROW: gl.constexpr = gl.SliceLayout(1, RED)
        ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                      instr_shape=[16, D, 16])
        A_ROW: gl.constexpr = gl.SliceLayout(1, ACC)
        A_COL: gl.constexpr = gl.SliceLayout(0, ACC)
        o_d = gl.arange(0, D, layout=COL)
        o_m = gl.arange(0, BS, layout=ROW)
        r_d = gl.arange(0, D, layout=A_ROW)
        c_d = gl.arange(0, D, layout=A_COL)
        QBAR = ST32
        KBAR = ST32 + SROW
        Q2 = ST32 + 2 * SROW
        KSIG2 = ST32 + 3 * SROW
        KBAR_LP = LP
        VMEAN_LP = LP + SROW
        c = 0
        for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
            i_b, i_h, j0, n_j, i_g = _gl_item(item, HC, N, G, NPART)
            i_bh = i_b * HC + i_h
            b_c = gl.zeros([D], gl.float32, COL)
            if NEED_PWT:  # sigma^2's centre: the item's first key row (0 where it is not finite)
                mbarrier.wait(ready.index(c % STAGES), (c // STAGES) & 1)
                b_k0 = sk.index(c % STAGES).reshape([BS, D]).load(RED).to(gl.float32)
                b_c = gl.sum(gl.where((o_m == 0)[:, None], b_k0, 0.0), axis=0)
                b_c = gl.where(b_c * 0.0 == 0.0, b_c, 0.0)
            bad = gl.zeros([D], gl.float32, COL)
            acc = gl.zeros([D, D], gl.float32, ACC)
            for it in range(n_j):
                j = j0 + it
                s = c % STAGES
                mbarrier.wait(ready.index(s), (c // STAGES) & 1)
                tq = sq.index(s).reshape([BS, D])
                tk = sk.index(s).reshape([BS, D])
                tv = sv.index(s).reshape([BS, D])
                if COPY > 0:  # the gathered tiles (cp.async, the generic proxy) out through the async proxy
                    fence_async_shared()
                    if COPY > 1:
                        tma.async_copy_shared_to_global(qg_desc, [i_b, i_h, j * BS, 0], sq.index(s))
                    tma.async_copy_shared_to_global(kg_desc, [i_b, i_h, j * BS, 0], sk.index(s))
                    tma.async_copy_shared_to_global(vg_desc, [i_b, i_h, j * BS, 0], sv.index(s))
                acc = warpgroup_mma(tk.permute([1, 0]), tv, acc, is_async=True)
                cnt = gl.minimum(T - j * BS, BS)
                rcnt = 1.0 / cnt.to(gl.float32)  # exact for whole blocks (1 / 64)
                b_q = tq.load(RED).to(gl.float32)
                s_q = gl.sum(b_q, axis=0)
                b_k = tk.load(RED).to(gl.float32)
                s_k = gl.sum(b_k, axis=0)
                b_v = tv.load(RED).to(gl.float32)
                s_v = gl.sum(b_v, axis=0)
                kbar = s_k * rcnt
                o_s = (i_bh * N + j).to(gl.int64) * D + o_d
                gl.store(QBAR + o_s, s_q * rcnt)
                gl.store(KBAR + o_s, kbar)
                gl.store(KBAR_LP + o_s, kbar.to(dt))
                gl.store(VMEAN_LP + o_s, (s_v * rcnt).to(dt))
                if NEED_PWT:
                    s_q2 = gl.sum(b_q * b_q, axis=0)
                    b_kc = b_k - b_c[None, :]
                    if cnt < BS:  # the zero-filled rows past T: no (0 - c)^2
                        b_kc = gl.where((o_m < cnt)[:, None], b_kc, 0.0)
                    s_kc2 = gl.sum(b_kc * b_kc, axis=0)
                    b_dc = kbar - b_c
                    s_sig2 = s_kc2 * rcnt - b_dc * b_dc
                    s_sig2 = gl.where(s_sig2 < 0.0, 0.0, s_sig2)  # rounding below 0 -> 0; NaN stays
                    gl.store(Q2 + o_s, s_q2 * rcnt)
                    gl.store(KSIG2 + o_s, s_sig2)
                    bad += s_q2 * 0.0
                bad += s_q * 0.0
                kb_r = gl.convert_layout(kbar, A_ROW)
                vs_c = gl.convert_layout(s_v, A_COL)
                acc = warpgroup_mma_wait(0, deps=[acc])
                if COPY > 0:
                    tma.store_wait(0)  # the copies have read slot s
                _cta_barrier()  # every consumer warp has read slot s
                mbarrier.arrive(empty.index(s), count=1)
                # H_j = K_j^T V_j - n_j kbar_j (x) vmean_j: the second term off in float32 (MATH.md's identity)
                acc -= kb_r[:, None] * vs_c[None, :]
                c += 1
            p_hs = HPART + (i_bh * NPART + i_g).to(gl.int64) * D * D
            gl.store(p_hs + r_d[:, None] * D + c_d[None, :], acc)
            flag = gl.sum(gl.sum(acc * 0.0, axis=1), axis=0) + gl.sum(bad, axis=0)
            gl.store(FLAG + i_bh * NPART + i_g, (flag != 0.0).to(gl.int32))

    @gluon.jit
    def _gl_ring(desc, STAGES: gl.constexpr, READY_COUNT: gl.constexpr):
        """The q / k / v ring (STAGES slots of desc's block and layout) with its ready barriers (READY_COUNT
        arrivals each: 1 for TMA, the loader threads for cp.async) and its empty barriers (one consumer arrival;
        every slot starts free)."""
        sq = gl.allocate_shared_memory(desc.dtype, [STAGES] + desc.block_type.shape, desc.layout)
        sk = gl.allocate_shared_memory(desc.dtype, [STAGES] + desc.block_type.shape, desc.layout)
        sv = gl.allocate_shared_memory(desc.dtype, [STAGES] + desc.block_type.shape, desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i0 in gl.static_range(STAGES):
            mbarrier.init(ready.index(i0), count=READY_COUNT)
            mbarrier.init(empty.index(i0), count=1)
            mbarrier.arrive(empty.index(i0), count=1)
        return sq, sk, sv, ready, empty

    @gluon.jit
    def _gl_ring_end(ready, empty, STAGES: gl.constexpr):
        for i0 in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i0))
            mbarrier.invalidate(empty.index(i0))

    @gluon.jit
    def _stats_gl_kernel(q_desc, k_desc, v_desc, ST32, LP, HPART, FLAG, HC, T, N, G, NPART, SROW, n_items,
                         D: gl.constexpr, BS: gl.constexpr, NEED_PWT: gl.constexpr, STAGES: gl.constexpr):
        dt: gl.constexpr = q_desc.dtype
        sq, sk, sv, ready, empty = _gl_ring(q_desc, STAGES, 1)
        TILE_BYTES: gl.constexpr = 3 * BS * D * dt.primitive_bitwidth // 8
        gl.warp_specialize([
            (_gl_consumer, (sq, sk, sv, ready, empty, ST32, LP, HPART, FLAG, q_desc, k_desc, v_desc, HC, T, N, G,
                            NPART, SROW, n_items, D, BS, NEED_PWT, STAGES, 0)),
            (_gl_loader, (q_desc, k_desc, v_desc, sq, sk, sv, ready, empty, HC, N, G, NPART, n_items, BS, STAGES,
                          TILE_BYTES)),
        ], [1], [40])
        _gl_ring_end(ready, empty, STAGES)


    @gluon.jit
    def _gl_gather_loader(Q, K, V, PERM, sq, sk, sv, ready, empty, sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                          HC, T, N, G, NPART, n_items, D: gl.constexpr, BS: gl.constexpr, STAGES: gl.constexpr,
                          LOADER_WARPS: gl.constexpr):
        """The Morton path's loader warps: each block's 64 rows through the permutation (q / k / v row PERM[t] of
        the caller's tensors, rows past T zero), 16-byte cp.async copies into the ring; each loader thread's own
        copies arrive on the slot's ready barrier when they land (its count: the loader's threads)."""
        LD: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [LOADER_WARPS, 1], [1, 0])
        # every stride a multiple of 8 elements (16 bytes: usable() checks it), so each row's 16-byte pieces are
        # aligned whatever the launcher could prove about the values
        sq_b = gl.multiple_of(sq_b, 8)
        sq_h = gl.multiple_of(sq_h, 8)
        sq_t = gl.multiple_of(sq_t, 8)
        sk_b = gl.multiple_of(sk_b, 8)
        sk_h = gl.multiple_of(sk_h, 8)
        sk_t = gl.multiple_of(sk_t, 8)
        sv_b = gl.multiple_of(sv_b, 8)
        sv_h = gl.multiple_of(sv_h, 8)
        sv_t = gl.multiple_of(sv_t, 8)
        o_m = gl.arange(0, BS, layout=gl.SliceLayout(1, LD))
        o_d = gl.arange(0, D, layout=gl.SliceLayout(0, LD))
        c = 0
        for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
            i_b, i_h, j0, n_j, i_g = _gl_item(item, HC, N, G, NPART)
            p_q = Q + i_b.to(gl.int64) * sq_b + i_h.to(gl.int64) * sq_h
            p_k = K + i_b.to(gl.int64) * sk_b + i_h.to(gl.int64) * sk_h
            p_v = V + i_b.to(gl.int64) * sv_b + i_h.to(gl.int64) * sv_h
            for it in range(n_j):
                s = c % STAGES
                o_t = (j0 + it) * BS + o_m
                m_t = o_t < T
                rows = gl.load(PERM + o_t, mask=m_t, other=0).to(gl.int64)
                m2 = gl.broadcast(m_t[:, None], o_d[None, :])[0]  # (constant along a row: 16-byte copies)
                mbarrier.wait(empty.index(s), (c // STAGES) & 1)
                # (a row's 8-element pieces contiguous and 16-byte aligned, a pointer hint in bytes: 16-byte cp.async)
                pq = gl.max_contiguous(gl.multiple_of(p_q + rows[:, None] * sq_t + o_d[None, :], [1, 16]), [1, 8])
                pk = gl.max_contiguous(gl.multiple_of(p_k + rows[:, None] * sk_t + o_d[None, :], [1, 16]), [1, 8])
                pv = gl.max_contiguous(gl.multiple_of(p_v + rows[:, None] * sv_t + o_d[None, :], [1, 16]), [1, 8])
                async_copy.async_copy_global_to_shared(sq.index(s).reshape([BS, D]), pq, mask=m2)
                async_copy.async_copy_global_to_shared(sk.index(s).reshape([BS, D]), pk, mask=m2)
                async_copy.async_copy_global_to_shared(sv.index(s).reshape([BS, D]), pv, mask=m2)
                async_copy.mbarrier_arrive(ready.index(s), increment_count=False)
                c += 1

    @gluon.jit
    def _stats_gl_gather_kernel(Q, K, V, PERM, qg_desc, kg_desc, vg_desc, ST32, LP, HPART, FLAG,
                                sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, HC, T, N, G, NPART, SROW, n_items,
                                D: gl.constexpr, BS: gl.constexpr, NEED_PWT: gl.constexpr, STAGES: gl.constexpr,
                                COPY: gl.constexpr, LOADER_WARPS: gl.constexpr):
        """The statistics through the Morton permutation, writing the block-order copies of k and v (COPY 1) or of
        q, k and v (COPY 2) from the staged tiles (the copies' descriptors give the ring's shared-memory layout)."""
        sq, sk, sv, ready, empty = _gl_ring(kg_desc, STAGES, LOADER_WARPS * 32)
        gl.warp_specialize([
            (_gl_consumer, (sq, sk, sv, ready, empty, ST32, LP, HPART, FLAG, qg_desc, kg_desc, vg_desc, HC, T, N, G,
                            NPART, SROW, n_items, D, BS, NEED_PWT, STAGES, COPY)),
            (_gl_gather_loader, (Q, K, V, PERM, sq, sk, sv, ready, empty, sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b,
                                 sv_h, sv_t, HC, T, N, G, NPART, n_items, D, BS, STAGES, LOADER_WARPS)),
        ], [LOADER_WARPS], [80])
        _gl_ring_end(ready, empty, STAGES)


_log = logging.getLogger("piecewise_sparse_attention")
_broken: dict[str, str] = {}  # device -> why the Gluon kernel failed there (then stats_h runs, logged once)


def enabled() -> bool:
    """PSA_STATS_GLUON (read per call, in the CUDA-graph key; "0" turns it off): these kernels where usable() holds. On
    by default since session 29. Session 26 on the H200 (bench/results/stats_gl_s26_h200.txt, the raster kernel):
    Wan2.1-14B 480p raster 0.354 -> 0.273 ms (67% -> 87% of one read of q, k, v at the copy rate), 720p 0.792 -> 0.592
    (93%), FLUX.1 1024^2 0.038 -> 0.038, faster in every round; H-bar and sigma^2 closer to float64 than stats_h's (keys
    offset by 4: H-bar 7.0e-6 -> 1.0e-6 rel L2). Session 29 (stats_gl_ab_s29_h200.txt, 3 rounds): raster 0.360 ->
    0.278 / 0.820 -> 0.606, node layout 0.379 -> 0.282 / 0.839 -> 0.616, the Morton gather (q, k, v copies) 0.598 ->
    0.583 / 1.334 -> 1.315 (its bound 0.47 / 1.08: both kernels ~80%, the gather's prediction of 0.50-0.53 missed);
    its 33 GPU tests, every forward GPU test (310; the 4 failing were a lazy-rescale build's, since removed) and the
    32 backward ones passed with it; the node's call within 1% of stats_h at every shape (switch_stats_gluon_s29_h200
    .txt, 5 rounds: 480p -1.5% to +0.8%, 720p -1.4% / -0.6%, FLUX.1 +0.6%): on."""
    return env_switch("PSA_STATS_GLUON", True)


def usable(q, k, v, perm, gathered, gather_from: int = 0) -> bool:
    """This kernel covers the statistics of 16-bit q, k, v with head dim 128 on SM90 (TMA and wgmma): raster or node
    layout (no perm), and the Morton gather that writes the block-order copies (perm with `gathered`, the k and v
    copies at least), for tensors whose rows and strides TMA / 16-byte cp.async accept; the rest runs stats_h."""
    if not (HAVE_GLUON and enabled()) or _INTERPRET or not q.is_cuda or (perm is None) != (gathered is None):
        return False
    if gather_from:  # (the cube order's tail copies: stats_h's per-thread stores. Session 34's first build took them
        # here too, behind a run-time branch around the copies, and its test hit an illegal instruction on an H100;
        # which arm raised it was not seen, so this kernel stays as it was)
        return False
    if q.dtype not in (torch.bfloat16, torch.float16) or not (q.dtype == k.dtype == v.dtype) or q.shape[-1] != 128:
        return False
    if str(q.device) in _broken or torch.cuda.get_device_capability(q.device) != (9, 0):
        return False
    from .fwd import tma_aligned
    xs = (q, k, v) + (tuple(x for x in gathered if x is not None) if gathered is not None else ())
    return all(tma_aligned(x) for x in xs)


def stats_with_h_checked(q, k, v, pm, strides, g_args, *, n, bs, need_pwt, parts, perm=None, gathered=None):
    """(st32, lp, hpart) as stats_h.stats_with_h gives them (the same arguments), from the Gluon kernels and the
    fix-up launch of stats_h._stats_h_kernel over the programs flagged non-finite; None if a Gluon kernel fails to
    build or launch here (logged once per device; the caller then runs stats_h)."""
    from . import stats_h
    try:
        if gathered is None:
            st32, lp, hpart, flag = stats_with_h_gl(q, k, v, n=n, bs=bs, need_pwt=need_pwt, parts=parts)
        else:
            st32, lp, hpart, flag = stats_with_h_gl_gather(q, k, v, perm, gathered, n=n, bs=bs, need_pwt=need_pwt,
                                                           parts=parts)
    except Exception as e:  # noqa: BLE001  (a Triton whose Gluon API differs: the Triton kernel instead)
        _broken[str(q.device)] = f"{type(e).__name__}: {e}"
        _log.warning("piecewise_sparse_attention: the Gluon statistics kernel failed on %s (%s); the Triton "
                     "statistics kernel runs instead", q.device, _broken[str(q.device)][:300])
        return None
    stats_h.redo_flagged(q, k, v, pm, strides, g_args, st32, lp, hpart, flag, n=n, bs=bs, need_pwt=need_pwt,
                         gathered=gathered is not None, gather_q=gathered is not None and gathered[0] is not None)
    return st32, lp, hpart


def _desc(x: torch.Tensor, bs: int) -> "TensorDescriptor":
    d = x.shape[-1]
    gdt = gl.bfloat16 if x.dtype == torch.bfloat16 else gl.float16
    lay = gl.NVMMASharedLayout.get_default_for([1, 1, bs, d], gdt)
    return TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, bs, d], lay)


def _outputs(q, n, parts, need_pwt):
    """(G blocks per item, P items per head, st32, lp, hpart, flag): stats_h.stats_with_h's buffers and the items'
    non-finite flags [B, HC, P] (int32)."""
    B, HC, T, D = q.shape
    g = -(-n // parts)
    p = -(-n // g)
    st32 = torch.empty(4 if need_pwt else 2, B, HC, n, D, device=q.device, dtype=torch.float32)
    lp = torch.empty(2, B, HC, n, D, device=q.device, dtype=q.dtype)
    hpart = torch.empty(B, HC, p, D, D, device=q.device, dtype=torch.float32)
    flag = torch.empty(B, HC, p, device=q.device, dtype=torch.int32)
    return g, p, st32, lp, hpart, flag


def stats_with_h_gl(q, k, v, *, n, bs, need_pwt, parts):
    """stats_h.stats_with_h's outputs (st32, lp, hpart) from _stats_gl_kernel, plus the flags [B, HC, P] (int32, 1
    where the item's sums came out non-finite: stats_h.redo_flagged redoes those)."""
    B, HC, T, D = q.shape
    g, p, st32, lp, hpart, flag = _outputs(q, n, parts, need_pwt)
    n_items = B * HC * p
    grid = min(n_items, _n_sm(q.device))
    _stats_gl_kernel[(grid,)](
        _desc(q, bs), _desc(k, bs), _desc(v, bs), st32, lp, hpart, flag, HC, T, n, g, p, B * HC * n * D, n_items,
        D=D, BS=bs, NEED_PWT=need_pwt, STAGES=STAGES, num_warps=8)
    return st32, lp, hpart, flag


LOADER_WARPS = 4  # the Morton gather's cp.async loader warps


def stats_with_h_gl_gather(q, k, v, perm, gathered, *, n, bs, need_pwt, parts):
    """stats_with_h_gl through the Morton permutation `perm` (int32, the caller's row of each block-order position),
    writing the block-order copies `gathered` = (q's or None, k's, v's) from the staged tiles."""
    B, HC, T, D = q.shape
    qg, kg, vg = gathered
    g, p, st32, lp, hpart, flag = _outputs(q, n, parts, need_pwt)
    n_items = B * HC * p
    kd, vd = _desc(kg, bs), _desc(vg, bs)
    _stats_gl_gather_kernel[(min(n_items, _n_sm(q.device)),)](
        q, k, v, perm, _desc(qg, bs) if qg is not None else kd, kd, vd, st32, lp, hpart, flag,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
        v.stride(2), HC, T, n, g, p, B * HC * n * D, n_items, D=D, BS=bs, NEED_PWT=need_pwt, STAGES=STAGES,
        COPY=2 if qg is not None else 1, LOADER_WARPS=LOADER_WARPS, num_warps=8)
    return st32, lp, hpart, flag

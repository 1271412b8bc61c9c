"""Block statistics and the H partials in one pass, as a Gluon kernel fed by TMA (raster / node layouts; issue #11).

Why: stats_h._stats_h_kernel (Triton) reads q, k and v once but runs at ~70% of that read's bound on the H200
(Wan2.1-14B 480p 0.354 ms against 0.25; session 14's profile: 731 SASS instructions and 2 CTA barriers per 64-token
block, the mma.sync column sums queued behind the K^T V wgmma on the tensor pipe, one 8-warp program per SM). Triton
picks the layout of a reduction, so the column sums had to become tensor-core products against a ones tile (and the
squares bfloat16 high / low parts). Gluon lets the kernel pick it:

- the q / k / v tiles of a block come in by TMA (one elected thread, STAGES-deep ring of mbarriers; rows past T are
  the descriptor's zero fill, so no mask and no redone last block);
- each of the 8 warps owns 16 columns of every tile and all 64 rows (REDUCE: 2 x 2 elements per thread and step,
  4 x 8 threads per warp), so every column sum is 16 float32 adds in a thread and two shuffle levels, with no
  cross-warp step and no CTA barrier; the rows a warp reads at once are 2 apart, which the 128-byte swizzle puts in
  different banks; q^2 and the centred key squares are float32 FMAs of exact products (bfloat16 / float16 squares
  are exact in float32), no tensor cores;
- sum_j K_j^T V_j on wgmma from the staged tiles (K^T a transposed shared-memory view), into a [D, D] float32
  accumulator (2 warpgroups x 64 rows), then sum_j kbar_j (x) vsum_j taken off after the loop as float32 FMAs
  (MATH.md's exact identity, as stats_h);
- one CTA barrier per block (the slot is refilled only after every warp has read it).

Same outputs and buffers as stats_h.stats_with_h (st32, lp, hpart; the value sums wait in the program's partial
slot). Non-finite inputs: a program whose partial or q sums come out non-finite sets its flag, and
stats_h._stats_h_kernel runs again for the flagged programs only (FIXUP: the others return at once), which takes
its masked path. Gluon is Triton's lower-level language (triton.experimental.gluon, Triton >= 3.6 here); without it,
or for the Morton gather, float32 inputs or head dims other than 64 / 128, stats_h runs.
"""
from __future__ import annotations

import logging
import os

import torch

try:  # Triton's Gluon (experimental; its API is pinned by the Triton this was written against)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
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
    def _gl_consumer(sq, sk, sv, ready, empty, ST32, LP, HPART, FLAG, HC, T, N, G, NPART, SROW, n_items,
                     D: gl.constexpr, BS: gl.constexpr, NEED_PWT: gl.constexpr, STAGES: gl.constexpr):
        """The 8 consumer warps, per item: every block's statistics (stored as they come), sum_j H_j (the H
        partial, stored at the item's end) and the item's non-finite flag."""
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
                gl.thread_barrier()  # every consumer warp has read slot s
                mbarrier.arrive(empty.index(s), count=1)
                # H_j = K_j^T V_j - n_j kbar_j (x) vmean_j: the second term off in float32 (MATH.md's identity)
                acc -= kb_r[:, None] * vs_c[None, :]
                c += 1
            p_hs = HPART + (i_bh * NPART + i_g).to(gl.int64) * D * D
            gl.store(p_hs + r_d[:, None] * D + c_d[None, :], acc)
            flag = gl.sum(gl.sum(acc * 0.0, axis=1), axis=0) + gl.sum(bad, axis=0)
            gl.store(FLAG + i_bh * NPART + i_g, (flag != 0.0).to(gl.int32))

    @gluon.jit
    def _stats_gl_kernel(q_desc, k_desc, v_desc, ST32, LP, HPART, FLAG, HC, T, N, G, NPART, SROW, n_items,
                         D: gl.constexpr, BS: gl.constexpr, NEED_PWT: gl.constexpr, STAGES: gl.constexpr):
        dt: gl.constexpr = q_desc.dtype
        sq = gl.allocate_shared_memory(dt, [STAGES] + q_desc.block_type.shape, q_desc.layout)
        sk = gl.allocate_shared_memory(dt, [STAGES] + k_desc.block_type.shape, k_desc.layout)
        sv = gl.allocate_shared_memory(dt, [STAGES] + v_desc.block_type.shape, v_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i0 in gl.static_range(STAGES):
            mbarrier.init(ready.index(i0), count=1)
            mbarrier.init(empty.index(i0), count=1)
            mbarrier.arrive(empty.index(i0), count=1)  # every slot starts free
        TILE_BYTES: gl.constexpr = 3 * BS * D * dt.primitive_bitwidth // 8
        gl.warp_specialize([
            (_gl_consumer, (sq, sk, sv, ready, empty, ST32, LP, HPART, FLAG, HC, T, N, G, NPART, SROW, n_items, D,
                            BS, NEED_PWT, STAGES)),
            (_gl_loader, (q_desc, k_desc, v_desc, sq, sk, sv, ready, empty, HC, N, G, NPART, n_items, BS, STAGES,
                          TILE_BYTES)),
        ], [1], [40])
        for i0 in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i0))
            mbarrier.invalidate(empty.index(i0))


_log = logging.getLogger("piecewise_sparse_attention")
_broken: dict[str, str] = {}  # device -> why the Gluon kernel failed there (then stats_h runs, logged once)


def enabled() -> bool:
    """PSA_STATS_GLUON (default on; read per call, in the CUDA-graph key): this kernel where usable() holds, =0 never.
    Session 26 on the H200 (bench/results/stats_gl_s26_h200.txt, graph replays, 3 alternated rounds, pwt bf16,
    medians): Wan2.1-14B 480p raster 0.354 -> 0.273 ms (67% -> 87% of one read of q, k, v at the copy rate), node
    layout 0.359 -> 0.277, 720p 0.792 -> 0.592 (93%), FLUX.1 1024^2 0.038 -> 0.038, faster in every round; H-bar and
    sigma^2 closer to float64 than stats_h's (keys offset by 4: H-bar 7.0e-6 -> 1.0e-6 rel L2)."""
    return os.environ.get("PSA_STATS_GLUON", "1").strip() != "0"


def usable(q, k, v, perm, gathered) -> bool:
    """This kernel covers the raster / node-layout statistics of 16-bit q, k, v with head dim 128 on SM90 (TMA and
    wgmma), with descriptors TMA accepts; the Morton gather (no TMA gather on SM90) and the rest run stats_h."""
    if not (HAVE_GLUON and enabled()) or _INTERPRET or perm is not None or gathered is not None or not q.is_cuda:
        return False
    if q.dtype not in (torch.bfloat16, torch.float16) or not (q.dtype == k.dtype == v.dtype) or q.shape[-1] != 128:
        return False
    if str(q.device) in _broken or torch.cuda.get_device_capability(q.device) != (9, 0):
        return False
    from .fwd import tma_aligned
    return all(tma_aligned(x) for x in (q, k, v))


def stats_with_h_checked(q, k, v, *, n, bs, need_pwt, parts):
    """(st32, lp, hpart) as stats_h.stats_with_h gives them, from _stats_gl_kernel and the fix-up launch of
    stats_h._stats_h_kernel over the programs flagged non-finite; None if the Gluon kernel fails to build or launch
    here (logged once per device; the caller then runs stats_h)."""
    from . import stats_h
    try:
        st32, lp, hpart, flag = stats_with_h_gl(q, k, v, n=n, bs=bs, need_pwt=need_pwt, parts=parts)
    except Exception as e:  # noqa: BLE001  (a Triton whose Gluon API differs: the Triton kernel instead)
        _broken[str(q.device)] = f"{type(e).__name__}: {e}"
        _log.warning("piecewise_sparse_attention: the Gluon statistics kernel failed on %s (%s); the Triton "
                     "statistics kernel runs instead", q.device, _broken[str(q.device)][:300])
        return None
    B, HC, T, D = q.shape
    g = -(-n // parts)
    p = -(-n // g)
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2))
    stages = stats_h.loop_stages(False, q.device)
    stats_h._stats_h_kernel[(p, HC, B)](
        q, k, v, q, st32, lp, hpart, q, k, v, q, k, v, *strides, 0, 0, 0, 0, 0, 0, HC, T, n, g, p, B * HC * n * D,
        flag, D=D, BS=bs, NEED_PWT=need_pwt, HAS_PERM=False, GATHER=False, GATHER_Q=False, LOWP=True, PREC=1,
        STAGES=stages, TMA_G=0, FIX=1, num_warps=stats_h.STATS_H_WARPS, num_stages=stages)
    return st32, lp, hpart


def _n_sm(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _desc(x: torch.Tensor, bs: int) -> "TensorDescriptor":
    d = x.shape[-1]
    gdt = gl.bfloat16 if x.dtype == torch.bfloat16 else gl.float16
    lay = gl.NVMMASharedLayout.get_default_for([1, 1, bs, d], gdt)
    return TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, bs, d], lay)


def stats_with_h_gl(q, k, v, *, n, bs, need_pwt, parts):
    """stats_h.stats_with_h's outputs (st32, lp, hpart) from _stats_gl_kernel, plus the flags [B, HC, P] (int32, 1
    where the program's sums came out non-finite: stats_h's FIXUP launch redoes those)."""
    B, HC, T, D = q.shape
    g = -(-n // parts)
    p = -(-n // g)
    st32 = torch.empty(4 if need_pwt else 2, B, HC, n, D, device=q.device, dtype=torch.float32)
    lp = torch.empty(2, B, HC, n, D, device=q.device, dtype=q.dtype)
    hpart = torch.empty(B, HC, p, D, D, device=q.device, dtype=torch.float32)
    flag = torch.empty(B, HC, p, device=q.device, dtype=torch.int32)
    n_items = B * HC * p
    grid = min(n_items, _n_sm(q.device))
    _stats_gl_kernel[(grid,)](
        _desc(q, bs), _desc(k, bs), _desc(v, bs), st32, lp, hpart, flag, HC, T, n, g, p, B * HC * n * D, n_items,
        D=D, BS=bs, NEED_PWT=need_pwt, STAGES=STAGES, num_warps=8)
    return st32, lp, hpart, flag

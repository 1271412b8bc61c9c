"""The piecewise sparse attention forward on Hopper (SM90) in CuTe DSL: WGMMA, TMA, warp specialisation.

One fused kernel (exact blocks and virtual tokens in one online softmax) rather than an exact block-sparse
pass merged through log-sum-exps with a separate virtual-token pass. Why: the virtual-token scan is the same
[64 x 64] x [64 x 128] tile pair as an exact block (block-mean keys k-bar against the query tile, then P
against the block value means), so it rides the same TMA pipeline and WGMMA code with another source tensor
and a bias row; a separate pass would re-read Q, write and re-read a partial output and its LSE (about
1 GB more HBM traffic at the Wan2.1-14B 480p shape, ~0.3 ms) and launch a second grid. Measured on the H200
(bench/results/cute_h200.md): the fused virtual part costs pwt - drop = 1.1 ms of 6.95 ms at that shape,
about what its extra tile traffic (8 k-bar + 8 value-mean + 2 H-bar tiles per query block next to 128 K/V
tiles) predicts; the split design was not built. The first-order term s (q H-bar) sum_U e(s-hat) is one
more WGMMA at the end (A = the query tile still in shared memory, B = H-bar as two 64-row tiles).

CTA = one 64-token query block i of one (batch, head), matching the routing granularity (S_i is per query
block), 2 warpgroups:
  * warpgroup 0, warp 0 (producer, 40 registers): TMA loads of Q_i, then for every routed block j in S_i
    the K_j and V_j tiles, then the k-bar / value-mean tiles of all KV blocks (virtual tokens, pisa/pwt)
    and the two H-bar tiles, all through one 4-stage mbarrier pipeline of 16 KiB tiles;
  * warpgroup 1 (consumer, 216 registers): S = Q K^T on WGMMA (m64n64k16; the query tile read from shared
    memory into registers once, Q_RS, so each S GEMM reads only K there), online softmax in registers (exp2, scale folded in, one running max shared by all terms),
    O += P V on WGMMA with P from registers (m64n128k16). The exact loop is software-pipelined as in
    FlashAttention-3: S_n = Q K_n^T is issued together with P_{n-1} V_{n-1}, so the tensor cores run
    both back to back (what overlaps the softmax: below). Virtual tiles add the bias row (-inf for an exact
    block, the gated PWT bonus otherwise) and weight P by the real token counts n_j; bias and n_j are held
    per column (16 per thread, loaded before the GEMM so the loads overlap it), not per accumulator element.
Two CTAs share an SM (launch bound 2 x 256 threads, ~81 KiB shared memory each), so one CTA's softmax
overlaps the other's tensor-core work. Every rescale of the running max multiplies all accumulated mass
(numerator, denominator and the first-order weight), as docs/MATH.md requires.

What bounds it (H200, Wan2.1-14B 480p, density 0.125, attention only, random inputs; every number below is
in bench/results/cute_iterations_h200.md). Each 64-row query block streams its own K/V tiles: 20480 query
blocks x 64 tiles x 32 KiB = 42.9 GB from L2 per call. Two probe builds of this kernel split the time: the
tile stream alone (the consumer waits for and releases every stage, computes nothing) takes 4.80-4.82 ms
(8.9 TB/s, the same at 4 and 5 stages, so bandwidth rather than latency), the consumer alone (every GEMM and
softmax on one resident tile) 4.85 ms; this kernel runs drop in 5.6-5.9 ms (bench_cute: 5.93 ms), pwt in
6.8-7.2 ms. Nsight Compute (clocks locked): the top stall is waiting for TMA tiles (long scoreboard), L2 at
65% of peak, tensor pipe at 57%. So drop sits within ~20% of the stream floor and the Triton kernel (same
64-row tiles, 6.5 ms) within ~35%; a further large step needs fewer bytes per call: coarser routing blocks,
which MATH.md does not allow, or tiles shared between query blocks (TMA multicast in a cluster), which only
pays on inputs whose adjacent lists overlap (their union is 0.68 of the two lists on DiT-like Morton
inputs, ~1.0 measured on random ones).
The design choices kept and the ones measured and dropped (two query blocks per CTA over the union of their
lists, a lazy running max, an exact loop that never waits for P V, two KV blocks per softmax step) are in
bench/results/cute_iterations_h200.md.

Shapes are runtime values (T, N, K, heads, batch): one compile per (variant family, stages) serves every
shape (1.5-3.5 s on the first call in a process, compile_stats()); cutlass-dsl also keeps compiled
modules in its file cache (CUTE_DSL_CACHE_DIR, default $TMPDIR/$USER/cutlass_python_cache).
"""
from __future__ import annotations

import logging
import os
import threading
import time

import torch

import cuda.bindings.driver as cuda  # noqa: F401  (cutlass-dsl's stream type)
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cute.runtime import from_dlpack

from ..dispatch import log_once
from .tile_ops import BS, LOG2E, TileOps

log = logging.getLogger("piecewise_sparse_attention")

IMPORT_ERROR = None  # this module only imports when nvidia-cutlass-dsl does (kernels/cute/__init__.py)

D_SUPPORTED = 128
from .switches import (  # noqa: E402  the switches and their measured history
    Q_RS, BIAS_L2, BIAS_PF, OUT_PERM, PAIR_OUT_PERM, Q_PERM, PAIR_MIN_BLOCKS, RECIP_STORE, PAIR_SHARE,
    PAIR_SHARE_MAX_SEL, PAIR_Q_PERM, PAIR_VT_STAGES, VT_PEEL, PINGPONG, TREE_MAX, TREE_SUM, S_AHEAD, PV_FENCE,
    PV_FENCE_VT, PV_PIN, TMA_STORE, TMA_STORE_ONE, S_AHEAD_VT, PAIR_DROP, BIAS_SLACK, _env_flag, q_perm_enabled,
    out_perm_enabled)


class PiecewiseSparseFwdSm90(TileOps):
    """Compile-time configuration: variant family (exact only, or exact + virtual tokens) and stages."""

    def __init__(self, approx: bool, kv_stages: int = 4, head_dim: int = 128, q_rs: bool = False,
                 bias_l2: bool = False, bias_pf: bool = False, out_perm: bool = False, q_perm: bool = False,
                 tree_max: bool = False, tree_sum: bool = False, pv_fence: bool = False, pv_fence_vt: bool = False,
                 pv_pin: bool = False, tma_store: bool = False):
        self.approx = approx
        # the epilogue through the query stage and one TMA store (tile_ops._store_tile_tma; TMA_STORE_ONE)
        self.tma_store = tma_store and not (out_perm or q_perm)
        self.pv_fence = pv_fence  # a fence before the wait for P V after an exact tile's softmax (PV_FENCE)
        self.pv_fence_vt = pv_fence_vt  # and after a virtual tile's (PV_FENCE_VT)
        self.pv_pin = pv_pin  # those fences predicated on the row sums (PV_PIN, tile_ops._pv_wait)
        self.tree_max = tree_max  # tile_ops._online_softmax's row max in pairs (TREE_MAX)
        self.tree_sum = tree_sum  # and its row sum (TREE_SUM)
        self.q_rs = q_rs  # S = Q K^T with Q from registers (read from shared memory once per CTA)
        self.bias_l2 = bias_l2  # the producer prefetches this query block's bias row into L2 at the start
        self.bias_pf = bias_pf  # a virtual tile's bias loaded one softmax earlier (after the previous tile's)
        self.out_perm = out_perm  # output row t written to row mPerm[t] (Morton: the caller's order)
        # query row t read from row mPerm[t] of the caller's q straight into the registers (Q_RS), no TMA and no
        # block-order copy of q (Morton); the output goes through mPerm too; pisa / pwt store the fragment into the
        # query stage for the q H-bar GEMM (its A operand from registers would outlive the loop: spills)
        assert not q_perm or (q_rs and out_perm), "q_perm needs q_rs and out_perm"
        self.q_perm = q_perm
        self.kv_stages = kv_stages
        self.d = head_dim
        self.qk_tiler = (BS, BS, head_dim)  # (M, N, K) of S = Q K^T
        self.pv_tiler = (BS, head_dim, BS)  # (M, N, K) of O = P V
        self.threads = 256
        self.regs_producer = 40
        self.regs_consumer = 216

    # ------------------------------------------------------------------ host side (traced once)
    def _host_setup(self, mQ4, mK4, mV4, mO4, mKb4, mVm4, mH4, q_stages: int, kv_stages: int) -> dict:
        """The (token, dim, (H, B)) views, tiled MMAs, shared-memory layouts (q_stages query tiles, kv_stages
        K/V tiles) and TMA atoms of the kernel (fwd_pair.py builds its own stage counts from the same)."""
        dt = mQ4.element_type

        def tok_major(x):  # [B, H, T, D] -> (T, D, (H, B)): rows = tokens, K-major
            return cute.make_tensor(x.iterator, cute.make_layout(
                (x.shape[2], x.shape[3], (x.shape[1], x.shape[0])),
                stride=(x.stride[2], x.stride[3], (x.stride[1], x.stride[0]))))

        def dim_major(x):  # [B, H, T, D] -> (D, T, (H, B)): the B operand of O = P V (MN-major)
            return cute.make_tensor(x.iterator, cute.make_layout(
                (x.shape[3], x.shape[2], (x.shape[1], x.shape[0])),
                stride=(x.stride[3], x.stride[2], (x.stride[1], x.stride[0]))))

        mQ, mK, mO, mKb = tok_major(mQ4), tok_major(mK4), tok_major(mO4), tok_major(mKb4)
        mV, mVm, mH = dim_major(mV4), dim_major(mVm4), dim_major(mH4)

        q_layout = utils.LayoutEnum.from_tensor(mQ)
        k_layout = utils.LayoutEnum.from_tensor(mK)
        v_layout = utils.LayoutEnum.from_tensor(mV)
        qk_mma = sm90_utils.make_trivial_tiled_mma(
            dt, dt, q_layout.sm90_mma_major_mode(), k_layout.sm90_mma_major_mode(), cutlass.Float32,
            (1, 1, 1), self.qk_tiler[:2],
            *((warpgroup.OperandSource.RMEM,) if self.q_rs else ()))
        pv_mma = sm90_utils.make_trivial_tiled_mma(
            dt, dt, warpgroup.OperandMajorMode.K, v_layout.sm90_mma_major_mode(), cutlass.Float32,
            (1, 1, 1), self.pv_tiler[:2], warpgroup.OperandSource.RMEM)
        # q H-bar: A = the query tile in shared memory, B = H-bar rows as "value" tiles
        qh_mma = sm90_utils.make_trivial_tiled_mma(
            dt, dt, q_layout.sm90_mma_major_mode(), v_layout.sm90_mma_major_mode(), cutlass.Float32,
            (1, 1, 1), self.pv_tiler[:2])

        sQ_layout = sm90_utils.make_smem_layout_a(q_layout, self.qk_tiler, dt, q_stages)
        sK_layout = sm90_utils.make_smem_layout_b(k_layout, self.qk_tiler, dt, kv_stages)
        sV_layout = sm90_utils.make_smem_layout_b(v_layout, self.pv_tiler, dt, kv_stages)

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        sQ0 = cute.slice_(sQ_layout, (None, None, 0))
        sK0 = cute.slice_(sK_layout, (None, None, 0))
        sV0 = cute.slice_(sV_layout, (None, None, 0))
        tma_q, gQt = cpasync.make_tiled_tma_atom(g2s, mQ, sQ0, (BS, self.d))
        tma_k, gKt = cpasync.make_tiled_tma_atom(g2s, mK, sK0, (BS, self.d))
        tma_v, gVt = cpasync.make_tiled_tma_atom(g2s, mV, sV0, (self.d, BS))
        tma_kb, gKbt = cpasync.make_tiled_tma_atom(g2s, mKb, sK0, (BS, self.d))
        tma_vm, gVmt = cpasync.make_tiled_tma_atom(g2s, mVm, sV0, (self.d, BS))
        tma_h, gHt = cpasync.make_tiled_tma_atom(g2s, mH, sV0, (self.d, BS))
        self.q_bytes = cute.size_in_bytes(dt, sQ0)
        self.kv_bytes = cute.size_in_bytes(dt, sK0)
        return dict(dt=dt, mQ=mQ, mO=mO, k_layout=k_layout, v_layout=v_layout, qk_mma=qk_mma, pv_mma=pv_mma,
                    qh_mma=qh_mma, sQ_layout=sQ_layout, sK_layout=sK_layout, sV_layout=sV_layout,
                    tmas=(tma_q, gQt, tma_k, gKt, tma_v, gVt, tma_kb, gKbt, tma_vm, gVmt, tma_h, gHt))

    @cute.jit
    def __call__(self, mQ4: cute.Tensor, mK4: cute.Tensor, mV4: cute.Tensor, mO4: cute.Tensor,
                 mKb4: cute.Tensor, mVm4: cute.Tensor, mH4: cute.Tensor, mVB: cute.Tensor,
                 mIdx: cute.Tensor, mPerm: cute.Tensor, n_vt: cutlass.Int32, scale_log2: cutlass.Float32,
                 scale: cutlass.Float32, stream: cuda.CUstream):
        hs = self._host_setup(mQ4, mK4, mV4, mO4, mKb4, mVm4, mH4, 1, self.kv_stages)
        dt, mQ, mO = hs["dt"], hs["mQ"], hs["mO"]
        sQ_layout, sK_layout, sV_layout = hs["sQ_layout"], hs["sK_layout"], hs["sV_layout"]

        @cute.struct
        class Smem:
            q_bar: cute.struct.MemRange[cutlass.Int64, 2]
            kv_bar: cute.struct.MemRange[cutlass.Int64, 2 * self.kv_stages]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sKV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]

        self.smem = Smem
        n_q = cute.ceil_div(mQ.shape[0], BS)
        tmas = hs["tmas"]
        if cutlass.const_expr(self.q_perm):  # the query TMA is not used: its tensor slot carries q itself
            tmas = (tmas[0], mQ) + tmas[2:]
        tma_o, gOt = tmas[0], tmas[1]  # the output's TMA store (tma_store), else placeholders
        if cutlass.const_expr(self.tma_store):
            tma_o, gOt = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), mO,
                                                     cute.slice_(sQ_layout, (None, None, 0)), (BS, self.d))
        self.kernel(hs["qk_mma"], hs["pv_mma"], hs["qh_mma"], *tmas, tma_o, gOt, mO, mVB, mIdx, mPerm, n_vt,
                    scale_log2, scale, sQ_layout, sK_layout, sV_layout).launch(
            grid=[n_q, mQ4.shape[1], mQ4.shape[0]], block=[self.threads, 1, 1], stream=stream,
            min_blocks_per_mp=2)

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(self, qk_mma: cute.TiledMma, pv_mma: cute.TiledMma, qh_mma: cute.TiledMma,
               tma_q: cute.CopyAtom, gQt: cute.Tensor, tma_k: cute.CopyAtom, gKt: cute.Tensor,
               tma_v: cute.CopyAtom, gVt: cute.Tensor, tma_kb: cute.CopyAtom, gKbt: cute.Tensor,
               tma_vm: cute.CopyAtom, gVmt: cute.Tensor, tma_h: cute.CopyAtom, gHt: cute.Tensor, tma_o, gOt,
               mO: cute.Tensor, mVB: cute.Tensor, mIdx: cute.Tensor, mPerm: cute.Tensor, n_vt: cutlass.Int32,
               scale_log2: cutlass.Float32, scale: cutlass.Float32,
               sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
               sV_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        i_q, i_h, i_b = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // 128)
        T = mO.shape[0]
        n_kv = (T + BS - 1) // BS
        n_sel = mIdx.shape[3]

        smem = utils.SmemAllocator()
        st = smem.allocate(self.smem)
        q_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.q_bar.data_ptr(), num_stages=1,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 4),
            tx_count=self.q_bytes, defer_sync=True)
        kv_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.kv_bar.data_ptr(), num_stages=self.kv_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 4),
            tx_count=self.kv_bytes, defer_sync=True)
        q_prod, q_cons = q_pipe.make_participants()
        kv_prod, kv_cons = kv_pipe.make_participants()

        sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = st.sKV.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = cute.make_tensor(cute.recast_ptr(sK.iterator, sV_layout.inner), sV_layout.outer)

        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        hb = (i_h, i_b)
        if wg == 0:
            cute.arch.setmaxregister_decrease(self.regs_producer)
            if warp == 0:
                # (TMA, tiles_rows, tiles_cols, (H, B)) views of every source
                tKs, tKg = self._tma_part(tma_k, sK, gKt, BS, self.d)
                tVs, tVg = self._tma_part(tma_v, sV, gVt, self.d, BS)
                if cutlass.const_expr(not self.q_perm):
                    tQs, tQg = self._tma_part(tma_q, sQ, gQt, BS, self.d)
                    h = q_prod.acquire_and_advance()
                    cute.copy(tma_q, tQg[(None, i_q, 0, hb)], tQs[(None, h.index)], tma_bar_ptr=h.barrier)
                if cutlass.const_expr(self.approx and self.bias_l2):
                    if n_vt > 0:
                        # the bias rows do not stay in L2 at large N (40 x 1182^2 float16 at 720p, read once
                        # each): this one is fetched now, while the exact tiles run, one 128-byte line per lane
                        for c in cutlass.range(cute.arch.lane_idx() * BS, n_kv, 32 * BS, unroll=1):
                            ptr = mVB.iterator + cute.crd2idx((i_b, i_h, i_q, c), mVB.layout)
                            cute.arch.prefetch(ptr.llvm_ptr, cache_level="L2")
                for kk in cutlass.range(n_sel, unroll=1):
                    j = mIdx[i_b, i_h, i_q, kk]
                    if j >= 0:  # (handles named apart from the query tile's: q_perm has none)
                        hk = kv_prod.acquire_and_advance()
                        cute.copy(tma_k, tKg[(None, j, 0, hb)], tKs[(None, hk.index)], tma_bar_ptr=hk.barrier)
                        hk = kv_prod.acquire_and_advance()
                        cute.copy(tma_v, tVg[(None, 0, j, hb)], tVs[(None, hk.index)], tma_bar_ptr=hk.barrier)
                if cutlass.const_expr(self.approx):
                    if n_vt > 0:
                        tKbs, tKbg = self._tma_part(tma_kb, sK, gKbt, BS, self.d)
                        tVms, tVmg = self._tma_part(tma_vm, sV, gVmt, self.d, BS)
                        tHs, tHg = self._tma_part(tma_h, sV, gHt, self.d, BS)
                        for t in cutlass.range(n_vt, unroll=1):
                            hk = kv_prod.acquire_and_advance()
                            cute.copy(tma_kb, tKbg[(None, t, 0, hb)], tKbs[(None, hk.index)],
                                      tma_bar_ptr=hk.barrier)
                            hk = kv_prod.acquire_and_advance()
                            cute.copy(tma_vm, tVmg[(None, 0, t, hb)], tVms[(None, hk.index)],
                                      tma_bar_ptr=hk.barrier)
                        for t in cutlass.range_constexpr(self.d // BS):
                            hk = kv_prod.acquire_and_advance()
                            cute.copy(tma_h, tHg[(None, 0, t, hb)], tHs[(None, hk.index)], tma_bar_ptr=hk.barrier)
        else:
            cute.arch.setmaxregister_increase(self.regs_consumer)
            ctid = tidx - 128
            # accumulate mode set once in this region (a value set inside a loop body would escape it);
            # accumulators are zeroed explicitly instead
            qk_mma.set(warpgroup.Field.ACCUMULATE, True)
            pv_mma.set(warpgroup.Field.ACCUMULATE, True)
            qh_mma.set(warpgroup.Field.ACCUMULATE, True)
            qk_thr = qk_mma.get_slice(ctid)
            pv_thr = pv_mma.get_slice(ctid)
            tSsQ = qk_thr.partition_A(sQ)
            tSrQ = qk_thr.make_fragment_A(tSsQ)
            tSrK = qk_thr.make_fragment_B(qk_thr.partition_B(sK))
            tOrV = pv_thr.make_fragment_B(pv_thr.partition_B(sV))
            acc_o = pv_thr.make_fragment_C(pv_thr.partition_shape_C(self.pv_tiler[:2]))
            acc_o.fill(0.0)
            s_shape = qk_thr.partition_shape_C(self.qk_tiler[:2])
            # coordinates (row, col) of each accumulator element of S within the 64 x 64 tile
            tScS = qk_thr.partition_C(cute.make_identity_tensor(self.qk_tiler[:2]))
            tOcO = pv_thr.partition_C(cute.make_identity_tensor(self.pv_tiler[:2]))
            n_rows = 2  # rows of the tile each thread holds (lane // 4 and lane // 4 + 8 of its warp)
            row_max = cute.make_rmem_tensor(cute.make_layout(n_rows), cutlass.Float32)
            row_sum = cute.make_rmem_tensor(cute.make_layout(n_rows), cutlass.Float32)
            row_g = cute.make_rmem_tensor(cute.make_layout(n_rows), cutlass.Float32)
            for r in cutlass.range_constexpr(n_rows):
                row_max[r] = -cutlass.Float32.inf
                row_sum[r] = 0.0
                row_g[r] = 0.0

            if cutlass.const_expr(self.q_perm):
                # each thread's fragment of the query tile from the caller's rows mPerm[t] (gQt carries q);
                # rows past T are zeros, as the TMA fills them
                sQi = cute.make_rmem_tensor(tSsQ[(None, None, None, 0)].shape, mO.element_type)
                self._load_q_rows(sQi, gQt, mPerm, qk_thr, i_q, T, hb)
                qh_index = 0
                if cutlass.const_expr(self.approx):
                    # the same fragment into the query stage (the inverse of Q_RS's copy), visible to the
                    # wgmma of q H-bar (async proxy) once the whole warpgroup has written its part
                    cute.autovec_copy(sQi, tSsQ[(None, None, None, 0)])
                    cute.arch.fence_view_async_shared()
                    cute.arch.barrier(barrier_id=1, number_of_threads=128)
            else:
                qh = q_cons.wait_and_advance()
                if cutlass.const_expr(self.q_rs):
                    # the query tile into registers once: every S GEMM then reads only K from shared memory
                    sQi = cute.make_rmem_tensor(tSsQ[(None, None, None, 0)].shape, mO.element_type)
                    cute.autovec_copy(tSsQ[(None, None, None, qh.index)], sQi)
                else:
                    sQi = tSrQ[(None, None, None, qh.index)]
            rem = T - (n_kv - 1) * BS  # real tokens in the last block
            alpha = cute.make_rmem_tensor(cute.make_layout(n_rows), cutlass.Float32)
            acc_s = cute.make_rmem_tensor(s_shape, cutlass.Float32)
            tOrP = cute.make_rmem_tensor(pv_thr.partition_shape_A(self.pv_tiler[::2]), mO.element_type)
            n_valid, kk_tail = self._list_scan(mIdx, i_b, i_h, i_q, n_sel, n_kv, rem)  # list length, partial block
            # one software-pipelined loop over every tile: the n_valid exact K/V tile pairs, then (pisa/pwt)
            # the n_vt virtual ones (k-bar against Q, P against the value means), in the producer's order.
            # While P_{u-1} V_{u-1} runs on the tensor cores, the softmax of S_u = Q K_u^T runs on the other units
            # (FlashAttention-3 style, within the warpgroup); a virtual tile's bias row and token counts are
            # loaded before its S GEMM is waited for.
            n_last = cutlass.Float32(rem)
            n_tiles = n_valid
            # a virtual tile's per-column bias and token counts (tile_ops._load_bias)
            n_cols = cute.size(acc_s) // n_rows
            bias = cute.make_rmem_tensor(cute.make_layout(n_cols), cutlass.Float32)
            cnt = cute.make_rmem_tensor(cute.make_layout(n_cols), cutlass.Float32)
            if cutlass.const_expr(self.approx):
                n_tiles = n_valid + n_vt
            if n_tiles > 0:
                if cutlass.const_expr(self.approx):
                    if n_valid == 0:
                        self._load_bias(bias, cnt, mVB, tScS, i_b, i_h, i_q, 0, n_kv, n_last)
                kh0 = kv_cons.wait_and_advance()
                self._issue_ss(qk_mma, acc_s, sQi, tSrK[(None, None, None, kh0.index)])
                warpgroup.wait_group(0)
                kh0.release()
                self._softmax_tile(acc_s, acc_o, row_max, row_sum, row_g, scale_log2, alpha, bias, cnt, tScS,
                                   n_valid == 0, kk_tail == 0, rem, True)
                if cutlass.const_expr(self.approx and self.bias_pf):
                    if 1 < n_tiles:
                        if 1 >= n_valid:
                            self._load_bias(bias, cnt, mVB, tScS, i_b, i_h, i_q, 1 - n_valid, n_kv, n_last)
                self._to_p(acc_s, tOrP)
                for u in cutlass.range(1, n_tiles, unroll=1):
                    if cutlass.const_expr(self.approx and not self.bias_pf):
                        if u >= n_valid:
                            self._load_bias(bias, cnt, mVB, tScS, i_b, i_h, i_q, u - n_valid, n_kv, n_last)
                    vh = kv_cons.wait_and_advance()  # V_{u-1} (or the value means of a virtual tile)
                    kh = kv_cons.wait_and_advance()  # K_u (or the k-bar tile)
                    self._issue_ss(qk_mma, acc_s, sQi, tSrK[(None, None, None, kh.index)])
                    self._issue_rs(pv_mma, acc_o, tOrP, tOrV[(None, None, None, vh.index)])
                    warpgroup.wait_group(1)  # S_u ready; P_{u-1} V_{u-1} may still run
                    kh.release()
                    self._softmax_tile(acc_s, acc_o, row_max, row_sum, row_g, scale_log2, alpha, bias, cnt, tScS,
                                       u >= n_valid, kk_tail == u, rem, False)
                    if cutlass.const_expr(self.approx and self.bias_pf):
                        if u + 1 < n_tiles:  # the next tile's bias, while P V runs
                            if u + 1 >= n_valid:
                                self._load_bias(bias, cnt, mVB, tScS, i_b, i_h, i_q, u + 1 - n_valid, n_kv,
                                                n_last)
                    self._pv_wait(False, row_sum)
                    vh.release()
                    self._rescale_o(acc_o, alpha)
                    self._to_p(acc_s, tOrP)
                vhl = kv_cons.wait_and_advance()
                self._issue_rs(pv_mma, acc_o, tOrP, tOrV[(None, None, None, vhl.index)])
                warpgroup.wait_group(0)
                vhl.release()
            if cutlass.const_expr(self.approx):
                if n_vt > 0:
                    # first-order term: acc += s (q H-bar) * g, g = sum_U e(s-hat) (per row, all threads)
                    qh_thr = qh_mma.get_slice(ctid)
                    tHrQ = qh_thr.make_fragment_A(qh_thr.partition_A(sQ))[
                        (None, None, None, qh_index if cutlass.const_expr(self.q_perm) else qh.index)]
                    tHrH = qh_thr.make_fragment_B(qh_thr.partition_B(sV))
                    acc_h = qh_thr.make_fragment_C(qh_thr.partition_shape_C(self.pv_tiler[:2]))
                    hhs = []
                    for t in cutlass.range_constexpr(self.d // BS):
                        hhs.append(kv_cons.wait_and_advance())
                    self._qh_gemm(qh_mma, acc_h, tHrQ, tHrH, [h.index for h in hhs])
                    for t in cutlass.range_constexpr(self.d // BS):
                        hhs[t].release()
                    self._add_first_order(acc_o, acc_h, row_g, scale)
            # epilogue: normalise, store the rows that exist
            for r in cutlass.range_constexpr(n_rows):
                row_sum[r] = self._quad_sum(row_sum[r])
            if cutlass.const_expr(self.tma_store):
                self._store_tile_tma(acc_o, row_sum, pv_thr, sQ, tma_o, gOt, 0, ctid, i_q, hb)
            else:
                self._store_rows(mO, acc_o, row_sum, tOcO, i_q, T, hb, False, mPerm if self.out_perm else None)
        return


# ---------------------------------------------------------------------------------------------- host glue
_compiled: dict = {}
# the cache key's fields in order (tests and probes read a build's switches by name: compiled_builds())
KEY_FIELDS = ("approx", "stages", "dtype", "D", "q_rs", "bias_l2", "bias_pf", "out_perm", "vt_stages", "probe",
              "recip", "share", "q_perm", "vt_peel", "pingpong", "tree_max", "tree_sum", "s_ahead", "pv_fence",
              "pv_fence_vt", "pv_pin", "s_ahead_vt", "tma_store", "bias_slack", "cube", "cube_kv")
_compile_seconds: dict = {}
_lock = threading.Lock()
_executors: dict = {}  # (compile key, device index) -> fn.to(device): one compile, one binding per GPU


def _executor(fn, key, device: torch.device):
    """`fn` bound to `device`: called directly, a compiled function runs on the device current at its first call."""
    with _lock:
        if (key, device.index) not in _executors:
            _executors[key, device.index] = fn.to(device.index) if hasattr(fn, "to") else fn
        return _executors[key, device.index]


def compile_stats() -> dict:
    """{shape class: seconds of the first-call JIT compile} for this process."""
    return dict(_compile_seconds)


def compiled_builds() -> list[dict]:
    """Every kernel build compiled in this process, as {KEY_FIELDS name: value}."""
    return [dict(zip(KEY_FIELDS, key)) for key in list(_compiled)]


def check(q: torch.Tensor, cfg) -> str | None:
    """None when this kernel takes these inputs, else why not (kernels.cute.unavailable_reason adds the
    package / GPU checks)."""
    if q.dtype != torch.bfloat16:
        return f"dtype {str(q.dtype).replace('torch.', '')} unsupported by cute (bfloat16 only)"
    if q.shape[-1] != D_SUPPORTED:
        return f"head_dim {q.shape[-1]} unsupported by cute (128 only)"
    if cfg is not None and cfg.block_size != BS:
        return f"block_size {cfg.block_size} unsupported by cute (64 only)"
    return None


def aligned16(x: torch.Tensor) -> bool:
    """What TMA needs: unit last stride, plus the Triton backend's check (16-byte aligned base and strides)."""
    from ..triton.fwd import tma_aligned  # Triton is required by this backend anyway (statistics, routing)

    return x.stride(-1) == 1 and tma_aligned(x)


_placeholders: dict = {}


def _perm_placeholder(device) -> torch.Tensor:
    """The permutation argument of a build that writes the output in block order (never read)."""
    t = _placeholders.get((device, "perm"))
    if t is None:
        t = _placeholders[device, "perm"] = torch.zeros(1, device=device, dtype=torch.int32)
    return t


def _has_slack(vb: torch.Tensor) -> bool:
    """True when the bias rows are contiguous and at least BS elements of their storage follow the last one (what
    the pair kernel's unclamped bias loads need, BIAS_SLACK: a row's last virtual tile reads up to BS - 1 columns
    past it; routing's own bias has them, kernels/triton/route.py BIAS_SLACK)."""
    if not vb.is_contiguous():
        return False
    return (vb.storage_offset() + vb.numel() + BS) * vb.element_size() <= vb.untyped_storage().nbytes()


def _bias_placeholder(device) -> torch.Tensor:
    """The drop kernel never reads the bias rows, but its signature has them: one tiny tensor per device
    instead of an allocation (and a memset launch) on every call."""
    t = _placeholders.get(device)
    if t is None:
        t = _placeholders[device] = torch.zeros(1, 1, 1, 1, device=device, dtype=torch.float16)
    return t


def _cute(x: torch.Tensor, align: int = 16):
    # detach: DLPack refuses tensors that require grad (the kernel is forward-only; routing is detached)
    return from_dlpack(x.detach(), assumed_align=align).mark_layout_dynamic(leading_dim=x.dim() - 1)


def attention(q, k, v, out, st, idx, vbias, cfg, *, kv_stages: int | None = None, q_rs: bool | None = None,
              bias_l2: bool | None = None, bias_pf: bool | None = None, perm: torch.Tensor | None = None,
              pair: bool | None = None, probe: str = "", recip: bool | None = None, share: bool | None = None,
              q_perm: bool = False, cube: tuple | None = None):
    """Fused forward on [B, HC, T, D] bf16 views (unit last stride, 16-byte aligned strides); same
    arguments and meaning as kernels.triton.fwd.attention, except that `perm` (int32 [T], the full Morton
    order: kernels.reorder.full_order) only moves the output rows (q, k, v are read in block order): row t of
    the result lands in row perm[t] of `out`; with q_perm (and perm) query row t is read from row perm[t] of q
    too (the caller's order: no block-order copy of q; k and v stay block-order copies). cube (fwd_cube.attention:
    the cube order's interior read in place) = (qc, kc, vc, grid, n_cube, kv_view): query blocks below n_cube come
    from the caller's qc through the cube view and their output goes to out (the caller's layout) the same way, q
    holds the blocks from n_cube on; with kv_view k and v likewise (kc, vc through the view, k and v the rest), else
    k and v are block-order copies of every block."""
    B, HC, T, D = (out if cube else q).shape
    n = -(-T // BS)
    approx = cfg.variant in ("pisa", "pwt")
    n_virt = n if (approx and cfg.budget(n) < n) else 0
    n_vt = -(-n_virt // BS)
    for name, x in (("q", q), ("k", k), ("v", v), ("out", out)) + (tuple(zip("qkv", cube[:3])) if cube else ()):
        if not aligned16(x):
            raise ValueError(f"cute backend: {name} needs 16-byte aligned strides and base (TMA)")
    stages = kv_stages or int(os.environ.get("PSA_CUTE_STAGES", "4"))
    q_rs = _env_flag("PSA_CUTE_QRS", Q_RS) if q_rs is None else bool(q_rs)
    bias_l2 = approx and (_env_flag("PSA_CUTE_BIAS_L2", BIAS_L2) if bias_l2 is None else bool(bias_l2))
    bias_pf = approx and (_env_flag("PSA_CUTE_BIAS_PF", BIAS_PF) if bias_pf is None else bool(bias_pf))
    if approx:
        kb, vm, hb = st.kbar_lp, st.vmean_lp, st.hbar_lp
        vb = vbias
    else:  # unused by the drop kernel, but the signature is fixed: tiny placeholders of the right rank
        kb = vm = q[:, :, :BS]
        hb = q[:, :, :D]
        vb = _bias_placeholder(q.device)
    out_perm = perm is not None and not cube  # (cube: the rest's output rows through perm)
    if perm is not None and (perm.dtype != torch.int32 or perm.shape != (T,) or perm.stride(0) != 1):
        raise ValueError(f"cute backend: perm must be a contiguous int32 [T={T}] tensor, got {perm.dtype} "
                         f"{tuple(perm.shape)}")
    if q_perm and not out_perm:
        raise ValueError("cute backend: q_perm reads the query rows through perm: pass perm")
    q_rs = q_rs or bool(q_perm)  # the query rows go straight into registers
    # the pair build (fwd_pair.py) has Q in registers and no bias-load experiment (the output permutation: since
    # session 22 also without the query rows read through it)
    if cube:
        pair, share, q_perm = True, False, False
    if pair is None:
        pair = _env_flag("PSA_CUTE_PAIR", n >= PAIR_MIN_BLOCKS)
    pair_ok = approx or _env_flag("PSA_CUTE_PAIR_DROP", PAIR_DROP)  # drop: the pair build with no virtual tiles
    pair = pair_ok and q_rs and not (bias_l2 or bias_pf) and bool(pair)
    vt_stages = int(os.environ.get("PSA_CUTE_VT_STAGES", PAIR_VT_STAGES)) if pair else 0
    if probe.startswith("novt"):  # timing probe: the approx build with no virtual tiles (the exact loop alone),
        # "novt+PROBE" with another pair-build probe on top (fwd_pair.py)
        rest = probe[4:].lstrip("+")
        if rest and not pair:
            raise ValueError("cute backend: timing probes run on the pair build only")
        n_vt, probe = 0, ("novt" if not pair else rest)
    elif probe and not pair:
        raise ValueError("cute backend: timing probes run on the pair build only")
    recip = pair and (_env_flag("PSA_CUTE_RECIP_STORE", RECIP_STORE) if recip is None else bool(recip))
    vt_peel = pair and probe == "" and _env_flag("PSA_CUTE_VT_PEEL", VT_PEEL)
    pingpong = pair and _env_flag("PSA_CUTE_PINGPONG", PINGPONG)
    share = pair and (_env_flag("PSA_CUTE_PAIR_SHARE", PAIR_SHARE) if share is None else bool(share))
    if share and idx.shape[-1] > PAIR_SHARE_MAX_SEL:
        log_once("cute:share_max_sel", "piecewise_sparse_attention: cute pair kernel: %d routed blocks per list "
                 "exceed the shared exact pipeline's %d: a pipeline per list", idx.shape[-1], PAIR_SHARE_MAX_SEL)
        share = False
    pingpong = pingpong and not share
    tree_max = _env_flag("PSA_CUTE_TREE_MAX", TREE_MAX)
    tree_sum = _env_flag("PSA_CUTE_TREE_SUM", TREE_SUM)
    s_ahead = pair and not share and not pingpong and stages >= 3 and _env_flag("PSA_CUTE_S_AHEAD", S_AHEAD)
    # (not with S_AHEAD: the two loops' registers spill together, tests/test_cute_compile.py)
    s_ahead_vt = pair and not pingpong and not s_ahead and _env_flag("PSA_CUTE_S_AHEAD_VT", S_AHEAD_VT)
    vt_stages = max(vt_stages, 4) if s_ahead_vt else vt_stages  # it holds three shared stages at once
    vt_peel = vt_peel and not s_ahead_vt
    pv_fence = _env_flag("PSA_CUTE_PV_FENCE", PV_FENCE)
    pv_fence_vt = pair and _env_flag("PSA_CUTE_PV_FENCE_VT", PV_FENCE_VT)
    pv_pin = _env_flag("PSA_CUTE_PV_PIN", PV_PIN)
    tma_store = bool(cube) or not out_perm and (_env_flag("PSA_CUTE_TMA_STORE", TMA_STORE) if pair
                                                else _env_flag("PSA_CUTE_TMA_STORE_ONE", TMA_STORE_ONE))
    if cube and not (pair and approx):
        raise ValueError("cute backend: the cube build is the pair kernel's (pisa / pwt)")
    bias_slack = pair and approx and _env_flag("PSA_CUTE_BIAS_SLACK", BIAS_SLACK) and _has_slack(vb)
    cube_kv = bool(cube) and bool(cube[5])  # k and v through the cube view too (fwd_cube.kv_view)
    key = (approx, stages, str(q.dtype), D, q_rs, bias_l2, bias_pf, out_perm, vt_stages, probe, recip, share,
           bool(q_perm), vt_peel, pingpong, tree_max, tree_sum, s_ahead, pv_fence, pv_fence_vt, pv_pin, s_ahead_vt,
           tma_store, bias_slack, bool(cube), cube_kv)
    assert len(key) == len(KEY_FIELDS)
    args = [_cute(x) for x in (q, k, v, out, kb, vm, hb)]
    args += [from_dlpack(vb.detach(), assumed_align=vb.element_size()).mark_layout_dynamic(leading_dim=3),
             from_dlpack(idx, assumed_align=4).mark_layout_dynamic(leading_dim=3),
             from_dlpack(perm if perm is not None else _perm_placeholder(q.device), assumed_align=4)
             .mark_layout_dynamic(leading_dim=0)]
    scal = [cutlass.Int32(n_vt), cutlass.Float32(float(cfg.scale) * LOG2E), cutlass.Float32(float(cfg.scale))]
    if cube:  # (fwd_cube.CubePairFwdSm90's arguments: the caller's q, k, v, then the cube grid)
        args += [_cute(x) for x in cube[:3]]
        from .fwd_cube import cube_scalars
        scal += [cutlass.Int32(x) for x in cube_scalars(cube[3], cube[4])]
    stream = cuda.CUstream(torch.cuda.current_stream(q.device).cuda_stream)
    fn = _compiled.get(key)
    if fn is None:
        with _lock:
            fn = _compiled.get(key)
            if fn is None:
                t0 = time.perf_counter()
                if pair:
                    from .fwd_cube import CubePairFwdSm90
                    from .fwd_pair import PairFwdSm90

                    cls = CubePairFwdSm90 if cube else PairFwdSm90
                    kern = cls(stages, vt_stages, D, probe, recip, share, bool(q_perm), vt_peel, pingpong,
                               tree_max=tree_max, tree_sum=tree_sum, s_ahead=s_ahead, pv_fence=pv_fence,
                               pv_fence_vt=pv_fence_vt, pv_pin=pv_pin, s_ahead_vt=s_ahead_vt, out_perm=out_perm,
                               tma_store=tma_store, bias_slack=bias_slack, cube=bool(cube),
                               cube_kv=cube_kv)
                else:
                    kern = PiecewiseSparseFwdSm90(approx, stages, D, q_rs, bias_l2, bias_pf, out_perm, bool(q_perm),
                                                  tree_max=tree_max, tree_sum=tree_sum, pv_fence=pv_fence,
                                                  pv_pin=pv_pin, tma_store=tma_store)
                fn = cute.compile(kern, *args, *scal, stream)
                dt = time.perf_counter() - t0
                _compile_seconds[str(key)] = dt
                _compiled[key] = fn
                log.info("piecewise_sparse_attention: cute kernel compiled for %s in %.1f s (once per process)",
                         ("pisa/pwt" if approx else "drop") + (", two query blocks per CTA" if pair else "")
                         + (", shared exact tiles" if share else ""), dt)
    _executor(fn, key, q.device)(*args, *scal, stream)
    return out


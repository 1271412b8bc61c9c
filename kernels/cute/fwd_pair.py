"""pisa / pwt on SM90 with two query blocks per CTA: the virtual-token tiles read once for both.

Why (bench/results/pieces_h200.md, session 6): every 64-row query block of a head scans the same k-bar and
value-mean tiles (all N block means), 256 KB per query block at Wan2.1-14B 480p, 5.4 GB per call from L2
(28.6 GB at 720p), and a virtual tile measured ~1.45-1.5x an exact one. In one kernel (fwd.py) each CTA
streams them again. Here a CTA holds two adjacent query blocks, one consumer warpgroup each, and the virtual
tiles (and the two H-bar tiles) come through one pipeline that both consume: that stream halves, with no
condition on the inputs. The exact tiles keep one pipeline per consumer, loaded by its own producer warp, so
the exact part is the same per-query-block stream as fwd.py; with share=True (PSA_CUTE_PAIR_SHARE) a block both
lists hold is loaded once, into one of the two rings (see below).

CTA = 3 warpgroups (384 threads, one per SM, 208 KiB of shared memory at 4 exact stages per consumer + 3 shared):
  * warpgroup 0 (24 registers): warp 0 loads Q and the routed K/V tiles of query block 2p, warp 1 those of
    block 2p + 1 (each into its consumer's pipeline), warp 2 the k-bar / value-mean tiles of every KV block and
    the two H-bar tiles into the shared pipeline (its empty barriers wait for all 8 consumer warps);
  * warpgroups 1 and 2 (240 registers): fwd.py's consumer (Q in registers, FlashAttention-3 style pipelined
    loop, the same per-tile softmax from tile_ops), reading exact tiles from their own stages and virtual ones
    from the shared stages; a virtual tile's bias is fetched one tile step ahead (raw float16 registers,
    converted when used). An odd last query block is computed by both warpgroups and stored by one; the stored
    tile goes through the consumer's query stage and one TMA store (tma_store, fwd.TMA_STORE, since session 22).
The two warpgroups replace fwd.py's two CTAs per SM, so the tensor-core / softmax overlap between two query
blocks is kept. A warpgroup that reaches its virtual tiles early waits for the other one only when the
shared pipeline is full (both lists have the routing budget's length, so their exact loops end together).
Exact only (drop) and the bias-load experiments stay in fwd.py; the Morton permutation comes as q_perm (the query
rows read through it into registers, the output written through it) or out_perm (only the output rows; fwd.py).

share=True (PSA_CUTE_PAIR_SHARE, session 32's "split rings"; pair_sched.py): both lists are copied into shared
memory and each entry the other list also holds is marked (pair_sched._mark_shared). The two rings stay; a block both
lists hold is loaded once, by the producer warp whose ring its rank among the shared blocks picks (parity), before
that warp's own list's other blocks (_produce_rings). Each consumer computes the shared tiles first, from both rings,
then its own ones from its ring, stage and phase in closed form (_ring_pos); a shared slot frees when both
consumers released it. No consumer touches a tile it does not compute: the three earlier builds over one ring of the
union (sorted merge, sessions 9/10 and 25; split order, session 31) lost by their passes over the other list's tiles
(bench/results/pieces_h200.md). A consumer's tiles no longer ascend, so its output equals the per-list pipelines' up
to the online softmax's rounding order. tests/test_split_rings_model.py runs the protocol as a model.

Measured history (the pair build against fwd.py's, the timing probes' split of the virtual part, builds tried and
not kept): bench/results/cute_pair_h200.md.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda  # noqa: F401  (cutlass-dsl's stream type)
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup

from .fwd import PAIR_SHARE_MAX_SEL, PAIR_VT_STAGES, PiecewiseSparseFwdSm90
from .pair_sched import SHARED, PairSchedule, RingCursor, pipe_view
from .tile_ops import BS, LOG2E

KV_STAGES = 4  # per consumer (fwd.py's best at 2 CTAs per SM; session 22 here: 3 6-9% slower, 5 0-1.5%)
# share: both routed lists are copied into shared memory at the CTA's start (2 x this many int32), so the producer's
# merge and each consumer's gap walk read them there, off the global-memory latency (fwd.attention: longer lists
# keep the own-list pipelines)
SHARE_MAX_SEL = PAIR_SHARE_MAX_SEL
VT_STAGES = PAIR_VT_STAGES  # the shared virtual-tile pipeline


class PairFwdSm90(PairSchedule, PiecewiseSparseFwdSm90):
    """pisa / pwt (and drop with no virtual tiles, fwd.PAIR_DROP); compile-time configuration: exact stages per
    consumer, shared virtual stages."""

    def __init__(self, kv_stages: int = KV_STAGES, vt_stages: int = VT_STAGES, head_dim: int = 128, probe: str = "",
                 recip_store: bool = False, share: bool = False, q_perm: bool = False, vt_peel: bool = False,
                 pingpong: bool = False, tree_max: bool = False, tree_sum: bool = False, s_ahead: bool = False,
                 pv_fence: bool = False, pv_fence_vt: bool = False, pv_pin: bool = False, s_ahead_vt: bool = False,
                 out_perm: bool = False, tma_store: bool = False, bias_slack: bool = False, cube: bool = False,
                 cube_kv: bool = True):
        # q_perm (Morton): query row t read from row mPerm[t] of the caller's q into the consumer's registers, the
        # output written through mPerm (fwd.py's q_perm); out_perm alone: only the output rows (fwd.PAIR_OUT_PERM)
        super().__init__(True, kv_stages, head_dim, q_rs=True, out_perm=q_perm or out_perm, q_perm=q_perm,
                         tree_max=tree_max,
                         tree_sum=tree_sum, pv_fence=pv_fence, pv_fence_vt=pv_fence_vt, pv_pin=pv_pin)
        self.recip_store = recip_store  # the epilogue multiplies by 1 / row sum (tile_ops._store_rows)
        # the epilogue through the query stage and one TMA store (pair_sched._store_tile_tma, fwd.TMA_STORE); rows
        # through a permutation keep the per-element stores
        self.tma_store = tma_store and not (q_perm or out_perm)
        # the cube order's interior read and written in the caller's layout (fwd_cube.py: 5-D TMA boxes; the kernel's
        # q then holds the rest of the blocks, its output is the caller's)
        self.cube = cube
        # k and v through the view too, their copies the rest of the blocks (else block-order copies of every block,
        # indexed by the block itself: the view only for the query tile and the output, fwd_cube.kv_view)
        self.cube_kv = cube and cube_kv
        assert not cube or (self.tma_store and not share), "cube: the TMA store, per-list rings"
        self.vt_stages = vt_stages
        # the virtual tiles' bias loads without clamping the column to the row (fwd.BIAS_SLACK: the bias tensor has
        # BS elements of storage past its end; values past a row's end are never used, _bias_slots)
        self.bias_slack = bias_slack
        # the split rings: a block both lists hold is loaded once, into one of the two rings (pair_sched.py)
        self.share = share
        # a consumer holds its last V tile while it waits for its next K tile, possibly in the same ring
        assert not share or kv_stages >= 2, "share holds a V tile across the next K tile of a ring"
        assert not share or kv_stages & (kv_stages - 1) == 0, "share: the rings' stage arithmetic takes 2, 4, 8 stages"
        # timing probes only (bench/probes/cute_pair.py --split; wrong outputs): "nobias" (virtual tiles without
        # their bias / count loads), "asexact" (virtual tiles through the exact tiles' softmax, no bias),
        # "nohbar" (the first-order GEMM skipped, its tiles still waited for); "nogemm", "nosoftmax", "stream"
        # (tile_ops._probe_skips: the exact / virtual loop without its GEMMs, its softmax, or both)
        # "nostore" (session 22): the epilogue's stores behind a row-sum test that never holds: their own cost
        assert probe in ("", "nobias", "asexact", "nohbar", "nogemm", "nosoftmax", "stream", "nostore")
        self.probe = probe
        # every virtual tile but the last without per-column bounds and counts (log2(BS) in the bias), the last one
        # as before, after the loop (fwd.VT_PEEL)
        self.vt_peel = vt_peel and probe == ""
        # the two consumers issue their GEMMs in turn (FlashAttention-3's warpgroup ping-pong, named barriers 3 and 4):
        # one's softmax under the other's GEMMs (fwd.PINGPONG; own-list pipelines only)
        self.pingpong = pingpong and not share
        # the exact loop's S GEMM one tile ahead of its softmax (pair_sched._ahead_exact; fwd.S_AHEAD): own-list
        # pipelines without ping-pong, three stages held at once
        self.s_ahead = s_ahead and not share and not self.pingpong
        assert not self.s_ahead or kv_stages >= 3, "s_ahead holds three exact stages"
        # the same for the virtual loop (pair_sched._ahead_virtual; fwd.S_AHEAD_VT), in place of the peeled loop; not
        # with s_ahead (232 bytes of spills with both, sm_90a)
        self.s_ahead_vt = s_ahead_vt and not self.pingpong and not self.s_ahead
        self.vt_peel = self.vt_peel and not self.s_ahead_vt
        assert not self.s_ahead_vt or vt_stages >= 4, "s_ahead_vt holds three shared stages"
        self.threads = 384
        self.regs_producer = 24
        self.regs_consumer = 240

    # ------------------------------------------------------------------ host side (traced once)
    @cute.jit
    def __call__(self, mQ4: cute.Tensor, mK4: cute.Tensor, mV4: cute.Tensor, mO4: cute.Tensor,
                 mKb4: cute.Tensor, mVm4: cute.Tensor, mH4: cute.Tensor, mVB: cute.Tensor,
                 mIdx: cute.Tensor, mPerm: cute.Tensor, n_vt: cutlass.Int32, scale_log2: cutlass.Float32,
                 scale: cutlass.Float32, stream: cuda.CUstream):
        hs = self._host_setup(mQ4, mK4, mV4, mO4, mKb4, mVm4, mH4, 2, 2 * self.kv_stages)
        self._launch(hs, None, mQ4, mVB, mIdx, mPerm, n_vt, scale_log2, scale, cutlass.Int32(0), stream)

    @cute.jit
    def _launch(self, hs, cube, mQ4, mVB, mIdx, mPerm, n_vt, scale_log2, scale, n_cube, stream):
        """The launch from _host_setup's dict `hs`; cube (fwd_cube.py): the view's loads (q, k, v) and store as
        (atom, tensor) x 4, else the kernel gets hs's own as placeholders."""
        dt, mQ, mO = hs["dt"], hs["mQ"], hs["mO"]
        sQ_layout, sK_layout, sV_layout = hs["sQ_layout"], hs["sK_layout"], hs["sV_layout"]
        sKp_layout = sm90_utils.make_smem_layout_b(hs["k_layout"], self.qk_tiler, dt, self.vt_stages)
        sVp_layout = sm90_utils.make_smem_layout_b(hs["v_layout"], self.pv_tiler, dt, self.vt_stages)

        @cute.struct
        class Smem:
            q_bar: cute.struct.MemRange[cutlass.Int64, 4]
            kv_bar: cute.struct.MemRange[cutlass.Int64, 4 * self.kv_stages]
            vp_bar: cute.struct.MemRange[cutlass.Int64, 2 * self.vt_stages]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sKV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sKVp: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sKp_layout)], 1024]
            if cutlass.const_expr(self.share):  # the own-list build's layout stays as it was
                sL: cute.struct.MemRange[cutlass.Int32, 2 * SHARE_MAX_SEL]

        self.smem = Smem
        n_q = cute.ceil_div(cute.size(mO, mode=[0]), BS)  # (a hierarchical token mode: its size; cube: all blocks)
        tmas = hs["tmas"]
        if cutlass.const_expr(self.q_perm):  # no query TMA: its two slots carry the permutation and q itself
            tmas = (mPerm, mQ) + tmas[2:]
        # the output's TMA store from a query stage (tma_store), else the query atom as a placeholder
        tma_o, gOt = tmas[0], tmas[1]
        if cutlass.const_expr(self.tma_store):
            tma_o, gOt = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), mO,
                                                     cute.slice_(sQ_layout, (None, None, 0)), (BS, self.d))
        if cutlass.const_expr(cube is None):
            cube = tmas[:6] + (tma_o, gOt)
        self.kernel(hs["qk_mma"], hs["pv_mma"], hs["qh_mma"], *tmas, tma_o, gOt, *cube, n_cube, mO, mVB, mIdx, mPerm,
                    n_vt, scale_log2, scale,
                    sQ_layout, sK_layout, sV_layout, sKp_layout, sVp_layout).launch(
            grid=[(n_q + 1) // 2, mQ4.shape[1], mQ4.shape[0]], block=[self.threads, 1, 1], stream=stream,
            min_blocks_per_mp=1)

    @cute.jit
    def _virtual_step(self, qk_mma, pv_mma, acc_s, acc_o, tOrP, sQi, tSrKp, tOrVp, row_max, row_sum, row_g,
                      scale_log2, alpha, bias, cnt, bias_h, vrow, tScS, n_vt, n_kv, n_last, rem, kh, vh, tv,
                      full: cutlass.Constexpr, pp=None):
        """One step of the virtual loop (k-bar tile tv in `kh`, the previous tile's value means in `vh`, both
        waited for): S of tile tv beside P V of tile tv - 1, then tile tv's softmax; its bias was fetched a step
        earlier, tile tv + 1's is fetched here. `full` (vt_peel, every tile but the last): whole blocks below the
        last one, so no per-column bounds, counts or second sum (_bias_full, tile_ops._online_softmax). pp: the
        ping-pong turn (_turn)."""
        self._turn(pp)
        self._issue_ss(qk_mma, acc_s, sQi, tSrKp[(None, None, None, kh.index)])
        self._issue_rs(pv_mma, acc_o, tOrP, tOrVp[(None, None, None, vh.index)])
        self._handover(pp)
        if cutlass.const_expr(full):
            self._bias_full(bias, bias_h)
            self._bias_fetch(bias_h, vrow, tScS, tv + 1, n_kv)  # tile tv + 1 exists: tv is not the last
        else:
            self._bias_use(bias, cnt, bias_h, tScS, tv, n_kv, n_last)
            if tv + 1 < n_vt:
                self._bias_fetch(bias_h, vrow, tScS, tv + 1, n_kv)
        warpgroup.wait_group(1)
        kh.release()
        self._softmax_tile(acc_s, acc_o, row_max, row_sum, row_g, scale_log2, alpha, bias, cnt, tScS,
                           self.probe != "asexact", False, rem, False, full)
        self._pv_wait(True, row_sum)
        vh.release()
        self._rescale_o(acc_o, alpha)
        self._to_p(acc_s, tOrP)

    @cute.jit
    def _bias_fetch(self, bias_h, vrow, tScS, t, n_kv):
        """Issue the raw float16 loads of virtual tile t's bias (one per column slot): converted one step later
        by _bias_use, so they stay in flight through a whole tile step instead of one S GEMM (what the bias loads
        cost fwd.py: 0.29 ms at 480p, 1.16 ms at 720p, bench/probes/cute_pair.py --split)."""
        if cutlass.const_expr(self.probe not in ("nobias", "asexact")):
            # past the end: the last block's value (a valid address, no branch), replaced by -inf in _bias_use; with
            # bias_slack the column itself (the next row's, or the tensor's slack), replaced the same way
            for c in cutlass.range_constexpr(cute.size(bias_h)):
                if cutlass.const_expr(self.bias_slack):
                    bias_h[c] = vrow[t * BS + tScS[(c % 2) + 4 * (c // 2)][1]]
                else:
                    bias_h[c] = vrow[cutlass.min(t * BS + tScS[(c % 2) + 4 * (c // 2)][1], n_kv - 1)]

    @cute.jit
    def _bias_use(self, bias, cnt, bias_h, tScS, t, n_kv, n_last):
        """tile_ops._load_bias's values from the fetched registers: the bias in log2 units (-inf past the end;
        an exact block's -inf is in the row) and the block's real token count."""
        if cutlass.const_expr(self.probe in ("nobias", "asexact")):
            self._bias_slots(bias, cnt, tScS, t, n_kv, n_last, lambda c, jj: cutlass.Float32(0.0))
        else:
            self._bias_slots(bias, cnt, tScS, t, n_kv, n_last, lambda c, jj: bias_h[c].to(cutlass.Float32) * LOG2E)

    @cute.jit
    def _exact_step(self, qk_mma, pv_mma, acc_s, acc_o, tOrP, sQi, tSrK, tOrV, koff, kv_cons, vh, row_max, row_sum,
                    row_g, scale_log2, alpha, bias, cnt, tScS, is_tail, rem, pp=None):
        """One step of the exact loop (fwd.py's): S of the next K tile and P V of the held V tile (vh) issued
        together, the softmax while P V runs. pp: the ping-pong turn (_turn)."""
        kh = kv_cons.wait_and_advance()
        self._turn(pp)
        self._issue_ss(qk_mma, acc_s, sQi, tSrK[(None, None, None, koff + kh.index)])
        self._issue_rs(pv_mma, acc_o, tOrP, tOrV[(None, None, None, koff + vh.index)])
        self._handover(pp)
        warpgroup.wait_group(1)  # S ready; P V may still run
        kh.release()
        self._softmax_tile(acc_s, acc_o, row_max, row_sum, row_g, scale_log2, alpha, bias, cnt, tScS, False, is_tail,
                           rem, False)
        self._pv_wait(False, row_sum)
        vh.release()

    def _k_source(self, kv_cons, rings, k_pos, u):
        """What _exact_step takes tile u's K tile from: this consumer's pipeline, or (share) tile u's ring slot
        (k_pos: its stage and parity, pair_sched._ring_pos)."""
        return RingCursor(self, rings, k_pos[0], k_pos[1], u) if self.share else kv_cons

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(self, qk_mma: cute.TiledMma, pv_mma: cute.TiledMma, qh_mma: cute.TiledMma,
               tma_q, gQt: cute.Tensor, tma_k: cute.CopyAtom, gKt: cute.Tensor,
               tma_v: cute.CopyAtom, gVt: cute.Tensor, tma_kb: cute.CopyAtom, gKbt: cute.Tensor,
               tma_vm: cute.CopyAtom, gVmt: cute.Tensor, tma_h: cute.CopyAtom, gHt: cute.Tensor, tma_o, gOt,
               tma_qc, gQct, tma_kc, gKct, tma_vc, gVct, tma_oc, gOct, n_cube: cutlass.Int32,
               mO: cute.Tensor, mVB: cute.Tensor, mIdx: cute.Tensor, mPerm: cute.Tensor, n_vt: cutlass.Int32,
               scale_log2: cutlass.Float32, scale: cutlass.Float32,
               sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout,
               sKp_layout: cute.ComposedLayout, sVp_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        i_p, i_h, i_b = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // 128)
        T = cute.size(mO, mode=[0])
        n_kv = (T + BS - 1) // BS
        n_sel = mIdx.shape[3]
        S = self.kv_stages

        smem = utils.SmemAllocator()
        st = smem.allocate(self.smem)
        one = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        wg_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4)
        q_pipes = [pipeline.PipelineTmaAsync.create(
            barrier_storage=st.q_bar.data_ptr() + 2 * c, num_stages=1, producer_group=one,
            consumer_group=wg_warps, tx_count=self.q_bytes, defer_sync=True) for c in range(2)]
        # a ring of S stages per producer warp; share: each empty barrier counts 8 arrivals (pair_sched._ring_arrive)
        kv_pipes = [pipeline.PipelineTmaAsync.create(
            barrier_storage=st.kv_bar.data_ptr() + 2 * S * c, num_stages=S, producer_group=one,
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 8) if self.share else wg_warps,
            tx_count=self.kv_bytes, defer_sync=True) for c in range(2)]
        vp_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.vp_bar.data_ptr(), num_stages=self.vt_stages, producer_group=one,
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 8), tx_count=self.kv_bytes,
            defer_sync=True)

        sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = st.sKV.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = cute.make_tensor(cute.recast_ptr(sK.iterator, sV_layout.inner), sV_layout.outer)
        sKp = st.sKVp.get_tensor(sKp_layout.outer, swizzle=sKp_layout.inner)
        sVp = cute.make_tensor(cute.recast_ptr(sKp.iterator, sVp_layout.inner), sVp_layout.outer)

        sL = None
        if cutlass.const_expr(self.share):  # both lists into shared memory (fwd.attention: n_sel <= SHARE_MAX_SEL)
            sL = st.sL.get_tensor(cute.make_layout((SHARE_MAX_SEL, 2)))
            for e in cutlass.range(tidx, 2 * n_sel, self.threads, unroll=1):
                col = e // n_sel
                sL[e - col * n_sel, col] = mIdx[i_b, i_h, cutlass.min(2 * i_p + col, n_kv - 1), e - col * n_sel]
            cute.arch.sync_threads()
            self._mark_shared(sL, n_sel, tidx)  # the blocks both lists hold
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        hb = (i_h, i_b)
        if wg == 0:
            cute.arch.setmaxregister_decrease(self.regs_producer)
            for c in cutlass.range_constexpr(2):
                if warp == c:
                    # query block 2p + c (an odd last block: both warps load the last one)
                    i_q = cutlass.Int32(2 * i_p + c)
                    if i_q >= n_kv:
                        i_q = n_kv - 1
                    kv_prod, _ = kv_pipes[c].make_participants()
                    tKs, tKg = self._tma_part(tma_k, sK, gKt, BS, self.d)
                    tVs, tVg = self._tma_part(tma_v, sV, gVt, self.d, BS)
                    if cutlass.const_expr(not self.q_perm):
                        q_prod, _ = q_pipes[c].make_participants()
                        tQs, tQg = self._tma_part(tma_q, sQ, gQt, BS, self.d)
                        h = q_prod.acquire_and_advance()
                        if cutlass.const_expr(self.cube):  # block i_q: a cube of the caller's q, else a copied one
                            tQcs, tQcg = self._tma_part(tma_qc, sQ, gQct, BS, self.d)
                            if i_q < n_cube:  # (the view's tile of head i_h, cube i_q: fwd_cube._cube_view)
                                cute.copy(tma_qc, tQcg[(None, self._cube_tile(mPerm, i_h, mIdx.shape[1], i_q), 0,
                                                        (0, i_b))],
                                          tQcs[(None, c)], tma_bar_ptr=h.barrier)
                            else:
                                cute.copy(tma_q, tQg[(None, i_q - n_cube, 0, hb)], tQs[(None, c)],
                                          tma_bar_ptr=h.barrier)
                        else:
                            cute.copy(tma_q, tQg[(None, i_q, 0, hb)], tQs[(None, c)], tma_bar_ptr=h.barrier)
                    if cutlass.const_expr(self.share):  # shared blocks of rank parity c, then list c's own
                        n_c, _ = self._list_scan(mIdx, i_b, i_h, i_q, n_sel, n_kv, BS)
                        self._produce_rings(kv_prod, sL, c, n_c, tma_k, tKg, tKs, tma_v, tVg, tVs, hb)
                    elif cutlass.const_expr(self.cube_kv):
                        self._produce_cube(kv_prod, mIdx, mPerm, i_b, i_h, i_q, n_sel, c, n_cube, tma_k, tKg, tKs,
                                           tma_v, tVg, tVs, tma_kc, gKct, tma_vc, gVct, sK, sV, hb)
                    else:
                        for kk in cutlass.range(n_sel, unroll=1):
                            j = mIdx[i_b, i_h, i_q, kk]
                            if j >= 0:  # (handles named apart from the query tile's: q_perm has none)
                                hk = kv_prod.acquire_and_advance()
                                cute.copy(tma_k, tKg[(None, j, 0, hb)], tKs[(None, c * S + hk.index)],
                                          tma_bar_ptr=hk.barrier)
                                hk = kv_prod.acquire_and_advance()
                                cute.copy(tma_v, tVg[(None, 0, j, hb)], tVs[(None, c * S + hk.index)],
                                          tma_bar_ptr=hk.barrier)
            if warp == 2:
                if n_vt > 0:
                    self._produce_virtual(vp_pipe, tma_kb, sKp, gKbt, tma_vm, sVp, gVmt, tma_h, gHt, n_vt, hb)
        else:
            cute.arch.setmaxregister_increase(self.regs_consumer)
            c = wg - 1
            ctid = tidx - 128 * wg
            i_own = 2 * i_p + c  # this warpgroup's query block; past the end: the last one, not stored
            i_q = cutlass.Int32(i_own)
            if i_q >= n_kv:
                i_q = n_kv - 1
            _, q_cons = pipe_view(q_pipes[0], 2 * c).make_participants()
            _, kv_cons = pipe_view(kv_pipes[0], 2 * S * c).make_participants()
            koff = c * S  # this consumer's first stage in sK / sV (share: the handles index both rings)
            if cutlass.const_expr(self.share):
                koff = 0
            _, vp_cons = vp_pipe.make_participants()
            qk_mma.set(warpgroup.Field.ACCUMULATE, True)
            pv_mma.set(warpgroup.Field.ACCUMULATE, True)
            qh_mma.set(warpgroup.Field.ACCUMULATE, True)
            qk_thr = qk_mma.get_slice(ctid)
            pv_thr = pv_mma.get_slice(ctid)
            tSsQ = qk_thr.partition_A(sQ)
            tSrK = qk_thr.make_fragment_B(qk_thr.partition_B(sK))
            tOrV = pv_thr.make_fragment_B(pv_thr.partition_B(sV))
            tSrKp = qk_thr.make_fragment_B(qk_thr.partition_B(sKp))
            tOrVp = pv_thr.make_fragment_B(pv_thr.partition_B(sVp))
            acc_o = pv_thr.make_fragment_C(pv_thr.partition_shape_C(self.pv_tiler[:2]))
            acc_o.fill(0.0)
            s_shape = qk_thr.partition_shape_C(self.qk_tiler[:2])
            tScS = qk_thr.partition_C(cute.make_identity_tensor(self.qk_tiler[:2]))
            tOcO = pv_thr.partition_C(cute.make_identity_tensor(self.pv_tiler[:2]))
            n_rows = 2
            row_max = cute.make_rmem_tensor(cute.make_layout(n_rows), cutlass.Float32)
            row_sum = cute.make_rmem_tensor(cute.make_layout(n_rows), cutlass.Float32)
            row_g = cute.make_rmem_tensor(cute.make_layout(n_rows), cutlass.Float32)
            for r in cutlass.range_constexpr(n_rows):
                row_max[r] = -cutlass.Float32.inf
                row_sum[r] = 0.0
                row_g[r] = 0.0

            sQi = cute.make_rmem_tensor(tSsQ[(None, None, None, 0)].shape, mO.element_type)
            if cutlass.const_expr(self.q_perm):  # (tma_q carries the permutation, gQt the caller's q)
                self._load_q_rows(sQi, gQt, tma_q, qk_thr, i_q, T, hb)
                # the fragment into this warpgroup's query stage for q H-bar (fwd.py's q_perm), visible to the
                # async proxy once all 128 threads wrote theirs (named barrier 1 + c)
                cute.autovec_copy(sQi, tSsQ[(None, None, None, c)])
                cute.arch.fence_view_async_shared()
                cute.arch.barrier(barrier_id=1 + c, number_of_threads=128)
            else:
                q_cons.wait_and_advance()
                cute.autovec_copy(tSsQ[(None, None, None, c)], sQi)
            rem = T - (n_kv - 1) * BS
            alpha = cute.make_rmem_tensor(cute.make_layout(n_rows), cutlass.Float32)
            acc_s = cute.make_rmem_tensor(s_shape, cutlass.Float32)
            sbuf = (cute.make_rmem_tensor(s_shape, cutlass.Float32) if self.s_ahead or self.s_ahead_vt
                    else None)  # S of the tile before
            tOrP = cute.make_rmem_tensor(pv_thr.partition_shape_A(self.pv_tiler[::2]), mO.element_type)
            n_valid, kk_tail = self._list_scan(mIdx, i_b, i_h, i_q, n_sel, n_kv, rem)  # list length, partial block
            n_last = cutlass.Float32(rem)
            n_tiles = n_valid + n_vt
            # pingpong: both consumers walk pp_v + n_vt turns, exact tile u at turn u, virtual tile t at turn pp_v + t
            # (pp_v: the longer list's length; the shorter list's consumer passes its missing turns empty before
            # its virtual tiles, which both then take at the same turns: see _turn)
            pp_v = n_valid
            pp_n = cutlass.Int32(0)
            if cutlass.const_expr(self.pingpong):
                n_valid_o, _ = self._list_scan(mIdx, i_b, i_h, cutlass.min(2 * i_p + 1 - c, n_kv - 1), n_sel, n_kv,
                                               rem)
                pp_v = cutlass.max(n_valid, n_valid_o)
                pp_n = pp_v + n_vt
                if c == 1 and pp_n > 0:  # consumer 0 issues first
                    cute.arch.barrier_arrive(barrier_id=3, number_of_threads=256)
            n_cols = cute.size(acc_s) // n_rows
            bias = cute.make_rmem_tensor(cute.make_layout(n_cols), cutlass.Float32)
            cnt = cute.make_rmem_tensor(cute.make_layout(n_cols), cutlass.Float32)
            bias_h = cute.make_rmem_tensor(cute.make_layout(n_cols), mVB.element_type)  # fetched, not converted
            for cc in cutlass.range_constexpr(n_cols):
                bias_h[cc] = cutlass.Float32(0.0).to(mVB.element_type)
            vrow = mVB[i_b, i_h, i_q, None]  # this query block's bias row
            if n_vt > 0:  # virtual tile 0's bias, in flight through the exact loop
                self._bias_fetch(bias_h, vrow, tScS, 0, n_kv)
            rings = None  # share: (full and empty barriers of ring 0, this consumer, the blocks both lists hold)
            k_idx = cutlass.Int32(0)  # share: the stage and parity of the current exact tile's K (its V: k_idx + 1)
            k_par = cutlass.Int32(0)
            if cutlass.const_expr(self.share):
                m_sh = self._count_shared(sL, c, n_sel)
                rings = self._rings(kv_pipes[0].sync_object_full.mbarrier_base,
                                    kv_pipes[0].sync_object_empty.mbarrier_base, c, m_sh)
                if kk_tail >= 0:  # the partial last block: the last shared tile, or the last own one
                    if sL[kk_tail, c] >= SHARED:
                        kk_tail = m_sh - 1
                    else:
                        kk_tail = n_valid - 1
            # fwd.py's software-pipelined loop, split where the tiles change pipelines: exact tiles (own
            # stages), the boundary step (V of the last exact tile, the first k-bar tile), virtual tiles
            # (shared stages), the last P V
            if n_tiles > 0:
                if n_valid > 0:
                    # (the pipeline's state advanced in the body itself: the DSL carries it across the region only
                    # then; share: the two rings in closed form, pair_sched._ring_pos)
                    if cutlass.const_expr(self.share):
                        k_idx, k_par = self._ring_pos(rings, 0)
                        kh0 = self._ring_take(rings, k_idx, k_par, 0)
                    else:
                        kh0 = kv_cons.wait_and_advance()
                    self._turn(self._pp(c, 0, pp_n))
                    self._issue_ss(qk_mma, acc_s, sQi, tSrK[(None, None, None, koff + kh0.index)])
                    self._handover(self._pp(c, 0, pp_n))
                    warpgroup.wait_group(0)
                    kh0.release()
                else:
                    self._pass_turns(c, 0, pp_v, pp_n)
                    self._bias_use(bias, cnt, bias_h, tScS, 0, n_kv, n_last)
                    if 1 < n_vt:
                        self._bias_fetch(bias_h, vrow, tScS, 1, n_kv)
                    kp0 = vp_cons.wait_and_advance()
                    self._turn(self._pp(c, pp_v, pp_n))
                    self._issue_ss(qk_mma, acc_s, sQi, tSrKp[(None, None, None, kp0.index)])
                    self._handover(self._pp(c, pp_v, pp_n))
                    warpgroup.wait_group(0)
                    kp0.release()
                n_plain = n_valid
                if cutlass.const_expr(self.s_ahead):
                    n_plain = 1  # (the plain loop below then runs no step)
                    if n_valid > 1:
                        kv_cons = self._ahead_exact(qk_mma, pv_mma, acc_s, sbuf, acc_o, tOrP, sQi, tSrK, tOrV, koff,
                                                    kv_cons, row_max, row_sum, row_g, scale_log2, alpha, bias, cnt,
                                                    tScS, n_valid, kk_tail, rem)
                    else:
                        self._softmax_tile(acc_s, acc_o, row_max, row_sum, row_g, scale_log2, alpha, bias, cnt,
                                           tScS, n_valid == 0, kk_tail == 0, rem, True)
                        self._to_p(acc_s, tOrP)
                else:
                    self._softmax_tile(acc_s, acc_o, row_max, row_sum, row_g, scale_log2, alpha, bias, cnt, tScS,
                                       n_valid == 0, kk_tail == 0, rem, True)
                    self._to_p(acc_s, tOrP)
                for u in cutlass.range(1, n_plain, unroll=1):
                    if cutlass.const_expr(self.share):  # V of tile u - 1 (beside its K), then fwd.py's step
                        vh = self._ring_take(rings, k_idx + 1, k_par, u - 1)
                        k_idx, k_par = self._ring_pos(rings, u)
                    else:
                        vh = kv_cons.wait_and_advance()
                    self._exact_step(qk_mma, pv_mma, acc_s, acc_o, tOrP, sQi, tSrK, tOrV, koff,
                                     self._k_source(kv_cons, rings, (k_idx, k_par), u), vh, row_max, row_sum, row_g,
                                     scale_log2, alpha, bias, cnt, tScS, kk_tail == u, rem, self._pp(c, u, pp_n))
                    self._rescale_o(acc_o, alpha)
                    self._to_p(acc_s, tOrP)
                if n_valid > 0:  # (n_vt = 0: the turns after the last exact tile; else those before the virtual ones)
                    self._pass_turns(c, n_valid, pp_v, pp_n)
                if n_vt > 0:
                    if n_valid > 0:  # step n_valid: V of the last exact tile, the first k-bar tile
                        if cutlass.const_expr(self.share):
                            vh = self._ring_take(rings, k_idx + 1, k_par, n_valid - 1)
                        else:
                            vh = kv_cons.wait_and_advance()
                        kh = vp_cons.wait_and_advance()
                        self._turn(self._pp(c, pp_v, pp_n))
                        self._issue_ss(qk_mma, acc_s, sQi, tSrKp[(None, None, None, kh.index)])
                        self._issue_rs(pv_mma, acc_o, tOrP, tOrV[(None, None, None, koff + vh.index)])
                        self._handover(self._pp(c, pp_v, pp_n))
                        self._bias_use(bias, cnt, bias_h, tScS, 0, n_kv, n_last)
                        if 1 < n_vt:
                            self._bias_fetch(bias_h, vrow, tScS, 1, n_kv)
                        warpgroup.wait_group(1)
                        kh.release()
                        self._softmax_tile(acc_s, acc_o, row_max, row_sum, row_g, scale_log2, alpha, bias, cnt,
                                           tScS, self.probe != "asexact", False, rem, False)
                        self._pv_wait(True, row_sum)
                        vh.release()
                        self._rescale_o(acc_o, alpha)
                        self._to_p(acc_s, tOrP)
                    vargs = (qk_mma, pv_mma, acc_s, acc_o, tOrP, sQi, tSrKp, tOrVp, row_max, row_sum, row_g,
                             scale_log2, alpha, bias, cnt, bias_h, vrow, tScS, n_vt, n_kv, n_last, rem)
                    if cutlass.const_expr(self.s_ahead_vt):
                        if n_vt > 1:
                            vp_cons = self._ahead_virtual(*vargs, sbuf, vp_cons)
                    elif cutlass.const_expr(self.vt_peel):  # whole-block tiles in the loop, the last one after it
                        for u in cutlass.range(n_valid + 1, n_tiles - 1, unroll=1):
                            vh = vp_cons.wait_and_advance()
                            kh = vp_cons.wait_and_advance()
                            self._virtual_step(*vargs, kh, vh, u - n_valid, True, self._pp(c, u + pp_v - n_valid, pp_n))
                        if n_tiles - 1 > n_valid:
                            vh = vp_cons.wait_and_advance()
                            kh = vp_cons.wait_and_advance()
                            self._virtual_step(*vargs, kh, vh, n_tiles - 1 - n_valid, False,
                                               self._pp(c, pp_n - 1, pp_n))
                    else:
                        for u in cutlass.range(n_valid + 1, n_tiles, unroll=1):
                            vh = vp_cons.wait_and_advance()
                            kh = vp_cons.wait_and_advance()
                            self._virtual_step(*vargs, kh, vh, u - n_valid, False,
                                               self._pp(c, u + pp_v - n_valid, pp_n))
                    vhl = vp_cons.wait_and_advance()
                    self._issue_rs(pv_mma, acc_o, tOrP, tOrVp[(None, None, None, vhl.index)])
                    warpgroup.wait_group(0)
                    vhl.release()
                else:
                    if cutlass.const_expr(self.share):
                        vhl = self._ring_take(rings, k_idx + 1, k_par, n_valid - 1)
                    else:
                        vhl = kv_cons.wait_and_advance()
                    self._issue_rs(pv_mma, acc_o, tOrP, tOrV[(None, None, None, koff + vhl.index)])
                    warpgroup.wait_group(0)
                    vhl.release()
            if n_tiles == 0:  # (no tiles at all: the other list's turns)
                self._pass_turns(c, 0, pp_v, pp_n)
            if n_vt > 0:
                # first-order term: acc += s (q H-bar) * g (fwd.py), H-bar from the shared stages
                qh_thr = qh_mma.get_slice(ctid)
                tHrQ = qh_thr.make_fragment_A(qh_thr.partition_A(sQ))[(None, None, None, c)]
                tHrH = qh_thr.make_fragment_B(qh_thr.partition_B(sVp))
                acc_h = qh_thr.make_fragment_C(qh_thr.partition_shape_C(self.pv_tiler[:2]))
                hhs = []
                for t in cutlass.range_constexpr(self.d // BS):
                    hhs.append(vp_cons.wait_and_advance())
                if cutlass.const_expr(self.probe != "nohbar"):
                    self._qh_gemm(qh_mma, acc_h, tHrQ, tHrH, [h.index for h in hhs])
                else:
                    acc_h.fill(0.0)
                for t in cutlass.range_constexpr(self.d // BS):
                    hhs[t].release()
                self._add_first_order(acc_o, acc_h, row_g, scale)
            for r in cutlass.range_constexpr(n_rows):
                row_sum[r] = self._quad_sum(row_sum[r])
            if cutlass.const_expr(self.probe == "nostore"):
                if i_own < n_kv:
                    if row_sum[0] < -1.0:  # (a row sum is never negative)
                        self._store_rows(mO, acc_o, row_sum, tOcO, i_q, T, hb, self.recip_store,
                                         mPerm if self.out_perm else None)
            elif cutlass.const_expr(self.cube):  # a cube into the caller's output by TMA, else rows through mPerm
                if i_own < n_kv:
                    if i_q < n_cube:
                        self._store_tile_tma(acc_o, row_sum, pv_thr, sQ, tma_oc, gOct, c, ctid, i_q, (0, i_b),
                                             tile=self._cube_tile(mPerm, i_h, mIdx.shape[1], i_q))
                    else:
                        self._store_rows(mO, acc_o, row_sum, tOcO, i_q, T, hb, self.recip_store, mPerm)
            elif cutlass.const_expr(self.tma_store):
                if i_own < n_kv:
                    self._store_tile_tma(acc_o, row_sum, pv_thr, sQ, tma_o, gOt, c, ctid, i_q, hb)
            elif i_own < n_kv:
                self._store_rows(mO, acc_o, row_sum, tOcO, i_q, T, hb, self.recip_store,
                                 mPerm if self.out_perm else None)
        return


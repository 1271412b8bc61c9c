"""Per-tile pieces of the CuTe attention kernel (kernels/cute/fwd.py): GEMM issue, the online softmax, masks,
bias rows. A mixin so fwd.py holds the pipeline (producer, consumer loops) and these stay in one place.

Element order of a WGMMA fp32 accumulator per thread is (2 columns, 2 row halves, N/8 column groups), so
element e sits in row slot (e // 2) % 2 and column slot (e % 2) + 2 (e // 4): per-column values (a virtual
tile's bias) are held once per column, not once per element.

Measured and dropped (H200, 2026-12-01, bench/results/pieces_h200.md "Session 4"): two KV blocks per softmax
step (one row max, one output rescale and one quad reduction per 128 columns instead of 64; commit 3d8049e)
was no faster at any pipeline depth (drop 5.60-6.13 vs 5.20-5.89 ms at Wan2.1-14B 480p): the exact loop waits
for its K/V tiles from L2, not on the softmax. Session 15: log2 of the block size folded into a virtual tile's
bias (once per column) so that P is not multiplied by the token counts per element and the first-order weight is
the row's sum / 64, with the multiplies kept (a runtime branch) only in a tile holding a short last block: slower,
as node-layout Morton calls 7.80 -> 8.21 ms at 480p and 38.0 -> 39.5 at 720p (bench/results/
switch_cute_vt_fold_s15_h200.txt, commit 09b34fd; session 8's folded bias rows were no faster either).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warpgroup


BS = 64  # query rows per CTA = tokens per routing block
_PIN = 3.0e-38  # the row-sum test of _pv_wait's pinned fence (a thread's partial sums of exponentials hit it ~never)
LOG2E = 1.4426950408889634
_RN = cute.math.RoundingMode.NEAREST_EVEN  # an explicitly rounded operation (PTX .rn): never fused into an FMA
LOG2_BS = 6.0  # log2(BS): a whole block's token count, folded into a virtual logit (fwd_pair.py vt_peel)


class TileOps:
    # ------------------------------------------------------------------ helpers
    @cute.jit
    def _tma_part(self, atom, s, g, r, c):
        """Partition a (rows, cols, (H, B)) TMA tensor into (r, c) tiles against a staged smem buffer."""
        gt = cute.flat_divide(g, (r, c))  # (r, c, tiles_r, tiles_c, (H, B))
        return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 2),
                                     cute.group_modes(gt, 0, 2))

    @cute.jit
    def _pv_wait(self, virtual: cutlass.Constexpr = False, pin=None, force_pin: cutlass.Constexpr = False):
        """The wait for the P V GEMM in flight after a tile's softmax. With pv_fence (virtual tiles: pv_fence_vt) a
        CTA-scope fence first, as a scheduling barrier: without it ptxas hoists this WARPGROUP.DEPBAR above the
        softmax (sm_90a SASS of both kernels: the wait sits before the first exponential), so the P V GEMM never
        runs under the softmax (session 18: the tile stream 4.75 ms at 480p, + GEMMs 4.87, + softmax 4.76, + both
        5.82). With the fence the exponentials stay above it (MEMBAR.ALL.CTA, then the DEPBAR).
        pin (the row sums, which every exponential of the tile feeds) with pv_pin, a virtual tile's fence
        (pv_fence_vt), or force_pin: the fence only under a test of the row sums that never holds in practice
        (_PIN; a fence is correct either way), so the test, and the predicated fence and the wait below it, depend
        on the whole softmax. ptxas otherwise moves an unconditional fence with the wait above the exponentials in
        the S-ahead loop and above 11-14 of the 34 in the pair kernel's virtual loop (sm_90a SASS, sessions 18-19;
        pinned: all 34 above it in every loop), and a fence that never runs waits for nothing (a virtual tile's
        bias loads for the next tile are in flight at this point)."""
        fence = self.pv_fence_vt if virtual else self.pv_fence
        if cutlass.const_expr(pin is not None and (force_pin or (fence and (self.pv_pin or virtual)))):
            if pin[0] + pin[1] == _PIN:
                cute.arch.fence_acq_rel_cta()
        elif cutlass.const_expr(fence):
            cute.arch.fence_acq_rel_cta()
        warpgroup.wait_group(0)

    @cute.jit
    def _issue_barrier(self, pin):
        """After a GEMM's issue: a CTA fence under the row-sum test of _pv_wait's pin (never taken in practice), as a
        block boundary ptxas does not move the issue below. pair_sched._ahead_virtual issues S of tile t, then runs
        the softmax of t - 1: without it ptxas sank every HGMMA of S below that softmax's exponentials in one build
        (sm_90a SASS; the same loop in another build kept them above)."""
        if pin[0] + pin[1] == _PIN:
            cute.arch.fence_acq_rel_cta()

    def _probe_skips(self, what: str) -> bool:
        """Timing probes of the pair build (fwd_pair.py; wrong outputs): "nogemm" issues no tile GEMM, "nosoftmax"
        runs no online softmax, "stream" neither (the consumers only wait for and release their tiles)."""
        probe = getattr(self, "probe", "")
        return probe == "stream" or probe == "no" + what

    @cute.jit
    def _issue_ss(self, mma, acc, a, b):
        acc.fill(0.0)
        warpgroup.fence()
        if cutlass.const_expr(not self._probe_skips("gemm")):
            for kb in cutlass.range_constexpr(cute.size(a, mode=[2])):
                cute.gemm(mma, acc, a[(None, None, kb)], b[(None, None, kb)], acc)
        warpgroup.commit_group()

    @cute.jit
    def _issue_rs(self, mma, acc, a, b):
        warpgroup.fence()
        if cutlass.const_expr(not self._probe_skips("gemm")):
            for kb in cutlass.range_constexpr(cute.size(a, mode=[2])):
                cute.gemm(mma, acc, a[(None, None, kb)], b[(None, None, kb)], acc)
        warpgroup.commit_group()

    @cute.jit
    def _load_bias(self, bias, cnt, mVB, tScS, i_b, i_h, i_q, t, n_kv, n_last):
        """Per column slot of virtual tile t (KV blocks t*64 .. t*64+63): the bias in log2 units (-inf for an
        exact block or past the end) and the block's real token count. The bias is per (query block, KV
        block): the two rows a thread holds share it, so 16 values per tile are loaded, not 32."""
        self._bias_slots(bias, cnt, tScS, t, n_kv, n_last,
                         lambda c, jj: mVB[i_b, i_h, i_q, jj].to(cutlass.Float32) * LOG2E)

    @cute.jit
    def _bias_slots(self, bias, cnt, tScS, t, n_kv, n_last, value):
        """bias / cnt per column slot c of virtual tile t: value(c, jj) for a KV block jj < n_kv (traced only
        there, so it may load from the bias row), -inf past the end; the token count, n_last for the last block."""
        for c in cutlass.range_constexpr(cute.size(bias)):
            jj = t * BS + tScS[(c % 2) + 4 * (c // 2)][1]
            b = -cutlass.Float32.inf
            n = cutlass.Float32(BS)
            if jj < n_kv:
                b = value(c, jj)
                if jj == n_kv - 1:
                    n = n_last
            bias[c] = b
            cnt[c] = n

    @cute.jit
    def _bias_full(self, bias, bias_h):
        """The bias of a virtual tile of whole blocks, none of them the last one (fwd_pair.py vt_peel: every tile
        but the last), from the fetched float16 values: log2 units with log2(BS) added, so P comes out as a whole
        block's mass with no per-column count (-inf, an exact block, stays -inf)."""
        for c in cutlass.range_constexpr(cute.size(bias)):
            bias[c] = bias_h[c].to(cutlass.Float32) * LOG2E + LOG2_BS

    @cute.jit
    def _bias_whole(self, bias, bias_h):
        """The bias of a virtual tile of whole blocks, none of them the last one, as _bias_slots makes it (log2 units,
        no bounds: every column a real block); its counts are BS, a constant (_online_softmax's `whole`), so the
        arithmetic is the plain loop's, bitwise (pair_sched._ahead_virtual). The product is rounded on its own
        (mul.rn): there, _bias_slots' select keeps it out of the logit's FMA; here LLVM fused it into
        bias_h * LOG2E + s * scale for some columns (the other product rounded instead: 1.2e-4 off on the H200, A21)."""
        for c in cutlass.range_constexpr(cute.size(bias)):
            bias[c] = cute.math.mul(bias_h[c].to(cutlass.Float32), cutlass.Float32(LOG2E), rounding=_RN)

    @cute.jit
    def _load_q_rows(self, sQi, mQ, mPerm, qk_thr, i_q, T, hb):
        """sQi (this thread's register fragment of the 64-row query tile, the S GEMM's A operand) from the rows
        mPerm[i_q * 64 + r] of the token-major query tensor mQ (T, D, (H, B)); rows past T become zeros. The
        fragment holds column pairs of one row per register: one 32-bit load each."""
        tQcQ = qk_thr.partition_A(cute.make_identity_tensor((BS, self.d)))
        q32 = cute.recast_tensor(mQ, cutlass.Int32)
        s32 = cute.recast_tensor(sQi, cutlass.Int32)
        for e in cutlass.range_constexpr(cute.size(s32)):
            t = i_q * BS + tQcQ[2 * e][0]
            x = cutlass.Int32(0)
            if t < T:
                x = q32[mPerm[t], tQcQ[2 * e][1] // 2, hb]
            s32[e] = x

    @cute.jit
    def _list_scan(self, mIdx, i_b, i_h, i_q, n_sel, n_kv, rem):
        """(n_valid, kk_tail) of query block i_q's routed list: routed blocks come first, -1 padding after them.
        Each warp reads the list 32 entries at a time (one load per lane) and counts by ballot; kk_tail = the
        list position of the partial last KV block (T not a multiple of 64), -1 if none, so the tile loop masks
        without reading the list."""
        lane = cute.arch.lane_idx()
        n_valid = cutlass.Int32(0)
        kk_tail = cutlass.Int32(-1)
        for c in cutlass.range(0, n_sel, 32, unroll=1):
            jv = cutlass.Int32(-1)
            if c + lane < n_sel:
                jv = mIdx[i_b, i_h, i_q, c + lane]
            n_valid = n_valid + cute.arch.popc(cute.arch.vote_ballot_sync(jv >= 0))
            tb = cute.arch.vote_ballot_sync(jv == n_kv - 1)
            if tb != 0:
                kk_tail = c + 31 - cutlass.Int32(cute.arch.clz(tb))
        if rem >= BS:
            kk_tail = cutlass.Int32(-1)
        return n_valid, kk_tail

    @cute.jit
    def _qh_gemm(self, qh_mma, acc_h, tHrQ, tHrH, stages):
        """acc_h = q H-bar: A = the query tile (shared memory or registers), B = the H-bar tiles in the pipeline
        stages `stages` (one per 64 rows of H-bar, already waited for)."""
        n_kb = cute.size(tHrH, mode=[2])  # k-blocks per H-bar tile
        acc_h.fill(0.0)
        warpgroup.fence()
        for t in cutlass.range_constexpr(len(stages)):
            for kb in cutlass.range_constexpr(n_kb):
                cute.gemm(qh_mma, acc_h, tHrQ[(None, None, t * n_kb + kb)], tHrH[(None, None, kb, stages[t])],
                          acc_h)
        warpgroup.commit_group()
        warpgroup.wait_group(0)

    @cute.jit
    def _add_first_order(self, acc_o, acc_h, row_g, g_scale):
        """acc_o += g_scale (q H-bar) g per row, g = the row's first-order weight summed over its quad."""
        for r in cutlass.range_constexpr(2):
            row_g[r] = self._quad_sum(row_g[r])
        for e in cutlass.range_constexpr(cute.size(acc_o)):
            acc_o[e] = acc_o[e] + acc_h[e] * (g_scale * row_g[self._row_slot_e(e)])

    @cute.jit
    def _store_rows(self, mO, acc_o, row_sum, tOcO, i_q, T, hb, recip: cutlass.Constexpr = False, mPerm=None):
        """The epilogue: the output tile normalised by the (quad-summed) row sums, the rows that exist stored
        (mPerm: row t at row mPerm[t], each thread's two targets read once; elements 0 and 2 sit in row slots 0
        and 1). recip: one division per row and a multiply per element instead of 64 IEEE divisions per thread
        (each a check and a slow-path call in the SASS); the result can differ in the last bit of the quotient."""
        inv = cute.make_rmem_tensor(cute.make_layout(2), cutlass.Float32)
        if cutlass.const_expr(recip):
            for r in cutlass.range_constexpr(2):
                inv[r] = 1.0 / row_sum[r]
        o_row = cute.make_rmem_tensor(cute.make_layout(2), cutlass.Int32)
        if cutlass.const_expr(mPerm is not None):
            for r in cutlass.range_constexpr(2):
                t_row = i_q * BS + tOcO[2 * r][0]
                o_row[r] = t_row
                if t_row < T:
                    o_row[r] = mPerm[t_row]
        for e in cutlass.range_constexpr(cute.size(acc_o)):
            t_row = i_q * BS + tOcO[e][0]
            if t_row < T:
                if cutlass.const_expr(recip):
                    x = acc_o[e] * inv[self._row_slot_e(e)]
                else:
                    x = acc_o[e] / row_sum[self._row_slot_e(e)]
                if cutlass.const_expr(mPerm is not None):
                    mO[o_row[self._row_slot_e(e)], tOcO[e][1], hb] = x.to(mO.element_type)
                else:
                    mO[t_row, tOcO[e][1], hb] = x.to(mO.element_type)

    @cute.jit
    def _store_tile_tma(self, acc_o, row_sum, pv_thr, sQ, tma_o, gOt, c, ctid, i_q, hb, tile=None):
        """The epilogue with tma_store (fwd_pair.py; fwd.py's one-block kernel: c = 0): the tile normalised as
        _store_rows does (recip_store: one reciprocal per row), converted into query stage c and made visible to
        the async proxy; then one thread stores the whole 64-row tile with TMA (rows past T are clipped by the
        tensor map) and waits until the stage has been read (the CTA's shared memory must outlive those reads).
        tile: the tile's coordinate in gOt's tile mode in place of i_q (the cube view: pair_sched._cube_tile)."""
        recip = getattr(self, "recip_store", False)
        inv = cute.make_rmem_tensor(cute.make_layout(2), cutlass.Float32)
        if cutlass.const_expr(recip):
            for r in cutlass.range_constexpr(2):
                inv[r] = 1.0 / row_sum[r]
        tOsO = pv_thr.partition_C(sQ)[(None, None, None, c)]
        for e in cutlass.range_constexpr(cute.size(acc_o)):  # (element by element: no second register tile)
            if cutlass.const_expr(recip):
                tOsO[e] = (acc_o[e] * inv[self._row_slot_e(e)]).to(sQ.element_type)
            else:
                tOsO[e] = (acc_o[e] / row_sum[self._row_slot_e(e)]).to(sQ.element_type)
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=1 + c, number_of_threads=128)
        if ctid == 0:
            tOs, tOg = self._tma_part(tma_o, sQ, gOt, BS, self.d)
            if cutlass.const_expr(tile is not None):
                cute.copy(tma_o, tOs[(None, c)], tOg[(None, tile, 0, hb)])
            else:
                cute.copy(tma_o, tOs[(None, c)], tOg[(None, i_q, 0, hb)])
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def _softmax_tile(self, acc_s, acc_o, row_max, row_sum, row_g, scale_log2, alpha, bias, cnt, tScS, is_virtual,
                      is_tail, rem, rescale_o: cutlass.Constexpr, full: cutlass.Constexpr = False,
                      whole: cutlass.Constexpr = False):
        """The online softmax of one tile: an exact tile (partial last block masked) or, for pisa/pwt, a
        virtual one (logits scaled into log2 units, the per-column bias added, P weighted by the token
        counts; `full`: a tile of whole blocks whose bias carries log2(BS), see _bias_full; `whole`: one whose
        counts are all BS, see _bias_whole)."""
        if cutlass.const_expr(self._probe_skips("softmax")):
            for r in cutlass.range_constexpr(2):
                alpha[r] = 1.0
        elif cutlass.const_expr(self.approx):
            if is_virtual:
                for e in cutlass.range_constexpr(cute.size(acc_s)):
                    acc_s[e] = acc_s[e] * scale_log2 + bias[self._col_slot_e(e)]
                self._online_softmax(acc_s, acc_o, row_max, row_sum, row_g, scale_log2, True, cnt, alpha, rescale_o,
                                     full, whole)
            else:
                self._mask_tail(acc_s, tScS, is_tail, rem)
                self._online_softmax(acc_s, acc_o, row_max, row_sum, row_g, scale_log2, False, None, alpha,
                                     rescale_o)
        else:
            self._mask_tail(acc_s, tScS, is_tail, rem)
            self._online_softmax(acc_s, acc_o, row_max, row_sum, row_g, scale_log2, False, None, alpha, rescale_o)

    def _col_slot_e(self, e: int) -> int:
        return (e % 2) + 2 * (e // 4)

    @cute.jit
    def _mask_tail(self, acc_s, tScS, is_tail, rem):
        if is_tail:
            for e in cutlass.range_constexpr(cute.size(acc_s)):
                if tScS[e][1] >= rem:
                    acc_s[e] = -cutlass.Float32.inf

    @cute.jit
    def _to_p(self, acc_s, tOrP):
        as_acc = cute.make_tensor(tOrP.iterator, acc_s.layout)
        as_acc.store(acc_s.load().to(tOrP.element_type))

    @cute.jit
    def _quad_sum(self, x):
        x = x + cute.arch.shuffle_sync_bfly(x, offset=1)
        return x + cute.arch.shuffle_sync_bfly(x, offset=2)

    @cute.jit
    def _quad_max(self, x):
        x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=1))
        return cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=2))

    @cute.jit
    def _online_softmax(self, acc_s, acc_o, row_max, row_sum, row_g, scale_log2, virtual: cutlass.Constexpr,
                        cnt, alpha, rescale_o: cutlass.Constexpr, full: cutlass.Constexpr = False,
                        whole: cutlass.Constexpr = False):
        """acc_s holds raw scores (exact tile) or log2-unit logits (virtual tile); on return it holds P (times
        the token counts for virtual tiles: cnt, per column slot) and `alpha` the per-row rescale of the old
        mass. Rescales the running sums now, and the output accumulator now or (rescale_o=False: a P V product
        still in flight on the tensor cores) later through `_rescale_o`. `full` (a virtual tile of whole blocks,
        log2(BS) in its logits): P = BS e(s-hat) is the mass already, and the first-order weight sum_U e(s-hat)
        is the row's sum / BS, exactly (no counts, no second sum). `whole`: every count BS, a constant instead of
        the cnt registers (the same products: bitwise the plain arithmetic)."""
        n_rows = 2
        new_max = cute.make_rmem_tensor(cute.make_layout(n_rows), cutlass.Float32)
        for r in cutlass.range_constexpr(n_rows):
            new_max[r] = row_max[r]
        if cutlass.const_expr(not virtual):
            # max of the raw scores, scaled once per row: scale_log2 > 0 and rounding is monotone, so
            # fl(s * max x) == max fl(s * x) exactly (32 multiplies fewer per tile)
            raw_max = cute.make_rmem_tensor(cute.make_layout(n_rows), cutlass.Float32)
            for r in cutlass.range_constexpr(n_rows):
                raw_max[r] = -cutlass.Float32.inf
            if cutlass.const_expr(self.tree_max):
                for r in cutlass.range_constexpr(n_rows):
                    raw_max[r] = self._tree(acc_s, r, cute.arch.fmax)
            else:
                for e in cutlass.range_constexpr(cute.size(acc_s)):
                    r = self._row_slot_e(e)
                    raw_max[r] = cute.arch.fmax(raw_max[r], acc_s[e])
            for r in cutlass.range_constexpr(n_rows):
                new_max[r] = cute.arch.fmax(new_max[r], raw_max[r] * scale_log2)
        elif cutlass.const_expr(self.tree_max):
            for r in cutlass.range_constexpr(n_rows):
                new_max[r] = cute.arch.fmax(new_max[r], self._tree(acc_s, r, cute.arch.fmax))
        else:
            for e in cutlass.range_constexpr(cute.size(acc_s)):
                r = self._row_slot_e(e)
                new_max[r] = cute.arch.fmax(new_max[r], acc_s[e])
        for r in cutlass.range_constexpr(n_rows):
            m = self._quad_max(new_max[r])
            m_use = m
            if m == -cutlass.Float32.inf:
                m_use = 0.0
            alpha[r] = cute.math.exp2(row_max[r] - m_use, fastmath=True)
            row_max[r] = m
            new_max[r] = m_use
        psum = cute.make_rmem_tensor(cute.make_layout(n_rows), cutlass.Float32)
        gsum = cute.make_rmem_tensor(cute.make_layout(n_rows), cutlass.Float32)
        for r in cutlass.range_constexpr(n_rows):
            psum[r] = 0.0
            gsum[r] = 0.0
        for e in cutlass.range_constexpr(cute.size(acc_s)):
            r = self._row_slot_e(e)
            if cutlass.const_expr(not virtual):
                p = cute.math.exp2(acc_s[e] * scale_log2 - new_max[r], fastmath=True)
                if cutlass.const_expr(not self.tree_sum):
                    psum[r] = psum[r] + p
                acc_s[e] = p
            elif cutlass.const_expr(full):
                p = cute.math.exp2(acc_s[e] - new_max[r], fastmath=True)
                if cutlass.const_expr(not self.tree_sum):
                    psum[r] = psum[r] + p
                acc_s[e] = p
            else:
                p = cute.math.exp2(acc_s[e] - new_max[r], fastmath=True)
                gsum[r] = gsum[r] + p
                pn = p * (cutlass.Float32(BS) if cutlass.const_expr(whole) else cnt[self._col_slot_e(e)])
                if cutlass.const_expr(not self.tree_sum):
                    psum[r] = psum[r] + pn
                acc_s[e] = pn
        if cutlass.const_expr(self.tree_sum):  # the same sums in pairs: depth 4 instead of a chain of 16 adds
            for r in cutlass.range_constexpr(n_rows):
                psum[r] = self._tree(acc_s, r, lambda a, b: a + b)
        for r in cutlass.range_constexpr(n_rows):
            row_sum[r] = row_sum[r] * alpha[r] + psum[r]
            if cutlass.const_expr(virtual and full):
                row_g[r] = row_g[r] * alpha[r] + psum[r] * (1.0 / BS)
            elif cutlass.const_expr(virtual):
                row_g[r] = row_g[r] * alpha[r] + gsum[r]
            else:
                row_g[r] = row_g[r] * alpha[r]
        if cutlass.const_expr(rescale_o):
            self._rescale_o(acc_o, alpha)

    @cute.jit
    def _rescale_o(self, acc_o, alpha):
        # alpha is exactly 1 when the row max did not move (exp2(0)): skip the multiplies (per thread, per row)
        for r in cutlass.range_constexpr(2):
            if alpha[r] != 1.0:
                for e in cutlass.range_constexpr(cute.size(acc_o)):
                    if cutlass.const_expr(self._row_slot_e(e) == r):
                        acc_o[e] = acc_o[e] * alpha[r]

    def _tree(self, acc, r, op):
        """op over row slot r's elements of acc (S or P) in pairs, at trace time: a reduction of depth log2(16)
        = 4 instead of a dependent chain of 16 (Nsight Compute's per-instruction sampling, session 18: the chained
        row max and row sum are the consumers' longest waits after their own GEMMs). For the max the result is
        bitwise the chain's (max is exact in any order; fmax drops a NaN operand either way)."""
        vals = [acc[e] for e in range(cute.size(acc)) if self._row_slot_e(e) == r]
        while len(vals) > 1:
            nxt = [op(vals[i], vals[i + 1]) for i in range(0, len(vals) - 1, 2)]
            vals = nxt + vals[len(nxt) * 2:]
        return vals[0]

    def _row_slot_e(self, e: int) -> int:
        # row slot of accumulator element e (S or O): WGMMA fp32 order per thread is (2 cols, 2 row halves,
        # N/8 col groups)
        return (e // 2) % 2

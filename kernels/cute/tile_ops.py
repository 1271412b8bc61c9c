"""Per-tile pieces of the CuTe attention kernel (kernels/cute/fwd.py): GEMM issue, the online softmax, masks,
bias rows. A mixin so fwd.py holds the pipeline (producer, consumer loops) and these stay in one place.

Two tile shapes share them: one 64-column tile per softmax step (the kernel's default loop) or a pair of
64-column tiles (two KV blocks) per step (`pair=True`): one row max, one rescale of the output and one set of
quad shuffles per 128 columns instead of per 64. Element order of a WGMMA fp32 accumulator per thread is
(2 columns, 2 row halves, N/8 column groups), so element e sits in row slot (e // 2) % 2 and column slot
(e % 2) + 2 (e // 4).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warpgroup

BS = 64  # query rows per CTA = tokens per routing block
LOG2E = 1.4426950408889634


class TileOps:
    # ------------------------------------------------------------------ helpers
    @cute.jit
    def _tma_part(self, atom, s, g, r, c):
        """Partition a (rows, cols, (H, B)) TMA tensor into (r, c) tiles against a staged smem buffer."""
        gt = cute.flat_divide(g, (r, c))  # (r, c, tiles_r, tiles_c, (H, B))
        return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 2),
                                     cute.group_modes(gt, 0, 2))

    @cute.jit
    def _issue_ss(self, mma, acc, a, b):
        acc.fill(0.0)
        warpgroup.fence()
        for kb in cutlass.range_constexpr(cute.size(a, mode=[2])):
            cute.gemm(mma, acc, a[(None, None, kb)], b[(None, None, kb)], acc)
        warpgroup.commit_group()

    @cute.jit
    def _issue_rs(self, mma, acc, a, b):
        warpgroup.fence()
        for kb in cutlass.range_constexpr(cute.size(a, mode=[2])):
            cute.gemm(mma, acc, a[(None, None, kb)], b[(None, None, kb)], acc)
        warpgroup.commit_group()

    @cute.jit
    def _load_bias(self, bias, cnt, mVB, tScS, i_b, i_h, i_q, t, n_kv, n_last):
        """Bias row (log2 units; -inf for an exact block or past the end) and real token counts of virtual
        tile t (KV blocks t*64 .. t*64+63), per accumulator element of S."""
        for e in cutlass.range_constexpr(cute.size(bias)):
            jj = t * BS + tScS[e][1]
            b = -cutlass.Float32.inf
            c = cutlass.Float32(BS)
            if jj < n_kv:
                b = mVB[i_b, i_h, i_q, jj].to(cutlass.Float32) * LOG2E
                if jj == n_kv - 1:
                    c = n_last
            bias[e] = b
            cnt[e] = c

    @cute.jit
    def _softmax_tile(self, acc_s, acc_o, row_max, row_sum, row_g, scale_log2, alpha, bias, cnt, tScS, is_virtual,
                      is_tail, rem, rescale_o: cutlass.Constexpr):
        """The online softmax of one tile: an exact tile (partial last block masked) or, for pisa/pwt, a
        virtual one (logits scaled into log2 units, bias added, P weighted by the token counts)."""
        if cutlass.const_expr(self.approx):
            if is_virtual:
                for e in cutlass.range_constexpr(cute.size(acc_s)):
                    acc_s[e] = acc_s[e] * scale_log2 + bias[e]
                self._online_softmax([acc_s], acc_o, row_max, row_sum, row_g, scale_log2, True,
                                     lambda h, e: cnt[e], alpha, rescale_o)
            else:
                self._mask_tail(acc_s, tScS, is_tail, rem)
                self._online_softmax([acc_s], acc_o, row_max, row_sum, row_g, scale_log2, False, None, alpha,
                                     rescale_o)
        else:
            self._mask_tail(acc_s, tScS, is_tail, rem)
            self._online_softmax([acc_s], acc_o, row_max, row_sum, row_g, scale_log2, False, None, alpha, rescale_o)

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
    def _online_softmax(self, accs, acc_o, row_max, row_sum, row_g, scale_log2, virtual: cutlass.Constexpr,
                        cnt_of, alpha, rescale_o: cutlass.Constexpr):
        """`accs` (a list of one or two S tiles of one step) hold raw scores (exact tiles) or log2-unit logits
        (virtual tiles); on return they hold P (times the token counts for virtual tiles: cnt_of(h, e) of
        element e of tile h) and `alpha` the per-row rescale of the old mass. Rescales the running sums now,
        and the output accumulator now or (rescale_o=False: a P V product still in flight on the tensor
        cores) later through `_rescale_o`."""
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
            for acc_s in accs:
                for e in cutlass.range_constexpr(cute.size(acc_s)):
                    r = self._row_slot_e(e)
                    raw_max[r] = cute.arch.fmax(raw_max[r], acc_s[e])
            for r in cutlass.range_constexpr(n_rows):
                new_max[r] = cute.arch.fmax(new_max[r], raw_max[r] * scale_log2)
        else:
            for acc_s in accs:
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
        for h, acc_s in enumerate(accs):
            for e in cutlass.range_constexpr(cute.size(acc_s)):
                r = self._row_slot_e(e)
                if cutlass.const_expr(not virtual):
                    p = cute.math.exp2(acc_s[e] * scale_log2 - new_max[r], fastmath=True)
                    psum[r] = psum[r] + p
                    acc_s[e] = p
                else:
                    p = cute.math.exp2(acc_s[e] - new_max[r], fastmath=True)
                    gsum[r] = gsum[r] + p
                    pn = p * cnt_of(h, e)
                    psum[r] = psum[r] + pn
                    acc_s[e] = pn
        for r in cutlass.range_constexpr(n_rows):
            row_sum[r] = row_sum[r] * alpha[r] + psum[r]
            if cutlass.const_expr(virtual):
                row_g[r] = row_g[r] * alpha[r] + gsum[r]
            else:
                row_g[r] = row_g[r] * alpha[r]
        if cutlass.const_expr(rescale_o):
            self._rescale_o(acc_o, alpha)

    # ------------------------------------------------------------------ pairs of tiles (pair=True)
    @cute.jit
    def _issue_ss2(self, mma, acc0, acc1, a, b0, b1):
        """S of both tiles of a pair, one commit group."""
        acc0.fill(0.0)
        acc1.fill(0.0)
        warpgroup.fence()
        for kb in cutlass.range_constexpr(cute.size(a, mode=[2])):
            cute.gemm(mma, acc0, a[(None, None, kb)], b0[(None, None, kb)], acc0)
        for kb in cutlass.range_constexpr(cute.size(a, mode=[2])):
            cute.gemm(mma, acc1, a[(None, None, kb)], b1[(None, None, kb)], acc1)
        warpgroup.commit_group()

    @cute.jit
    def _issue_rs2(self, mma, acc, a0, a1, b0, b1):
        """O += P0 V0 + P1 V1 (one K = 128 product over the pair), one commit group."""
        warpgroup.fence()
        for kb in cutlass.range_constexpr(cute.size(a0, mode=[2])):
            cute.gemm(mma, acc, a0[(None, None, kb)], b0[(None, None, kb)], acc)
        for kb in cutlass.range_constexpr(cute.size(a1, mode=[2])):
            cute.gemm(mma, acc, a1[(None, None, kb)], b1[(None, None, kb)], acc)
        warpgroup.commit_group()

    def _col_slot_e(self, e: int) -> int:
        return (e % 2) + 2 * (e // 4)

    @cute.jit
    def _load_bias_cols(self, bias_c, mVB, tScS, i_b, i_h, i_q, t, n_kv):
        """Bias of virtual tile t per column slot, as stored (float16; -inf past the last KV block): the bias
        is per (query block, KV block), so the two rows a thread holds share it (16 values per tile, not 32),
        and two of them fit a register (the pair's pisa/pwt step is register-bound)."""
        for c in cutlass.range_constexpr(cute.size(bias_c)):
            jj = t * BS + tScS[(c % 2) + 4 * (c // 2)][1]
            bias_c[c] = cutlass.Float16(-cutlass.Float32.inf)
            if jj < n_kv:
                bias_c[c] = mVB[i_b, i_h, i_q, jj]

    @cute.jit
    def _count(self, jj, n_kv, n_last):
        c = cutlass.Float32(BS)
        if jj == n_kv - 1:
            c = n_last
        return c

    @cute.jit
    def _softmax_pair(self, acc0, acc1, acc_o, row_max, row_sum, row_g, scale_log2, alpha, bias0, bias1, tScS,
                      is_virtual, g, n_valid, kk_tail, rem, t0, n_kv, n_last, rescale_o: cutlass.Constexpr):
        """One online-softmax step over a pair of tiles: exact pair g (list positions 2g, 2g + 1; the second
        one is padding when 2g + 1 = n_valid, its K and V tiles read as zeros past the end of the tensor) or,
        for pisa/pwt, virtual tiles t0, t0 + 1 (columns past the last KV block have bias -inf)."""
        if cutlass.const_expr(self.approx):
            if is_virtual:
                for e in cutlass.range_constexpr(cute.size(acc0)):
                    # the same arithmetic as the one-tile step: fma(s, scale, float32(bias) * log2 e)
                    acc0[e] = acc0[e] * scale_log2 + bias0[self._col_slot_e(e)].to(cutlass.Float32) * LOG2E
                    acc1[e] = acc1[e] * scale_log2 + bias1[self._col_slot_e(e)].to(cutlass.Float32) * LOG2E
                self._online_softmax(
                    [acc0, acc1], acc_o, row_max, row_sum, row_g, scale_log2, True,
                    lambda h, e: self._count((t0 + h) * BS + tScS[e][1], n_kv, n_last), alpha, rescale_o)
            else:
                self._mask_pair(acc0, acc1, tScS, g, n_valid, kk_tail, rem)
                self._online_softmax([acc0, acc1], acc_o, row_max, row_sum, row_g, scale_log2, False, None, alpha,
                                     rescale_o)
        else:
            self._mask_pair(acc0, acc1, tScS, g, n_valid, kk_tail, rem)
            self._online_softmax([acc0, acc1], acc_o, row_max, row_sum, row_g, scale_log2, False, None, alpha,
                                 rescale_o)

    @cute.jit
    def _mask_pair(self, acc0, acc1, tScS, g, n_valid, kk_tail, rem):
        self._mask_tail(acc0, tScS, kk_tail == 2 * g, rem)
        if 2 * g + 1 >= n_valid:
            for e in cutlass.range_constexpr(cute.size(acc1)):
                acc1[e] = -cutlass.Float32.inf
        else:
            self._mask_tail(acc1, tScS, kk_tail == 2 * g + 1, rem)

    @cute.jit
    def _rescale_o(self, acc_o, alpha):
        # alpha is exactly 1 when the row max did not move (exp2(0)): skip the multiplies (per thread, per row)
        for r in cutlass.range_constexpr(2):
            if alpha[r] != 1.0:
                for e in cutlass.range_constexpr(cute.size(acc_o)):
                    if cutlass.const_expr(self._row_slot_e(e) == r):
                        acc_o[e] = acc_o[e] * alpha[r]

    def _row_slot_e(self, e: int) -> int:
        # row slot of accumulator element e (S or O): WGMMA fp32 order per thread is (2 cols, 2 row halves,
        # N/8 col groups)
        return (e // 2) % 2

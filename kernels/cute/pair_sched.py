"""The pair kernel's (fwd_pair.py) scheduling between its two consumer warpgroups, as a mixin of PairFwdSm90:

* share (PSA_CUTE_PAIR_SHARE): both consumers walk the sorted merge of their two routed lists (in shared memory),
  each waiting for and releasing the tiles only the other list holds (_head, _gap, _pass);
* pingpong (PSA_CUTE_PINGPONG): the consumers issue their GEMMs in turn on named barriers 3 and 4, FlashAttention-3's
  warpgroup ping-pong (_pp, _turn, _handover, _pass_turns). Both take the same turns: exact tile u at turn u, virtual
  tile t at turn pp_v + t (pp_v, the longer list's length), the shorter list's missing turns passed empty before its
  virtual tiles. Session 17 on the H200 (bench/results/pieces_h200.md): equal outputs, every pair test passed with it,
  and the attention alone at Wan2.1-14B 480p 6.90 ms against 6.92 (medians of 3 alternated rounds): no gain;
* s_ahead (PSA_CUTE_S_AHEAD): each consumer's exact loop issues the S GEMM of tile u before the softmax of tile u - 1
  (_ahead_exact), so that softmax runs under both GEMMs (S of u, P V of u - 2) instead of after S of u. Session 18's
  split of the pair kernel (bench/probes/pair_split.py, H200, 480p, exact part alone): the tile stream 4.75 ms, with
  the GEMMs 4.87, with the softmax 4.76, with both 5.82. Either hides under the stream; the chain S -> softmax does
  not. It holds one more exact stage (V of u - 2 until its P V is done): three of the four while S of u runs.
"""
import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup


class PairSchedule:
    """Methods only; PairFwdSm90 sets `pingpong` and `share`."""

    def _pp(self, c, step, n_steps):
        """The ping-pong turn of a step (None without pingpong: _turn and _handover then emit nothing)."""
        return (c, step, n_steps) if self.pingpong else None

    @cute.jit
    def _pass_turns(self, c, a, b, n_steps):
        """pingpong: turns a .. b - 1 passed empty (the exact tiles only the other consumer's list has)."""
        if cutlass.const_expr(self.pingpong):
            for u in cutlass.range(a, b, unroll=1):
                self._turn((c, u, n_steps))
                self._handover((c, u, n_steps))

    @cute.jit
    def _turn(self, pp):
        """pingpong, pp = (c, turn, n_turns): before issuing a step's GEMMs, wait until the other consumer has issued
        those of the turn before (named barrier 3 + c: this warpgroup's 128 threads wait, the other's 128 arrive),
        so that one's softmax runs under the other's GEMMs. Both take the same n_turns turns, so every wait meets one
        arrival. Virtual tile t is turn pp_v + t for both: a consumer waits for a virtual tile's data only when the
        other has released the tile three slots back, which it does in its step of tile t - 1, a turn earlier; had
        the turns followed each consumer's own step count, unequal lists would deadlock here (the shorter one
        waiting for virtual data that the longer one, waiting for its turn, never frees)."""
        if cutlass.const_expr(pp is not None):
            cute.arch.barrier(barrier_id=3 + pp[0], number_of_threads=256)

    @cute.jit
    def _handover(self, pp):
        """pingpong: after issuing a step's GEMMs, the other consumer's turn. Consumer 1 arrived once before its
        first step (consumer 0 goes first) and skips the arrival after its last, so each barrier sees n_steps
        arrivals for n_steps waits and none is left pending when the CTA exits."""
        if cutlass.const_expr(pp is not None):
            c, step, n_steps = pp
            if c == 0 or step < n_steps - 1:
                cute.arch.barrier_arrive(barrier_id=4 - c, number_of_threads=256)

    @cute.jit
    def _head(self, sL, col, j, n, n_kv):
        """Entry j of list col (0: query block 2p, 1: 2p + 1; in shared memory) of n routed blocks; n_kv (after
        every block) past its end."""
        v = sL[cutlass.max(cutlass.min(j, n - 1), 0), col]
        if j >= n:
            v = n_kv
        return v

    @cute.jit
    def _gap(self, sL, co, jo, n_o, n_kv, a):
        """share: (g, jo') = the union tiles before block a that only the other list (column co, n_o entries,
        cursor jo) holds, and that list's cursor past a (both lists ascend, so the union is their sorted merge)."""
        g = cutlass.Int32(0)
        vo = self._head(sL, co, jo, n_o, n_kv)
        while vo < a:
            g = g + 1
            jo = jo + 1
            vo = self._head(sL, co, jo, n_o, n_kv)
        if vo == a:
            jo = jo + 1
        return g, jo

    @cute.jit
    def _pass(self, kv_cons, g):
        """share: wait for and release the K and V tiles of g union blocks that the other list alone holds; returns
        the advanced consumer. A dynamic loop hands its carried state to a new object bound to the loop's own name,
        so the caller's object would keep the state from before the loop: call as kv_cons = self._pass(...)."""
        for _ in cutlass.range(g, unroll=1):
            h = kv_cons.wait_and_advance()
            h.release()
            h = kv_cons.wait_and_advance()
            h.release()
        return kv_cons

    @cute.jit
    def _ahead_exact(self, qk_mma, pv_mma, acc_s, sbuf, acc_o, tOrP, sQi, tSrK, tOrV, koff, kv_cons, row_max,
                     row_sum, row_g, scale_log2, alpha, bias, cnt, tScS, n_valid, kk_tail, rem):
        """s_ahead: exact tiles 1 .. n_valid - 1 (n_valid >= 2), entered with S of tile 0 done in acc_s and nothing
        in flight; leaves P of the last exact tile in tOrP, its V not yet waited for (the plain loop's exit state).
        Per tile u: S of u issued into acc_s once S of u - 1 is copied out (sbuf), then the softmax of u - 1 on the
        copy while S of u and P V of u - 2 run, then one wait for both, then P V of u - 1 issued. (Waiting for P V
        of u - 2 alone, with S of u left in flight, makes ptxas serialise every wgmma of the kernel: it cannot tell
        which of two groups issued in different iterations a wait_group(1) leaves running.) The same operations per
        tile as the plain loop (bitwise the same output). Returns the advanced consumer (kv_cons = ..., as _pass)."""
        vh = kv_cons.wait_and_advance()  # V of tile 0
        kh = kv_cons.wait_and_advance()  # K of tile 1
        sbuf.store(acc_s.load())
        self._issue_ss(qk_mma, acc_s, sQi, tSrK[(None, None, None, koff + kh.index)])
        self._softmax_tile(sbuf, acc_o, row_max, row_sum, row_g, scale_log2, alpha, bias, cnt, tScS, False,
                           kk_tail == 0, rem, True)
        warpgroup.wait_group(0)  # S of tile 1
        kh.release()
        self._to_p(sbuf, tOrP)
        self._issue_rs(pv_mma, acc_o, tOrP, tOrV[(None, None, None, koff + vh.index)])
        vprev = vh
        for u in cutlass.range(2, n_valid, unroll=1):
            vh = kv_cons.wait_and_advance()  # V of u - 1
            kh = kv_cons.wait_and_advance()  # K of u
            sbuf.store(acc_s.load())
            self._issue_ss(qk_mma, acc_s, sQi, tSrK[(None, None, None, koff + kh.index)])
            self._softmax_tile(sbuf, acc_o, row_max, row_sum, row_g, scale_log2, alpha, bias, cnt, tScS, False,
                               kk_tail == u - 1, rem, False)
            self._pv_wait(False, row_sum, True)  # P V of u - 2 and S of u, after the whole softmax
            vprev.release()
            kh.release()
            self._rescale_o(acc_o, alpha)
            self._to_p(sbuf, tOrP)
            self._issue_rs(pv_mma, acc_o, tOrP, tOrV[(None, None, None, koff + vh.index)])
            vprev = vh
        # the last exact tile: its S is done, P V of the one before in flight
        self._softmax_tile(acc_s, acc_o, row_max, row_sum, row_g, scale_log2, alpha, bias, cnt, tScS, False,
                           kk_tail == n_valid - 1, rem, False)
        self._pv_wait(False, row_sum)
        vprev.release()
        self._rescale_o(acc_o, alpha)
        self._to_p(acc_s, tOrP)
        return kv_cons

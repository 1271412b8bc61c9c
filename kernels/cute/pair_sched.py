"""The pair kernel's (fwd_pair.py) scheduling between its two consumer warpgroups, as a mixin of PairFwdSm90:

* share (PSA_CUTE_PAIR_SHARE), "split rings" (session 32): the two per-list rings stay, and a block both lists hold
  (marked in the lists copied to shared memory at the CTA's start: _mark_shared) is loaded once, into ring r by
  producer warp r when its rank among the shared blocks has parity r (_produce_rings). Each consumer takes the
  shared tiles first, from both rings, then its own ones from its own ring, with stage and phase in closed form
  (_ring_pos, once per tile); a shared slot frees when both consumers released it (count-1 arrivals of each,
  against count-2 arrivals for an own tile: _ring_arrive). No consumer waits for or releases a tile it does not
  compute: the split order of session 30 (one ring over the union) lost to the per-list rings by its passes over the
  other list's tiles (bench/results/pieces_h200.md, Session 31);
* pingpong (PSA_CUTE_PINGPONG): the consumers issue their GEMMs in turn on named barriers 3 and 4, FlashAttention-3's
  warpgroup ping-pong (_pp, _turn, _handover, _pass_turns). Both take the same turns: exact tile u at turn u, virtual
  tile t at turn pp_v + t (pp_v, the longer list's length), the shorter list's missing turns passed empty before its
  virtual tiles. Session 17 on the H200 (bench/results/pieces_h200.md): equal outputs, every pair test passed with it,
  and the attention alone at Wan2.1-14B 480p 6.90 ms against 6.92 (medians of 3 alternated rounds): no gain;
* s_ahead (PSA_CUTE_S_AHEAD): each consumer's exact loop issues the S GEMM of tile u before the softmax of tile u - 1
  (_ahead_exact), so that softmax runs under both GEMMs (S of u, P V of u - 2) instead of after S of u. Session 18's
  split of the pair kernel (bench/probes/pair_split.py, H200, 480p, exact part alone): the tile stream 4.75 ms, with
  the GEMMs 4.87, with the softmax 4.76, with both 5.82. Either hides under the stream; the chain S -> softmax does
  not. It holds one more exact stage (V of u - 2 until its P V is done): three of the four while S of u runs;
* s_ahead_vt (PSA_CUTE_S_AHEAD_VT): the same for the virtual tiles (_ahead_virtual), where the split measured the
  larger share: at 720p the pair kernel's virtual tiles cost 5.4 ms of 35.0 (19 tiles per query block against 148
  exact ones), of which the tiles' stream is 0.8 (pair_split.py, session 18). It holds three shared stages at once
  (value means of t - 2 and t - 1, k-bar of t), so the build takes four (225 KiB of shared memory); its producer
  sends each k-bar tile one tile ahead of the value means. Not together with s_ahead (their registers spill).
"""
import dataclasses

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup

from .tile_ops import BS

# share: a routed list entry that the other list of the CTA holds too carries SHARED (block ids stay below it)
SHARED = 1 << 30
ID_MASK = SHARED - 1  # (the -1 padding masked: the largest key)


def _shifted(sync, off):
    """The same mbarrier array `off` barriers further on, without initialising it again (the pipeline of the
    other consumer, picked by a runtime warpgroup index)."""
    view = object.__new__(type(sync))
    view.__dict__.update(sync.__dict__)
    view.mbarrier_base = sync.mbarrier_base + off
    view.barrier_storage = sync.barrier_storage + off
    return view


def pipe_view(pipe, off):
    return dataclasses.replace(pipe, sync_object_full=_shifted(pipe.sync_object_full, off),
                               sync_object_empty=_shifted(pipe.sync_object_empty, off))


class PairSchedule:
    """Methods only; PairFwdSm90 sets `pingpong` and `share`."""

    @cute.jit
    def _cube_tile(self, mPerm, i_h, n_h, j):
        """The view's tile of head i_h, cube j (fwd_cube._cube_view) as a coordinate of its tile mode (H, wc, hc, fc)
        that CuTe turns into the folded TMA coordinate without a division: that coordinate is the tile's element
        offset over the head stride, i.e. (raster token of the cube's first row) x H + i_h for the caller's
        [B, L, H * D] (fwd_cube.fold_exact), and the cube order says which token that is (mPerm[64 j]). An index
        into the mode's first entry beyond H is never bounds-checked; CuTe's own split of (i_h, j) over the mode
        cost the kernel 68 bytes of spills (two divisions per tile)."""
        return (mPerm[j * BS] * n_h + i_h, 0, 0, 0)

    @cute.jit
    def _produce_cube(self, kv_prod, mIdx, mPerm, i_b, i_h, i_q, n_sel, c, n_cube, tma_k, tKg, tKs, tma_v, tVg, tVs,
                      tma_kc, gKct, tma_vc, gVct, sK, sV, hb):
        """The cube build's producer (fwd_cube.py): list c's K / V tiles into ring c, block j < n_cube a cube of the
        caller's k / v (a 5-D box through the view: _cube_tile), the others from the copies of the remaining
        blocks."""
        S = self.kv_stages
        n_h = mIdx.shape[1]
        hb1 = (0, i_b)
        tKcs, tKcg = self._tma_part(tma_kc, sK, gKct, BS, self.d)
        tVcs, tVcg = self._tma_part(tma_vc, sV, gVct, self.d, BS)
        for kk in cutlass.range(n_sel, unroll=1):
            j = mIdx[i_b, i_h, i_q, kk]
            if j >= 0:
                tile = (0, 0, 0, 0)  # (its view coordinate once per block, for K and V: one load of mPerm)
                if j < n_cube:
                    tile = self._cube_tile(mPerm, i_h, n_h, j)
                hk = kv_prod.acquire_and_advance()
                if j < n_cube:
                    cute.copy(tma_kc, tKcg[(None, tile, 0, hb1)], tKcs[(None, c * S + hk.index)],
                              tma_bar_ptr=hk.barrier)
                else:
                    cute.copy(tma_k, tKg[(None, j - n_cube, 0, hb)], tKs[(None, c * S + hk.index)],
                              tma_bar_ptr=hk.barrier)
                hk = kv_prod.acquire_and_advance()
                if j < n_cube:
                    cute.copy(tma_vc, tVcg[(None, 0, tile, hb1)], tVcs[(None, c * S + hk.index)],
                              tma_bar_ptr=hk.barrier)
                else:
                    cute.copy(tma_v, tVg[(None, 0, j - n_cube, hb)], tVs[(None, c * S + hk.index)],
                              tma_bar_ptr=hk.barrier)

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
    def _mark_shared(self, sL, n_sel, tidx):
        """share, at the CTA's start (every thread, both lists already in sL): SHARED added to each entry that the
        other list holds too, found by a binary search of the other list (ascending, its -1 padding read as the
        largest key, another entry's SHARED masked off). Each thread writes only its own entries."""
        for e in cutlass.range(tidx, 2 * n_sel, self.threads, unroll=1):
            col = e // n_sel
            i = e - col * n_sel
            x = sL[i, col]
            if x >= 0:
                lo = cutlass.Int32(0)
                hi = cutlass.Int32(n_sel)
                while lo < hi:
                    mid = (lo + hi) // 2
                    if (sL[mid, 1 - col] & ID_MASK) < x:
                        lo = mid + 1
                    else:
                        hi = mid
                if lo < n_sel:
                    if (sL[lo, 1 - col] & ID_MASK) == x:
                        sL[i, col] = x + SHARED

    @cute.jit
    def _count_shared(self, sL, col, n_sel):
        """share: how many entries of list col both lists hold (each warp counts by ballot, 32 entries a load)."""
        lane = cute.arch.lane_idx()
        m = cutlass.Int32(0)
        for j in cutlass.range(0, n_sel, 32, unroll=1):
            v = cutlass.Int32(-1)
            if j + lane < n_sel:
                v = sL[j + lane, col]
            m = m + cute.arch.popc(cute.arch.vote_ballot_sync(v >= SHARED))
        return m

    @cute.jit
    def _produce_rings(self, kv_prod, sL, c, n_c, tma_k, tKg, tKs, tma_v, tVg, tVs, hb):
        """share, producer warp c: K then V of every block of list c into ring c (stages c S ..): first the blocks
        both lists hold whose rank among them has parity c (the other ring takes the rest, so each shared block is
        loaded once), then this list's own blocks, each in ascending order. A list's shared entries are the same
        blocks in the same order in both lists (both ascend), so the rank counted here is the consumers' too."""
        S = self.kv_stages
        r = cutlass.Int32(0)
        for i in cutlass.range(n_c, unroll=1):
            x = sL[i, c]
            if x >= SHARED:
                if (r & 1) == c:
                    kv_prod = self._ring_load(kv_prod, x - SHARED, c * S, tma_k, tKg, tKs, tma_v, tVg, tVs, hb)
                r = r + 1
        for i in cutlass.range(n_c, unroll=1):
            x = sL[i, c]
            if x < SHARED:
                kv_prod = self._ring_load(kv_prod, x, c * S, tma_k, tKg, tKs, tma_v, tVg, tVs, hb)

    @cute.jit
    def _ring_load(self, kv_prod, j, soff, tma_k, tKg, tKs, tma_v, tVg, tVs, hb):
        """K then V of block j into the next two slots of a ring (its stages from soff); returns the advanced producer
        (a helper's loop hands on a new object: kv_prod = ...)."""
        hk = kv_prod.acquire_and_advance()
        cute.copy(tma_k, tKg[(None, j, 0, hb)], tKs[(None, soff + hk.index)], tma_bar_ptr=hk.barrier)
        hk = kv_prod.acquire_and_advance()
        cute.copy(tma_v, tVg[(None, 0, j, hb)], tVs[(None, soff + hk.index)], tma_bar_ptr=hk.barrier)
        return kv_prod

    def _rings(self, full0, empty0, c, m):
        """share: what _ring_pos and _ring_take need, fixed per consumer: ring 0's full and empty barriers, this
        consumer c, the number m of shared blocks, and own0, the ring-c load of own tile u = 0 (2 ceil((m - c) / 2)
        - 2 m: own tile u is load own0 + 2 u), computed once here instead of per wait (m >= 0: the halving a shift)."""
        return full0, empty0, c, m, 2 * ((m + 1 - c) >> 1) - 2 * m

    @cute.jit
    def _ring_pos(self, rings, u):
        """share: where consumer c's exact tile u sits, as (idx, parity): its K tile in stage idx of sK over both
        rings (ring S + stage), its V tile in idx + 1 with the same parity (a tile's K and V are loads 2 j and 2 j + 1
        of a ring of even S: the same window of S loads). Tile u < m is shared rank u: ring u % 2, that ring's load
        2 (u // 2); an own tile comes after the ceil((m - c) / 2) shared blocks of ring c. Stage and phase of load L
        in a ring of S: L % S, (L // S) % 2 (each consumer waits on every load of a ring it reads in order, so no
        wait can see an older phase as its own: tests/test_split_rings_model.py). All of it in shifts and masks (S a
        power of two, u and L never negative), once per tile: session 32's first build computed it per K and per V
        wait in signed // and %, whose sign fix-ups made the exact loop 626 SASS instructions per tile against the
        per-list loop's 593, which the H100 measured as +5% cycles on random inputs."""
        S = self.kv_stages
        s_log2 = S.bit_length() - 1
        _, _, c, m, own0 = rings
        ring = cutlass.Int32(c)
        load = own0 + 2 * u
        if u < m:
            ring = u & 1
            load = u - ring
        return (ring << s_log2) + (load & (S - 1)), (load >> s_log2) & 1

    @cute.jit
    def _ring_take(self, rings, idx, parity, u):
        """share: wait for the load in stage idx (over both rings) at `parity`, one of tile u's, and return its handle
        (index; release(): this warp's arrival, one unit for a shared tile, two for an own one)."""
        s_log2 = self.kv_stages.bit_length() - 1
        full0, empty0, _, m, _ = rings
        slot = idx + ((idx >> s_log2) << s_log2)  # its full / empty barriers: 2 S per ring
        units = cutlass.Int32(2)
        if u < m:
            units = cutlass.Int32(1)
        cute.arch.mbarrier_wait(full0 + slot, parity)
        return _RingTile(self, idx, empty0 + slot, units)

    @cute.jit
    def _ring_arrive(self, empty, units):
        """share: one warp's release of a ring slot. Each empty barrier counts 8 arrivals: an own tile's consumer
        arrives with 2 from each of its 4 warps, a shared tile's two consumers with 1 each (the slot frees once
        both are done with it; no named barrier, no wait for the other consumer)."""
        if cute.arch.lane_idx() == 0:
            cute.arch.mbarrier_arrive(empty, arrive_count=units)

    @cute.jit
    def _ahead_exact(self, qk_mma, pv_mma, acc_s, sbuf, acc_o, tOrP, sQi, tSrK, tOrV, koff, kv_cons, row_max,
                     row_sum, row_g, scale_log2, alpha, bias, cnt, tScS, n_valid, kk_tail, rem):
        """s_ahead: exact tiles 1 .. n_valid - 1 (n_valid >= 2), entered with S of tile 0 done in acc_s and nothing
        in flight; leaves P of the last exact tile in tOrP, its V not yet waited for (the plain loop's exit state).
        Per tile u: S of u issued into acc_s once S of u - 1 is copied out (sbuf), then the softmax of u - 1 on the
        copy while S of u and P V of u - 2 run, then one wait for both, then P V of u - 1 issued. (Waiting for P V
        of u - 2 alone, with S of u left in flight, makes ptxas serialise every wgmma of the kernel: it cannot tell
        which of two groups issued in different iterations a wait_group(1) leaves running.) The same operations per
        tile as the plain loop (bitwise the same output). Returns the advanced consumer (kv_cons = ...: a helper's
        dynamic loop hands its carried state to a new object)."""
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
        self._ahead_last(acc_s, acc_o, tOrP, row_max, row_sum, row_g, scale_log2, alpha, bias, cnt, tScS, False,
                         kk_tail == n_valid - 1, rem, vprev)
        return kv_cons

    @cute.jit
    def _ahead_last(self, acc_s, acc_o, tOrP, row_max, row_sum, row_g, scale_log2, alpha, bias, cnt, tScS,
                    virtual: cutlass.Constexpr, is_tail, rem, vprev):
        """Both S-ahead loops' last tile: its S is done, P V of the one before in flight (reading vprev's tile); its
        softmax, that wait, and P of the tile into tOrP (the plain loop's exit state)."""
        self._softmax_tile(acc_s, acc_o, row_max, row_sum, row_g, scale_log2, alpha, bias, cnt, tScS,
                           self.probe != "asexact" if virtual else False, is_tail, rem, False)
        self._pv_wait(virtual, row_sum)
        vprev.release()
        self._rescale_o(acc_o, alpha)
        self._to_p(acc_s, tOrP)

    @cute.jit
    def _ahead_virtual(self, qk_mma, pv_mma, acc_s, acc_o, tOrP, sQi, tSrKp, tOrVp, row_max, row_sum, row_g,
                       scale_log2, alpha, bias, cnt, bias_h, vrow, tScS, n_vt, n_kv, n_last, rem, sbuf, vp_cons):
        """s_ahead_vt: virtual tiles 1 .. n_vt - 1 (n_vt >= 2), the S GEMM of tile t issued before the softmax of
        tile t - 1 (as _ahead_exact). Entered in the plain loop's state after virtual tile 0 (its P in tOrP, nothing
        in flight, tile 1's bias fetched); leaves P of the last virtual tile in tOrP, its value means not yet waited
        for (the plain loop's exit state). The producer sends each k-bar tile one tile ahead of the value means (k-bar
        0, then k-bar t and the value means of t - 1, then the last value means), so a step waits for its k-bar tile
        at its start and for the value means only before their P V, a whole step after the slot of the means two
        tiles back is freed; three stages held at once (means of t - 2, k-bar of t, means of t - 1), four in the
        build. Tiles 1 .. n_vt - 2 hold whole blocks, none the last: their counts are the constant BS (_bias_whole,
        `whole`), which frees the count registers, and an issue barrier keeps S of t above the softmax (sm_90a SASS:
        without both, ptxas issued every HGMMA of S after the softmax's exponentials). The same operations per tile
        as the plain loop: bitwise its output. Returns the advanced consumer (vp_cons = ..., as _ahead_exact)."""
        vmask = self.probe != "asexact"
        kh = vp_cons.wait_and_advance()  # k-bar of tile 1
        vh = vp_cons.wait_and_advance()  # value means of tile 0
        self._issue_ss(qk_mma, acc_s, sQi, tSrKp[(None, None, None, kh.index)])
        self._issue_rs(pv_mma, acc_o, tOrP, tOrVp[(None, None, None, vh.index)])
        warpgroup.wait_group(1)  # S of tile 1; P V of tile 0 still runs
        kh.release()
        vprev = vh
        for t in cutlass.range(2, n_vt, unroll=1):
            kh = vp_cons.wait_and_advance()  # k-bar of t
            self._bias_whole(bias, bias_h)  # tile t - 1: whole blocks, none the last
            self._bias_fetch(bias_h, vrow, tScS, t, n_kv)
            sbuf.store(acc_s.load())
            self._issue_ss(qk_mma, acc_s, sQi, tSrKp[(None, None, None, kh.index)])
            self._issue_barrier(row_sum)  # (S of t stays issued above the softmax of t - 1)
            self._softmax_tile(sbuf, acc_o, row_max, row_sum, row_g, scale_log2, alpha, bias, cnt, tScS, vmask,
                               False, rem, False, whole=True)
            self._pv_wait(True, row_sum, True)  # P V of t - 2 and S of t, after the whole softmax
            vprev.release()
            kh.release()
            self._rescale_o(acc_o, alpha)
            self._to_p(sbuf, tOrP)
            vh = vp_cons.wait_and_advance()  # value means of t - 1
            self._issue_rs(pv_mma, acc_o, tOrP, tOrVp[(None, None, None, vh.index)])
            vprev = vh
        self._bias_use(bias, cnt, bias_h, tScS, n_vt - 1, n_kv, n_last)  # the last virtual tile's
        self._ahead_last(acc_s, acc_o, tOrP, row_max, row_sum, row_g, scale_log2, alpha, bias, cnt, tScS, True,
                         False, rem, vprev)
        return vp_cons

    @cute.jit
    def _produce_virtual(self, vp_pipe, tma_kb, sKp, gKbt, tma_vm, sVp, gVmt, tma_h, gHt, n_vt, hb):
        """Warp 2 (n_vt > 0): the k-bar and value-mean tiles of every KV block into the shared virtual pipeline, then
        the two H-bar tiles. In tile order (k-bar t, value means t); with s_ahead_vt each k-bar tile one tile ahead of
        the value means (k-bar 0; k-bar t, value means t - 1; the last value means), the order _ahead_virtual waits in
        (its boundary step and a single tile wait as the plain loop does)."""
        vp_prod, _ = vp_pipe.make_participants()
        tKbs, tKbg = self._tma_part(tma_kb, sKp, gKbt, BS, self.d)
        tVms, tVmg = self._tma_part(tma_vm, sVp, gVmt, self.d, BS)
        tHs, tHg = self._tma_part(tma_h, sVp, gHt, self.d, BS)
        if cutlass.const_expr(self.s_ahead_vt):
            h = vp_prod.acquire_and_advance()
            cute.copy(tma_kb, tKbg[(None, 0, 0, hb)], tKbs[(None, h.index)], tma_bar_ptr=h.barrier)
            for t in cutlass.range(1, n_vt, unroll=1):
                h = vp_prod.acquire_and_advance()
                cute.copy(tma_kb, tKbg[(None, t, 0, hb)], tKbs[(None, h.index)], tma_bar_ptr=h.barrier)
                h = vp_prod.acquire_and_advance()
                cute.copy(tma_vm, tVmg[(None, 0, t - 1, hb)], tVms[(None, h.index)], tma_bar_ptr=h.barrier)
            h = vp_prod.acquire_and_advance()
            cute.copy(tma_vm, tVmg[(None, 0, n_vt - 1, hb)], tVms[(None, h.index)], tma_bar_ptr=h.barrier)
        else:
            for t in cutlass.range(n_vt, unroll=1):
                h = vp_prod.acquire_and_advance()
                cute.copy(tma_kb, tKbg[(None, t, 0, hb)], tKbs[(None, h.index)], tma_bar_ptr=h.barrier)
                h = vp_prod.acquire_and_advance()
                cute.copy(tma_vm, tVmg[(None, 0, t, hb)], tVms[(None, h.index)], tma_bar_ptr=h.barrier)
        for t in cutlass.range_constexpr(self.d // BS):
            h = vp_prod.acquire_and_advance()
            cute.copy(tma_h, tHg[(None, 0, t, hb)], tHs[(None, h.index)], tma_bar_ptr=h.barrier)


class _RingTile:
    """share: a ring slot's handle as the exact loop uses a pipeline's (index, release)."""

    def __init__(self, sched, index, empty, units):
        self.sched, self.index, self.empty, self.units = sched, index, empty, units

    def release(self):
        self.sched._ring_arrive(self.empty, self.units)


class RingCursor:
    """share: stands in for a consumer's exact pipeline where the loop asks for "the next K tile" (fwd_pair's
    _exact_step): K of tile u, in stage idx at parity (pair_sched._ring_pos)."""

    def __init__(self, sched, rings, idx, parity, u):
        self.sched, self.rings, self.idx, self.parity, self.u = sched, rings, idx, parity, u

    def wait_and_advance(self):
        return self.sched._ring_take(self.rings, self.idx, self.parity, self.u)

"""Routing top-k selection, one warp per program over a row held in one or two power-of-two pieces.

route.SELECT_IMPL = "pieces" (this module) or "bits" (route._select_kernel, the previous kernel). Same outputs:
per query block the K_i = max(k, #forced) best KV blocks by (order-preserving uint32 key of the float32 score
descending, block id ascending), as an ascending int32 list -1 padded to NSEL, and those blocks marked -inf in
the bias row. How it differs from "bits" (what it computes does not):
- the row is one power-of-two piece, or two when that wastes much less (n = 1182 at Wan2.1-14B 720p: 1024 + 256
  keys instead of 2048; every search step touches 37% fewer keys);
- one warp per program by default (SELECT_PIECE_WARPS): every reduction is warp shuffles, no shared memory and
  no barriers; more warps only for rows over 2048 keys (64 keys per thread at most);
- SELECT_BITS = 1: one threshold per step, int32 counts (a compare and an add per key, ~20 steps for float
  scores); SELECT_BITS = 2: the three thresholds of "bits" in one int64 sum per step (~10 steps);
- padding columns get key 0 (below every float's key, a negative NaN's included) and are never counted, and the
  forced count of a row is computed in closed form (band window plus sinks outside it).
The search stops when every row's #(key >= t) equals its K_i, else after all 32 bits (then t is the K_i-th
largest key and the tied blocks at t are kept lowest id first).

SELECT_INTERP (PSA_SELECT_INTERP=1/0 overrides; _search_interp): the same threshold found by interpolation instead
of one bit per step. A bracket [lo, hi) of keys with #(key >= lo) >= K_i > #(key >= hi)
starts at [row min, 2^32); its first probe is just above the largest key below +inf's (the forced blocks sit at
+inf), every next one where a straight line through the bracket's two counts, in float32 score values, puts
K_i + 1/4 keys; a probe that is not a finite value (NaN or infinite ends), and every probe after MAX_INTERP of
them, halves the bracket in key space instead, so the search ends within 1 + MAX_INTERP + 32 steps. It stops when
#(key >= lo) = K_i (the chosen set is then {key >= lo}, whatever lo is) or hi = lo + 1 (lo is then the K_i-th
largest key, as above): the output equals the bit search's whichever path was taken. Mean steps per row (a NumPy
model of both searches on the float32 score rows of two heads of each Wan2.1-14B shape, kernels.routing's statistics;
bench/results/pieces_h200.md, session 22): 480p 20.6 -> 7.7 (random inputs), 18.9 -> 7.3 (DiT-like); 720p 21.5 ->
8.0, 19.6 -> 9.2; every chosen set equal. Measured on the H200 it is off (SELECT_INTERP below).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..config import env_switch


@triton.jit
def _piece_keys(SCORE, i_loc, o_i, m_i, N, J0: tl.constexpr, NJ: tl.constexpr):
    o_j = J0 + tl.arange(0, NJ)
    m_j = o_j < N
    b_s = tl.load(SCORE + (i_loc.to(tl.int64) * N + o_i)[:, None] * N + o_j[None, :],
                  mask=m_i[:, None] & m_j[None, :], other=0.0)
    b_bits = b_s.to(tl.int32, bitcast=True)
    b_bits = b_bits ^ ((b_bits >> 31) | (-2147483647 - 1))
    return tl.where(m_j[None, :], b_bits, 0).to(tl.uint32, bitcast=True)


@triton.jit
def _count_ge(b_key, c):
    """#(key >= c) per row, int32."""
    return tl.sum((b_key >= c[:, None]).to(tl.int32), axis=1)


@triton.jit
def _key_float(key):
    """The float32 whose order-preserving key is `key` (int64 in [0, 2^32); the inverse of _piece_keys' map)."""
    bits = tl.where(key >= 2147483648, key - 2147483648, 4294967295 - key)
    return bits.to(tl.uint32).to(tl.float32, bitcast=True)


@triton.jit
def _float_key(x):
    """The order-preserving key of float32 x, as int64."""
    b = x.to(tl.int32, bitcast=True)
    return (b ^ ((b >> 31) | (-2147483647 - 1))).to(tl.uint32, bitcast=True).to(tl.int64)


@triton.jit
def _search_interp(k_a, k_b, N, k_i, ROWS: tl.constexpr, NA: tl.constexpr, NB: tl.constexpr,
                   MAX_INTERP: tl.constexpr):
    """(t, #(key >= t)) per row, the threshold the bit search finds (see the module docstring)."""
    m_a = (tl.arange(0, NA) < N)[None, :]
    top = tl.full([ROWS, NA], 4294967295, tl.uint32)
    mn = tl.min(tl.where(m_a, k_a, top), axis=1)
    mx = tl.max(tl.where(k_a != 4286578688, k_a, 0), axis=1)  # 4286578688: +inf's key
    if NB > 0:
        m_b = ((NA + tl.arange(0, NB)) < N)[None, :]
        mn = tl.minimum(mn, tl.min(tl.where(m_b, k_b, tl.full([ROWS, NB], 4294967295, tl.uint32)), axis=1))
        mx = tl.maximum(mx, tl.max(tl.where(k_b != 4286578688, k_b, 0), axis=1))
    lo = mn.to(tl.int64)
    n_lo = tl.zeros([ROWS], dtype=tl.int32) + N  # every real key is >= the row minimum (0: by convention)
    hi = tl.full([ROWS], 4294967296, tl.int64)
    n_hi = tl.zeros([ROWS], dtype=tl.int32)
    first = mx.to(tl.int64) + 1
    it = 0
    todo = tl.max(((n_lo != k_i) & (hi - lo > 1)).to(tl.int32), axis=0)
    while (todo > 0) & (it < MAX_INTERP + 40):  # (the bound is never reached: 1 + MAX_INTERP + 32 suffice)
        lv = _key_float(lo)
        hv = _key_float(tl.minimum(hi - 1, 4294967295))
        fr = tl.fdiv((n_lo - k_i).to(tl.float32) - 0.25, tl.maximum(n_lo - n_hi, 1).to(tl.float32),
                     ieee_rounding=False)  # (an approximate quotient: a probe only needs to be near)
        tv = lv + (hv - lv) * fr
        interp = (tv == tv) & (tl.abs(tv) < float("inf")) & (it <= MAX_INTERP)
        t = tl.where(interp, _float_key(tv), lo + (hi - lo) // 2)
        t = tl.where(it == 0, first, t)
        t = tl.minimum(tl.maximum(t, lo + 1), hi - 1)
        c = t.to(tl.uint32)
        n1 = _count_ge(k_a, c)
        if NB > 0:
            n1 += _count_ge(k_b, c)
        live = (n_lo != k_i) & (hi - lo > 1)
        up = n1 >= k_i
        lo = tl.where(live & up, t, lo)
        n_lo = tl.where(live & up, n1, n_lo)
        hi = tl.where(live & ~up, t, hi)
        n_hi = tl.where(live & ~up, n1, n_hi)
        it += 1
        todo = tl.max(((n_lo != k_i) & (hi - lo > 1)).to(tl.int32), axis=0)
    return lo.to(tl.uint32), n_lo


@triton.jit
def _count_ge3(b_key, c1, c2, c3):
    """#(key >= c1), #(key >= c2), #(key >= c3) per row in 16-bit fields of one int64 (NA + NB <= 16384)."""
    packed = ((b_key >= c1[:, None]).to(tl.int64) + ((b_key >= c2[:, None]).to(tl.int64) << 16)
              + ((b_key >= c3[:, None]).to(tl.int64) << 32))
    return tl.sum(packed, axis=1)


@triton.jit
def _two_bits(s_n, b_t, b_n, c1, c2, c3, k_i):
    """One two-bits-per-step search update: the highest of the thresholds c1 < c2 < c3 whose count (packed in s_n
    by _count_ge3) still reaches K_i becomes the row's threshold; returns (threshold, its count)."""
    n1 = (s_n & 0xFFFF).to(tl.int32)
    n2 = ((s_n >> 16) & 0xFFFF).to(tl.int32)
    n3 = (s_n >> 32).to(tl.int32)
    b_t = tl.where(n3 >= k_i, c3, tl.where(n2 >= k_i, c2, tl.where(n1 >= k_i, c1, b_t)))
    b_n = tl.where(n3 >= k_i, n3, tl.where(n2 >= k_i, n2, tl.where(n1 >= k_i, n1, b_n)))
    return b_t, b_n


@triton.jit
def _piece_store(IDX, VBIAS, i_bh, o_i, m_i, N, NSEL, sel, base, J0: tl.constexpr, NJ: tl.constexpr):
    o_j = J0 + tl.arange(0, NJ)
    pos = tl.cumsum(sel.to(tl.int32), axis=1) - 1 + base[:, None]
    p_idx = IDX + (i_bh * N + o_i)[:, None].to(tl.int64) * NSEL
    tl.store(p_idx + pos, o_j[None, :] + 0 * pos, mask=sel)
    p_o = VBIAS + (i_bh.to(tl.int64) * N + o_i)[:, None] * N + o_j[None, :]
    tl.store(p_o, tl.full([o_i.shape[0], NJ], float("-inf"), tl.float32).to(VBIAS.dtype.element_ty), mask=sel)


@triton.jit
def _select_pieces_kernel(
    SCORE, IDX, VBIAS,
    N, NSEL, HC, H0, HSUB, k_budget, band, n_sink,
    NA: tl.constexpr, NB: tl.constexpr, ROWS: tl.constexpr, KP2: tl.constexpr, BITS: tl.constexpr,
    INTERP: tl.constexpr = 0,
):
    i_r, i_loc = tl.program_id(0), tl.program_id(1)
    i_bh = (i_loc // HSUB) * HC + H0 + i_loc % HSUB
    o_i = i_r * ROWS + tl.arange(0, ROWS)
    m_i = o_i < N
    # columns 0 .. NA and NA .. NA + NB (NB = 0: one piece)
    k_a = _piece_keys(SCORE, i_loc, o_i, m_i, N, 0, NA)
    if NB > 0:
        k_b = _piece_keys(SCORE, i_loc, o_i, m_i, N, NA, NB)
    else:
        k_b = k_a  # (unused)
    # #forced of row i: the band window [i - band, i + band] within [0, N), plus the sinks [0, n_sink) outside it
    w_lo = tl.maximum(o_i - band, 0)
    w_hi = tl.minimum(o_i + band, N - 1)
    n_snk = tl.minimum(n_sink, N)
    n_forced = (tl.maximum(w_hi - w_lo + 1, 0) + n_snk
                - tl.maximum(tl.minimum(w_hi, n_snk - 1) - w_lo + 1, 0))
    # rows past N: K_i = N, already met (they never hold the search up)
    k_i = tl.where(m_i, tl.maximum(n_forced, k_budget), N)
    b_t = tl.zeros([ROWS], dtype=tl.uint32)
    b_n = tl.zeros([ROWS], dtype=tl.int32) + N  # #(key >= 0) over the real columns
    todo = tl.max((b_n != k_i).to(tl.int32), axis=0)
    if INTERP:
        b_t, b_n = _search_interp(k_a, k_b, N, k_i, ROWS=ROWS, NA=NA, NB=NB, MAX_INTERP=INTERP)
    elif BITS == 1:
        bit = 31
        while (bit >= 0) & (todo > 0):
            c = b_t | (tl.full([ROWS], 1, dtype=tl.uint32) << bit.to(tl.uint32))
            n1 = _count_ge(k_a, c)
            if NB > 0:
                n1 += _count_ge(k_b, c)
            up = n1 >= k_i
            b_t = tl.where(up, c, b_t)
            b_n = tl.where(up, n1, b_n)
            todo = tl.max((b_n != k_i).to(tl.int32), axis=0)
            bit -= 1
    else:
        bit = 30  # the lower bit of the pair
        while (bit >= 0) & (todo > 0):
            one = tl.full([ROWS], 1, dtype=tl.uint32) << bit.to(tl.uint32)
            c1 = b_t | one
            c2 = b_t | (one << 1)
            c3 = c2 | one
            s_n = _count_ge3(k_a, c1, c2, c3)
            if NB > 0:
                s_n += _count_ge3(k_b, c1, c2, c3)
            b_t, b_n = _two_bits(s_n, b_t, b_n, c1, c2, c3, k_i)
            todo = tl.max((b_n != k_i).to(tl.int32), axis=0)
            bit -= 2
    # the chosen set: keys > t, and of the keys == t (real columns only: padding has key 0) the lowest ids
    m_a = m_i[:, None] & (tl.arange(0, NA) < N)[None, :]
    gt_a = (k_a > b_t[:, None]) & m_a
    eq_a = (k_a == b_t[:, None]) & m_a
    n_gt = tl.sum(gt_a.to(tl.int32), axis=1)
    n_eq_a = tl.sum(eq_a.to(tl.int32), axis=1)
    n_eq = n_eq_a
    if NB > 0:
        m_b = m_i[:, None] & ((NA + tl.arange(0, NB)) < N)[None, :]
        gt_b = (k_b > b_t[:, None]) & m_b
        eq_b = (k_b == b_t[:, None]) & m_b
        n_gt += tl.sum(gt_b.to(tl.int32), axis=1)
        n_eq += tl.sum(eq_b.to(tl.int32), axis=1)
    take = k_i - n_gt  # how many of the blocks tied at the threshold are kept
    if tl.max(n_eq - take, axis=0) > 0:
        # a real tie across the threshold (rare): keep the lowest block ids among the tied
        sel_a = gt_a | (eq_a & (tl.cumsum(eq_a.to(tl.int32), axis=1) <= take[:, None]))
        if NB > 0:
            sel_b = gt_b | (eq_b & (tl.cumsum(eq_b.to(tl.int32), axis=1) + n_eq_a[:, None] <= take[:, None]))
    else:
        sel_a = gt_a | eq_a
        if NB > 0:
            sel_b = gt_b | eq_b
    zero = tl.zeros([ROWS], dtype=tl.int32)
    _piece_store(IDX, VBIAS, i_bh, o_i, m_i, N, NSEL, sel_a, zero, 0, NA)
    if NB > 0:
        _piece_store(IDX, VBIAS, i_bh, o_i, m_i, N, NSEL, sel_b, tl.sum(sel_a.to(tl.int32), axis=1), NA, NB)
    o_k = tl.arange(0, KP2)
    p_idx = IDX + (i_bh * N + o_i)[:, None].to(tl.int64) * NSEL
    tl.store(p_idx + o_k[None, :], tl.full([ROWS, KP2], -1, tl.int32),
             mask=m_i[:, None] & (o_k[None, :] >= k_i[:, None]) & (o_k[None, :] < NSEL))


# knobs (bench/pieces.py --sweep): search bits per step, warps for rows up to 2048 keys, keys per program
# (several rows per program below it), and whether a row may be split in two pieces
SELECT_BITS = 1
SELECT_PIECE_WARPS = 1
# a register cap for the one-warp select (None: ptxas's choice, 128 at a 1024 + 256 row: 16 programs per SM). H200
# (session 13, Wan2.1-14B 720p routing): 80 / 96 registers (no spills) made it slower, 1.035 / 1.071 vs 1.000 ms
SELECT_MAXNREG = None
SELECT_PIECE_KEYS = 512
# the threshold search by interpolation (_search_interp, at most SELECT_MAX_INTERP interpolation probes before
# halving) instead of one bit per step (SELECT_BITS); PSA_SELECT_INTERP=1/0 overrides per process. Session 22 on the
# H200 (bench/probes/select_search.py, select_search_s22_h200.txt; the select = route() minus its scores, medians of
# 5 alternated rounds): lists and bias rows bitwise equal on every shape; the select 0.068 -> 0.053 ms at 480p,
# 0.076 -> 0.070 DiT-like, 0.489 -> 0.472 at 720p, 0.475 -> 0.477 DiT-like (route() faster in 0 of 5 rounds), FLUX.1
# 0.095 -> 0.085 (2 of 5). The rule set before timing (faster in >= 4 of 5 rounds at 480p and 720p, random and
# DiT-like) failed at 720p DiT-like: off. At 720p the 2.7x fewer steps (146 -> 208 instructions each) saved ~4% of the
# select, so its time there is not mostly the search (not profiled)
SELECT_INTERP = False
SELECT_MAX_INTERP = 16
SELECT_SPLIT = True


def search_steps() -> int:
    """The select kernel's INTERP constant: 0 (the bit search) or the interpolation probes allowed."""
    return SELECT_MAX_INTERP if env_switch("PSA_SELECT_INTERP", SELECT_INTERP) else 0


def pieces_shape(n: int) -> tuple[int, int, int, int]:
    """(NA, NB, ROWS, num_warps): the row as NA (+ NB) columns, NB = 0 or a power of two < NA."""
    np2 = max(16, triton.next_power_of_2(n))
    na, nb = np2, 0
    if SELECT_SPLIT and np2 >= 64:
        a = np2 // 2
        b = max(16, triton.next_power_of_2(n - a))
        if a + b < np2:
            na, nb = a, b
    rows = 1
    # several rows per program only for one-piece rows: on the H200 (triton 3.6) a split row with ROWS > 1
    # marked the wrong bias entries (the lists were right; bench/probes/select_check.py), under the
    # interpreter it is right
    while nb == 0 and rows < 16 and 2 * rows * (na + nb) <= SELECT_PIECE_KEYS:
        rows *= 2
    warps = SELECT_PIECE_WARPS
    while warps < 16 and (na + nb) * rows > 2048 * warps:  # at most 64 keys per thread
        warps *= 2
    return na, nb, rows, warps

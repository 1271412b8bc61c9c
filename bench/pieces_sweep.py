"""The knob sweeps of bench/pieces.py (`--sweep`): drop's statistics variants (kernels/triton/stats.py, stats2.py), the
select kernels and their knobs (kernels/triton/route.py, select.py), the CuTe kernel with the query tile in
registers or shared memory (kernels/cute/fwd.py, q_rs). Uses bench/pieces.py's timer and helpers (`bind`), so
one --rep and one output dictionary serve both."""
from __future__ import annotations

import torch

_P = None  # the running bench/pieces.py module


def bind(mod) -> None:
    global _P
    _P = mod


STATS_VARIANTS = {  # drop's tensor-core column sums (stats.STATS_TC) against the split kernel; the split kernel's knobs
    "split": {"STATS_TC": False},
    "w4_db64": {"STATS_WARPS": 4, "STATS_DB": 64},  # the default before session 6
    "tc": {},
    "tc_db128": {"STATS_TC_DB": 128},
    "tc_g16": {"STATS_TC_BLOCKS": 16},
    "tc_st4": {"STATS_TC_STAGES": 4},
    "tc_w8": {"STATS_TC_WARPS": 8},
    # pisa / pwt's split statistics kernel with one or two warps per program: the row sums stay inside a warp
    # (sm_90a SASS, Triton 3.6, with the launcher's divisibility hints: 5 barriers per block instead of 25 at 4
    # warps; ptxas 96 / 160 / 88 / 128 registers for 16 / 32 columns at 1 / 2 warps, none spilled), several blocks
    # per program (G) so the grid does not grow 4-8x, the next block's tiles prefetched (168 / 125 registers at
    # 16 columns, 1 / 2 warps)
    "w1_db16": {"STATS_WARPS": 1, "STATS_DB": 16},
    "w1_db32": {"STATS_WARPS": 1, "STATS_DB": 32},
    "w2_db16": {"STATS_WARPS": 2, "STATS_DB": 16},
    "w2_db32": {"STATS_WARPS": 2, "STATS_DB": 32},
    "w1_db16_g4": {"STATS_WARPS": 1, "STATS_DB": 16, "STATS_BLOCKS": 4},
    "w1_db16_g4_pf": {"STATS_WARPS": 1, "STATS_DB": 16, "STATS_BLOCKS": 4, "STATS_PREFETCH": True},
    "w2_db16_g4_pf": {"STATS_WARPS": 2, "STATS_DB": 16, "STATS_BLOCKS": 4, "STATS_PREFETCH": True},
    "w2_db32_g4": {"STATS_WARPS": 2, "STATS_DB": 32, "STATS_BLOCKS": 4},
}


def _knobs(mod, variants):
    """(the knob names the variants set, their current values in `mod`)."""
    names = sorted({n for kv in variants.values() for n in kv})
    return names, {n: getattr(mod, n) for n in names}


def _pwt_stats(kts, q, k, v, cfg):
    """pwt statistics with H-bar reduced (kernels.triton.stats)."""
    st = kts.block_stats(q, k, v, cfg)
    kts.finalize_hbar(st, st.kbar.shape[-2], q.dtype)
    return st


def stats_variants(q, k, v, density, d):
    """Time each STATS_VARIANTS entry on pwt and drop (stats_<name>_pwt_ms / _drop_ms), its largest difference
    from the default's statistics (stats_<name>_maxdiff: k-bar, q-bar, q^2, sigma^2 absolute; H-bar relative)
    and a kernel table of each variant on pwt."""
    from kernels.triton import stats as kts
    D = q.shape[-1]
    cpwt, cdrop = _P.cfg_of("pwt", density, D), _P.cfg_of("drop", density, D)
    names, keep = _knobs(kts, STATS_VARIANTS)

    def pwt_stats():
        return _pwt_stats(kts, q, k, v, cpwt)
    try:
        base = pwt_stats()
        base_drop = kts.block_stats(q, k, v, cdrop)
        for name, kv in STATS_VARIANTS.items():
            for n in names:
                setattr(kts, n, kv.get(n, keep[n]))
            _P.timed(d, f"stats_{name}_pwt_ms", lambda: kts.block_stats(q, k, v, cpwt))
            _P.timed(d, f"stats_{name}_drop_ms", lambda: kts.block_stats(q, k, v, cdrop))
            try:
                st, sd = pwt_stats(), kts.block_stats(q, k, v, cdrop)
                diff = {f: float((getattr(st, f) - getattr(base, f)).abs().max())
                        for f in ("kbar", "qbar", "q2", "ksig2")}
                diff["hbar_rel"] = float((st.hbar - base.hbar).norm() / base.hbar.norm())
                diff["drop_kbar"] = float((sd.kbar - base_drop.kbar).abs().max())
                diff["drop_qbar"] = float((sd.qbar - base_drop.qbar).abs().max())
                d[f"stats_{name}_maxdiff"] = diff
                _P.say(f"  stats_{name}_maxdiff: {diff}")
                d[f"profile_stats_{name}_pwt"] = _P.kernel_table(lambda: kts.block_stats(q, k, v, cpwt))
            except Exception as e:
                d[f"stats_{name}_maxdiff"] = f"failed: {type(e).__name__}: {str(e)[:200]}"
    finally:
        for n in names:
            setattr(kts, n, keep[n])


# the H-sum pass (stats._hsum_kernel): programs per SM (fractional: 1.8 makes Wan2.1-14B's 40 heads x 6 partials =
# 240 programs fit one wave of 2 CTAs per SM, where 2 gives 7 partials = 280 programs, 16 in a second wave),
# warps and pipeline stages; session 6 measured them with 2 per SM as the default, now 4 (sm4)
HSUM_VARIANTS = {
    "default": {},
    "sm1": {"HSUM_CTAS_PER_SM": 1},
    "sm2": {"HSUM_CTAS_PER_SM": 2},
    "sm1.8": {"HSUM_CTAS_PER_SM": 1.8},
    "sm3": {"HSUM_CTAS_PER_SM": 3},
    "sm4": {"HSUM_CTAS_PER_SM": 4},
    "sm8": {"HSUM_CTAS_PER_SM": 8},
    "st2": {"HSUM_STAGES": 2},
    "st4": {"HSUM_STAGES": 4},
    "sm1.8_st2": {"HSUM_CTAS_PER_SM": 1.8, "HSUM_STAGES": 2},
    "w4": {"HSUM_WARPS": 4},  # at 2 per SM (session 6) faster than 8 warps at every size: 0.225 / 0.473 / 0.020 ms
    "w4_g7": {"HSUM_WARPS": 4, "HSUM_MIN_BLOCKS": 7},  # FLUX's grid at 2 per SM (its fastest point there)
    "w4_sm8": {"HSUM_WARPS": 4, "HSUM_CTAS_PER_SM": 8},
}


def kernel_ms(fn, reps=20):
    """{kernel name: mean device ms per call} over `reps` calls of fn under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    _P.sync()
    with profile(activities=[ProfilerActivity.CUDA if _P.DEV == "cuda" else ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            fn()
        _P.sync()
    out = {}
    for ev in prof.key_averages():
        t = (getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)) if _P.DEV == "cuda" \
            else ev.cpu_time_total
        if t:
            out[ev.key] = t / 1e3 / reps
    return out


def hsum_variants(q, k, v, density, d):
    """The H-sum kernel's device time per HSUM_VARIANTS entry (hsum_<name>_ms, from the profiler over 20 calls; the
    statistics kernel's beside it) and H-bar's distance from the default's (hsum_<name>_hbar_rel: the partials are
    summed in another grouping)."""
    from kernels.triton import stats as kts
    cpwt = _P.cfg_of("pwt", density, q.shape[-1])
    names, keep = _knobs(kts, HSUM_VARIANTS)

    def pwt_stats():
        return _pwt_stats(kts, q, k, v, cpwt)
    try:
        base = pwt_stats().hbar
        for name, kv in HSUM_VARIANTS.items():
            for n in names:
                setattr(kts, n, kv.get(n, keep[n]))
            try:
                t = kernel_ms(lambda: kts.block_stats(q, k, v, cpwt))
                d[f"hsum_{name}_ms"] = sum(x for key, x in t.items() if "hsum" in key)
                d[f"hsum_{name}_stats_ms"] = sum(x for key, x in t.items() if "block_stats" in key)
                hb = pwt_stats().hbar
                d[f"hsum_{name}_hbar_rel"] = float((hb - base).norm() / base.norm())
                _P.say(f"  hsum_{name}: {d[f'hsum_{name}_ms']:.4f} ms (statistics kernel "
                       f"{d[f'hsum_{name}_stats_ms']:.4f}), H-bar rel {d[f'hsum_{name}_hbar_rel']:.1e}")
            except Exception as e:
                d[f"hsum_{name}_ms"] = f"failed: {type(e).__name__}: {str(e)[:200]}"
                _P.say(f"  hsum_{name}: FAILED {d[f'hsum_{name}_ms']}")
    finally:
        for n in names:
            setattr(kts, n, keep[n])


def cute_qrs(d, kcf, q, k, v, st, idx, vbias, cdrop, cpwt):
    """The CuTe attention with the query tile in registers (q_rs) and in shared memory, alternated twice in one
    process, and the q_rs output's distance from the other (rel L2; the same arithmetic, so ~0)."""
    for name, cfg, vb in (("drop", cdrop, None), ("pwt", cpwt, vbias)):
        o0, o1 = torch.empty_like(q), torch.empty_like(q)
        for rnd_ in (0, 1):
            _P.timed(d, f"attn_cute_{name}_qrs0_r{rnd_}_ms", lambda: kcf.attention(q, k, v, o0, st, idx, vb, cfg, q_rs=False))
            _P.timed(d, f"attn_cute_{name}_qrs1_r{rnd_}_ms", lambda: kcf.attention(q, k, v, o1, st, idx, vb, cfg, q_rs=True))
        d[f"attn_cute_{name}_qrs1_rel"] = float((o1.float() - o0.float()).norm() / o0.float().norm())
        del o0, o1


def sweep(q, k, v, density, out):
    """Tuning knobs of the statistics and routing kernels (kernels.triton.stats / route module attributes)."""
    from kernels.triton import route as kr
    from kernels.triton import stats as kts
    D = q.shape[-1]
    cpwt = _P.cfg_of("pwt", density, D)
    d = out.setdefault("sweep", {})
    keep = (kts.STATS_DB, kts.STATS_PREFETCH, kts.STATS_BLOCKS, kts.STATS_WARPS, kr.SELECT_KEYS, kr.SELECT_WARPS,
            kr.SCORE_DK, kr.SCORE_WARPS)
    try:
        stats_variants(q, k, v, density, d)
        hsum_variants(q, k, v, density, d)
        st = kts.block_stats(q, k, v, cpwt)
        from kernels.triton import select as ks
        skeep = (kr.SELECT_IMPL, ks.SELECT_BITS, ks.SELECT_PIECE_WARPS, ks.SELECT_PIECE_KEYS, ks.SELECT_SPLIT)

        def once():
            st.hbar_ready = False
            return kts.route(st, cpwt, q.dtype)
        try:
            # the "bits" select (route._select_kernel) at its keys / warps, then the score slices
            kr.SELECT_IMPL = "bits"
            for keys, warps, dk, sw in ((2048, 4, 128, 4), (2048, 8, 128, 4), (1024, 4, 128, 4), (2048, 4, 64, 4)):
                kr.SELECT_KEYS, kr.SELECT_WARPS, kr.SCORE_DK, kr.SCORE_WARPS = keys, warps, dk, sw
                _P.timed(d, f"route_bits_keys{keys}_w{warps}_scoredk{dk}_w{sw}_ms", once)
            kr.SELECT_KEYS, kr.SELECT_WARPS, kr.SCORE_DK, kr.SCORE_WARPS = keep[4:]
            d["profile_route_bits"] = _P.kernel_table(once)
            # the "pieces" select (kernels/triton/select.py): bits per step, warps, keys per program, split rows
            kr.SELECT_IMPL = "pieces"
            for bits, warps, pkeys, split in ((1, 1, 512, True), (2, 1, 512, True), (1, 2, 512, True),
                                              (1, 4, 512, True), (1, 1, 1024, True), (1, 1, 2048, True),
                                              (1, 1, 512, False), (2, 2, 512, True), (1, 4, 2048, True)):
                ks.SELECT_BITS, ks.SELECT_PIECE_WARPS, ks.SELECT_PIECE_KEYS, ks.SELECT_SPLIT = bits, warps, pkeys, split
                _P.timed(d, f"route_pieces_bits{bits}_w{warps}_keys{pkeys}_split{int(split)}_ms", once)
        finally:
            kr.SELECT_IMPL, ks.SELECT_BITS, ks.SELECT_PIECE_WARPS, ks.SELECT_PIECE_KEYS, ks.SELECT_SPLIT = skeep
        # the scores kernel's output tile, D slices, warps and load stages (route.SCORE_*; default 64 x 64, the
        # whole D at 4 warps, unpipelined), with the default select
        kkeep = (kr.SCORE_BM, kr.SCORE_BN, kr.SCORE_DK, kr.SCORE_WARPS, kr.SCORE_STAGES)
        try:
            for bm, bn, dk, w, stg in ((64, 64, 32, 8, 3), (64, 64, 32, 4, 3), (64, 64, 64, 8, 2),
                                       (128, 64, 32, 8, 3), (64, 128, 32, 8, 3)):
                kr.SCORE_BM, kr.SCORE_BN, kr.SCORE_DK, kr.SCORE_WARPS, kr.SCORE_STAGES = bm, bn, dk, w, stg
                _P.timed(d, f"route_scores_bm{bm}_bn{bn}_dk{dk}_w{w}_st{stg}_ms", once)
        finally:
            kr.SCORE_BM, kr.SCORE_BN, kr.SCORE_DK, kr.SCORE_WARPS, kr.SCORE_STAGES = kkeep
        try:
            d["profile_route_default"] = None
            kr.SELECT_KEYS, kr.SELECT_WARPS, kr.SCORE_DK, kr.SCORE_WARPS = keep[4:]

            def once_default():
                st.hbar_ready = False
                return kts.route(st, cpwt, q.dtype)
            d["profile_route_default"] = _P.kernel_table(once_default)
        except Exception as e:
            d["profile_route_default"] = f"failed: {e}"
    finally:
        (kts.STATS_DB, kts.STATS_PREFETCH, kts.STATS_BLOCKS, kts.STATS_WARPS, kr.SELECT_KEYS, kr.SELECT_WARPS,
         kr.SCORE_DK, kr.SCORE_WARPS) = keep

"""Checks of the Triton backend under TRITON_INTERPRET=1 on CPU, at tiny sizes; prints one JSON object.

Run by tests/test_triton_interpret.py in a subprocess, because TRITON_INTERPRET must be set before Triton is
imported and must not leak into other test files. Every case compares against the float64 PyTorch
reference (kernels/reference.py) under identical routing, or against the lead's routing/statistics.
"""
import json
import math
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels import reference  # noqa: E402
from kernels import triton as kt  # noqa: E402
from kernels.config import SparseConfig  # noqa: E402
from kernels.reorder import apply_reorder  # noqa: E402
from kernels.routing import BlockStats, block_stats, route  # noqa: E402
from kernels.triton import fwd, stats  # noqa: E402
from interp_common import case_recorder, cfg_of, rel, rnd  # noqa: E402

RES = {}
case = case_recorder(RES)


def same_routing(q, k, v, cfg, config=None):
    q64, k64, v64 = q.double(), k.double(), v.double()
    st = block_stats(q64, k64, v64, cfg.block_size, need_hnorm=cfg.cov_bias)
    r = route(st, cfg)
    ref = reference.forward(q64, k64, v64, cfg, routing=r, stats=st)
    out = kt.forward_with_routing(q, k, v, cfg, r, config=config)
    return {"rel": rel(out, ref), "finite": bool(torch.isfinite(out).all()), "shape_ok": out.shape == q.shape,
            "dtype_ok": out.dtype == q.dtype}


for variant in ("pwt", "pisa", "drop"):
    @case(f"fp32_T200_D64_{variant}")
    def _(variant=variant):
        q, k, v = (rnd(1, 2, 200, 64, seed=s) for s in range(3))
        return same_routing(q, k, v, cfg_of(64, 0.3, variant, band=0))


@case("fp32_B2_T130_D128_pwt_sinks_band")
def _():
    q, k, v = (rnd(2, 1, 130, 128, seed=10 + s) for s in range(3))
    return same_routing(q, k, v, cfg_of(128, 0.3, "pwt", band=1, sinks=1))


@case("fp32_T200_D64_pisa_cov_bias")
def _():
    q, k, v = (rnd(1, 1, 200, 64, seed=20 + s) for s in range(3))
    return same_routing(q, k, v, cfg_of(64, 0.3, "pisa", band=0, cov=True))


@case("fp32_T40_shorter_than_a_block")
def _():
    q, k, v = (rnd(1, 2, 40, 64, seed=30 + s) for s in range(3))
    return same_routing(q, k, v, cfg_of(64, 0.5, "pwt"))


@case("fp32_tiles_blockn128_and_tma")
def _():
    q, k, v = (rnd(1, 1, 300, 64, seed=40 + s) for s in range(3))
    cfg = cfg_of(64, 0.4, "pwt", band=0)
    a = same_routing(q, k, v, cfg, config=dict(BLOCK_N=128, BLOCK_V=64, USE_TMA=False, num_warps=4, num_stages=1))
    b = same_routing(q, k, v, cfg, config=dict(BLOCK_N=64, BLOCK_V=64, USE_TMA=True, num_warps=4, num_stages=1))
    return {"rel_blockn128": a["rel"], "rel_tma": b["rel"]}


@case("fp16_T200_D64_pwt")
def _():
    q, k, v = (rnd(1, 1, 200, 64, seed=50 + s, dtype=torch.float16) for s in range(3))
    cfg = cfg_of(64, 0.3, "pwt", band=0)
    r0 = same_routing(q, k, v, cfg)
    # PyTorch's own float16 error on the same problem, for an honest tolerance
    st = block_stats(q.double(), k.double(), v.double(), 64)
    r = route(st, cfg)
    ref = reference.forward(q.double(), k.double(), v.double(), cfg, routing=r, stats=st)
    r0["torch_fp16_rel"] = rel(reference.forward(q.float(), k.float(), v.float(), cfg, routing=r).half(), ref)
    return r0


@case("head_chunks_equal_one_pass_and_scratch_is_counted")
def _():
    out = {}
    for var, cov in (("pwt", False), ("pisa", True), ("drop", False)):
        q, k, v = (rnd(2, 3, 200, 64, seed=80 + s, dtype=torch.float16) for s in range(3))
        cfg = cfg_of(64, 0.3, var, band=1, cov=cov)
        whole = kt._forward_impl(q, k, v, cfg, scratch=0)  # scratch <= 0: all heads in one chunk
        orig = kt._heads_per_chunk
        try:
            kt._heads_per_chunk = lambda *a: 1  # one head per chunk
            chunked = kt._forward_impl(q, k, v, cfg)
        finally:
            kt._heads_per_chunk = orig
        # the bytes block_stats + route allocate for these heads against the estimate the chunking uses
        st = stats.block_stats(q, k, v, cfg)
        idx, vbias = stats.route(st, cfg, q.dtype)
        held = [x for x in (st.kbar, st.qbar, st.q2, st.ksig2, st.kbar_lp, st.vmean_lp, st.hpart, st.hbar,
                            st.hbar_lp, st.hbar_scale, st.hnorm, idx, vbias) if x is not None]
        # every storage once (the one-pass statistics are views of two buffers that also hold the value sums)
        actual = sum({x.untyped_storage().data_ptr(): x.untyped_storage().nbytes() for x in held}.values())
        est = 2 * 3 * kt.scratch_bytes_per_head(200, 64, cfg, 2, idx.shape[-1], bh=2 * 3, device=q.device)
        # route()'s bias carries route.BIAS_SLACK elements past its end once per call (the CuTe pair kernel's
        # unclamped loads), not per head
        from kernels.triton import route as kroute
        slack = kroute.BIAS_SLACK * vbias.element_size()
        out[var] = {"max_abs_diff": (whole.float() - chunked.float()).abs().max().item(),
                    "rel": rel(chunked, whole),
                    "scratch_actual": actual, "scratch_estimate": est, "scratch_slack": slack}
    # Wan2.1-14B 480p / 720p, bf16, the default budget (half of q's bytes): one pass; a tighter budget spreads
    # the heads evenly over the fewest chunks
    frac = kt._scratch_fraction()
    out["default_fraction"] = frac
    out["wan14b_pwt_hc"] = kt._heads_per_chunk(1, 40, 32760, 128, cfg_of(128, 0.125, "pwt"), 2, 67, frac)
    out["wan14b_720p_pwt_hc"] = kt._heads_per_chunk(1, 40, 75600, 128, cfg_of(128, 0.125, "pwt"), 2, 151, frac)
    out["wan14b_drop_hc"] = kt._heads_per_chunk(1, 40, 32760, 128, cfg_of(128, 0.125, "drop"), 2, 67, frac)
    out["hc_41_heads_tight"] = kt._heads_per_chunk(1, 41, 32760, 128, cfg_of(128, 0.125, "pwt"), 2, 67, 0.10)
    return out


@case("density_one_equals_sdpa")
def _():
    q, k, v = (rnd(1, 2, 130, 64, seed=60 + s) for s in range(3))
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    return {var: rel(kt.forward(q, k, v, cfg_of(64, 1.0, var)), ref) for var in ("pwt", "pisa", "drop")}


@case("own_routing_and_stats_equal_kernels_routing")
def _():
    out = {}
    for var, cov, sinks in (("pwt", False, 2), ("pisa", True, 0), ("drop", False, 0)):
        q, k, v = (rnd(1, 2, 700, 64, seed=70 + s) for s in range(3))
        cfg = cfg_of(64, 0.2, var, band=1, sinks=sinks, cov=cov)
        st = stats.block_stats(q, k, v, cfg)
        idx, vbias = stats.route(st, cfg, q.dtype)
        idx_t, _ = stats.route_torch(st, cfg, q.dtype)
        ref_st = block_stats(q, k, v, 64, need_hnorm=cov)
        lead = route(BlockStats(st.kbar, None, st.ksig2 if st.ksig2 is not None else st.kbar, None, st.qbar,
                                st.q2 if st.q2 is not None else st.qbar, st.hbar, st.hnorm), cfg)
        n = ref_st.kbar.shape[-2]
        d = {"idx_equal_lead": bool(torch.equal(idx, lead.idx)), "idx_equal_torch": bool(torch.equal(idx, idx_t)),
             "exact_equal_lead": bool(torch.equal(vbias == float("-inf"), lead.exact)),
             "w_maxdiff": float((vbias.masked_fill(lead.exact, 0) - lead.w.masked_fill(lead.exact, 0)).abs().max()),
             "kbar": float((st.kbar - ref_st.kbar).abs().max()), "qbar": float((st.qbar - ref_st.qbar).abs().max()),
             "hbar_rel": rel(st.hbar, ref_st.hbar) if st.hbar is not None else 0.0,
             "drop_skips_values": var != "drop" or (st.vmean_lp is None and st.hpart is None)}
        if st.vmean_lp is not None:
            d["vmean"] = float((st.vmean_lp - ref_st.vsum / ref_st.counts[:, None]).abs().max())
        if var == "pwt":
            d["ksig2"] = float((st.ksig2 - ref_st.ksig2).abs().max())
            d["q2"] = float((st.q2 - ref_st.q2).abs().max())
        if cov:
            d["hnorm_rel"] = rel(st.hnorm, ref_st.hnorm)
        out[var] = d
        del n
    return out


@case("scores_bf16x3_split_ranks_like_float32")
def _():
    # the GPU's default score dots (route.SCORE_PREC "bf16x3": high / low bfloat16 parts, emulated here in float32
    # since the interpreter's bfloat16 dots are wrong) against the float32 dots: the same exact sets but where two
    # blocks' float64 scores are within ~1e-4 of the row's spread, the same w where not exact
    from kernels.triton import route as kr
    out = {}
    for var, cov in (("pwt", False), ("pisa", True)):
        q, k, v = (rnd(1, 2, 64 * 24 + 13, 64, seed=170 + s) for s in range(3))
        cfg = cfg_of(64, 0.2, var, band=1, sinks=1, cov=cov)
        st = stats.block_stats(q, k, v, cfg)
        keep = kr.SCORE_PREC
        try:
            res = {}
            for p in ("tf32x3", "bf16x3"):
                kr.SCORE_PREC = p
                st.hbar_ready = False
                res[p] = stats.route(st, cfg, q.dtype)
        finally:
            kr.SCORE_PREC = keep
        (ia, va), (ib, vb) = res["tf32x3"], res["bf16x3"]
        ea, eb = va == float("-inf"), vb == float("-inf")
        s64 = (st.qbar.double() @ st.kbar.double().transpose(-1, -2)) * cfg.scale
        if cov:
            s64 = s64 + torch.log(st.hnorm.double() + 1e-6)[..., None, :]
        if var == "pwt":
            w64 = (st.q2.double() @ st.ksig2.double().transpose(-1, -2)) * 0.5 * cfg.scale ** 2
            s64 = s64 + w64.clamp(max=math.log(64))
        rows = (ea != eb).any(-1)
        gap = 0.0
        if rows.any():
            only_a = torch.where(ea & ~eb, s64, float("-inf")).amax(-1)
            only_b = torch.where(eb & ~ea, s64, float("inf")).amin(-1)
            gap = float(((only_a - only_b) / s64.std(-1))[rows].max())
        both = ~ea & ~eb
        out[var] = {"rows_differ": int(rows.sum()), "rows": int(rows.numel()), "max_gap_in_spread": gap,
                    "bias_maxdiff": float((va.float() - vb.float())[both].abs().max()),
                    "counts_equal": bool(torch.equal(ea.sum(-1), eb.sum(-1)))}
    return out


@case("stats_grouped_blocks_equal_one_block_per_program")
def _():
    # statistics programs loop over G blocks (last group partial), with and without the prefetch of the next
    # block, through a permutation, T not a multiple of 64: the same numbers as one block per program
    T, D = 64 * 10 + 37, 64
    q, k, v = (rnd(1, 2, T, D, seed=140 + s) for s in range(3))
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(141)).to(torch.int32)
    cfg = cfg_of(D, 0.3, "pwt")
    keep = (stats.STATS_BLOCKS, stats.STATS_MIN_WAVES, stats.STATS_PREFETCH, stats.STATS_DB)
    names = ("kbar", "qbar", "q2", "ksig2", "kbar_lp", "vmean_lp", "hpart")
    os.environ["PSA_STATS_H"] = "0"  # the two-pass kernels (the one pass has no such groups: stats_h_interp_cases)
    try:
        stats.STATS_BLOCKS, stats.STATS_MIN_WAVES, stats.STATS_PREFETCH = 1, 1, False
        base = stats.block_stats(q, k, v, cfg, perm=perm)
        out = {"groups": {}}
        for blocks in (3, 4):
            for pre in (False, True):
                for db in (32, 64):
                    stats.STATS_BLOCKS, stats.STATS_PREFETCH, stats.STATS_DB = blocks, pre, db
                    st = stats.block_stats(q, k, v, cfg, perm=perm)
                    out["groups"][f"G{blocks}_prefetch{int(pre)}_db{db}"] = {
                        "G": stats.stats_blocks_per_program(11, 2 * (D // db), "cpu"),
                        "maxdiff": max(float((getattr(st, n) - getattr(base, n)).abs().max()) for n in names)}
    finally:
        stats.STATS_BLOCKS, stats.STATS_MIN_WAVES, stats.STATS_PREFETCH, stats.STATS_DB = keep
        os.environ.pop("PSA_STATS_H", None)
    ref = block_stats(apply_reorder(q, perm.long()).double(), apply_reorder(k, perm.long()).double(),
                      apply_reorder(v, perm.long()).double(), 64)
    out["kbar_vs_ref"] = float((base.kbar - ref.kbar).abs().max())
    out["ksig2_vs_ref"] = float((base.ksig2 - ref.ksig2).abs().max())
    return out


@case("stats_tc_equals_split_kernels")
def _():
    # STATS_TC (drop's q-bar / k-bar as column sums on tensor cores) against the split kernel: B2, odd T, an inf
    # key and a NaN value in the inputs
    keep = (stats.STATS_TC, stats.STATS_TC_BLOCKS)
    out = {}
    try:
        stats.STATS_TC_BLOCKS = 2
        D, T = 64, 64 * 4 + 1
        q, k, v = (rnd(2, 2, T, D, seed=150 + s) for s in range(3))
        k[1, 0, 70, 3] = float("inf")  # block 1 of (b1, h0)
        v[0, 1, 200, 5] = float("nan")  # block 3 of (b0, h1)
        cfg = cfg_of(D, 0.3, "drop")
        res = {}
        for tc in (False, True):
            stats.STATS_TC = tc
            res[tc] = stats.block_stats(q, k, v, cfg)
        a, b = res[False], res[True]
        out[f"D{D}_T{T}_drop"] = {n: float((getattr(a, n) - getattr(b, n)).nan_to_num(0.0, 0.0, 0.0).abs().max())
                                  for n in ("kbar", "qbar")}
        out[f"D{D}_T{T}_drop"]["nonfinite_equal"] = torch.equal(torch.isfinite(a.kbar), torch.isfinite(b.kbar))
    finally:
        stats.STATS_TC, stats.STATS_TC_BLOCKS = keep
    return out


@case("select_kernel_equals_a_sorted_topk_on_crafted_scores")
def _():
    # the select kernel alone on scores like the scores kernel writes (forced blocks at +inf, huge finite
    # clamps, rows of heavy ties), one row per program (few keys per program) and several rows per program:
    # per row the max(k, #forced) best by (score descending, block id ascending), ascending, -1 padded
    from kernels.routing import forced_mask
    from kernels.triton import route as kr
    out = {}
    keep = kr.SELECT_KEYS
    try:
        for n, k, band, sinks, keys in ((37, 5, 1, 0, 2048), (70, 9, 0, 2, 2048), (130, 20, 1, 1, 64),
                                        (130, 3, 2, 1, 2048)):
            kr.SELECT_KEYS = keys
            g = torch.Generator().manual_seed(n + k)
            score = torch.randn(1, n, n, generator=g)
            score[0, :8] = torch.round(score[0, :8] * 2) / 2  # ties across the threshold
            score[0, 8, : n // 2] = 1e30
            score[0, 9] = -1e30
            forced = forced_mask(n, n, band, sinks, "cpu")
            score[0][forced] = float("inf")
            kmax = max(k, int(forced.sum(-1).max()))
            idx = torch.full((1, 1, n, kmax), 7, dtype=torch.int32)
            vbias = torch.zeros(1, 1, n, n, dtype=torch.float16)
            np2, rows, warps = kr._select_shape(n)
            kr._select_kernel[(-(-n // rows), 1)](score, idx, vbias, n, kmax, 1, 0, 1, k, band, sinks, NP2=np2,
                                                 ROWS=rows, KP2=max(16, 1 << (kmax - 1).bit_length()),
                                                 num_warps=warps)
            ok = True
            for i in range(n):
                ki = max(k, int(forced[i].sum()))
                order = sorted(range(n), key=lambda j: (-float(score[0, i, j]), j))[:ki]
                want = sorted(order) + [-1] * (kmax - ki)
                ok &= [int(x) for x in idx[0, 0, i]] == want
                ok &= bool(torch.equal(vbias[0, 0, i] == float("-inf"),
                                       torch.zeros(n, dtype=torch.bool).index_fill_(0, torch.tensor(order), True)))
            out[f"n{n}_k{k}_band{band}_sinks{sinks}_rows{rows}"] = ok
    finally:
        kr.SELECT_KEYS = keep
    return out


@case("select_pieces_equals_bits_and_a_sorted_topk")
def _():
    # the one-warp select (kernels/triton/select.py) against the "bits" kernel and against a sort by
    # (order-preserving key descending, id ascending): random rows, ties across the threshold, all-equal rows,
    # +inf forced blocks, +-1e30 clamps, NaN (+NaN ranks above +inf by key; -NaN below every float), n not a
    # power of two (two pieces), n = 1, k = n; one and two bits per step and the interpolation search, one and
    # several rows per program
    from kernels.routing import forced_mask
    from kernels.triton import route as kr
    from kernels.triton import select as ks
    out = {}
    keep = (kr.SELECT_IMPL, ks.SELECT_BITS, ks.SELECT_SPLIT, ks.SELECT_PIECE_KEYS, ks.SELECT_INTERP)

    def order_key(x):  # the kernels' key as a Python int
        b = int(torch.tensor([x], dtype=torch.float32).view(torch.int32)) & 0xFFFFFFFF
        return b ^ 0xFFFFFFFF if b >> 31 else b | 0x80000000

    try:
        for n, k, band, sinks, fill in ((37, 5, 1, 0, "mixed"), (70, 9, 0, 2, "mixed"), (1, 1, 0, 0, "mixed"),
                                        (20, 20, 1, 1, "mixed"), (33, 4, 2, 40, "mixed"), (24, 6, 0, 0, "equal"),
                                        (40, 7, 1, 1, "nan"), (45, 6, 1, 0, "positive"), (38, 5, 0, 1, "narrow"),
                                        (30, 4, 0, 0, "negative")):
            g = torch.Generator().manual_seed(n + k)
            score = torch.randn(1, n, n, generator=g)
            if fill == "equal":
                score[0, : n // 2] = 0.25
            if fill == "positive":  # one sign and a few exponents
                score = 0.3 + 0.3 * torch.rand(1, n, n, generator=g)
            if fill == "narrow":  # keys that differ in their last bits only; rows 12.. all equal but one
                score = 1.0 + torch.randint(0, 16, (1, n, n), generator=g) * 2.0 ** -23
                score[0, 12:, :] = 0.75
                score[0, 12:, 3] = 0.7500001
            if fill == "negative":
                score = -0.5 - torch.rand(1, n, n, generator=g)
            if n > 10 and fill not in ("positive", "narrow", "negative"):
                score[0, :8] = torch.round(score[0, :8] * 2) / 2  # ties across the threshold
                score[0, 8, : n // 2] = 1e30
                score[0, 9] = -1e30
            if fill == "nan":
                score[0, 2:6, ::3] = float("nan")
                score[0, 6:9, 1::4] = -float("nan")
            forced = forced_mask(n, n, band, sinks, "cpu")
            score[0][forced] = float("inf")
            kmax = max(k, int(forced.sum(-1).max()))
            keys = [[order_key(float(score[0, i, j])) for j in range(n)] for i in range(n)]
            want = []
            for i in range(n):
                ki = max(k, int(forced[i].sum()))
                want.append(sorted(sorted(range(n), key=lambda j: (-keys[i][j], j))[:ki]) + [-1] * (kmax - ki))
            want = torch.tensor(want, dtype=torch.int32)
            exact = torch.zeros(n, n, dtype=torch.bool).scatter_(1, want.clamp(min=0).long(), want >= 0)
            runs = [("bits", 1, True, 512, "bits"), ("pieces", 1, True, 512, "bits"), ("pieces", 2, True, 512, "bits"),
                    ("pieces", 1, False, 64, "bits"), ("pieces", 1, True, 512, "interp"),
                    ("pieces", 1, False, 64, "interp")]
            for impl, bits, split, pkeys, search in runs:
                if impl == "bits" and fill == "nan":
                    continue  # "bits" counts its padding (key of -inf) above a -NaN
                kr.SELECT_IMPL, ks.SELECT_BITS, ks.SELECT_SPLIT, ks.SELECT_PIECE_KEYS = impl, bits, split, pkeys
                ks.SELECT_INTERP = search == "interp"
                idx = torch.full((1, 1, n, kmax), 7, dtype=torch.int32)
                vbias = torch.zeros(1, 1, n, n, dtype=torch.float16)
                kr._select(score, idx, vbias, n, kmax, 1, 0, 1, k, (band, sinks), 1)
                shape = ks.pieces_shape(n) if impl == "pieces" else kr._select_shape(n)
                name = f"n{n}_k{k}_{fill}_{impl}_bits{bits}_{search}_shape{'x'.join(map(str, shape))}"
                out[name] = bool(torch.equal(idx[0, 0], want)) and bool(torch.equal(vbias[0, 0] == float("-inf"),
                                                                                   exact))
    finally:
        kr.SELECT_IMPL, ks.SELECT_BITS, ks.SELECT_SPLIT, ks.SELECT_PIECE_KEYS, ks.SELECT_INTERP = keep
    return out


@case("route_select_impls_agree_with_torch")
def _():
    # route() end to end with either select kernel: the same lists as route_torch, the same bias
    from kernels.triton import route as kr
    q, k, v = (rnd(1, 2, 64 * 37 + 9, 64, seed=160 + s) for s in range(3))
    cfg = cfg_of(64, 0.3, "pwt", band=1, sinks=1)
    keep = kr.SELECT_IMPL
    out, bias = {}, {}
    try:
        for impl in ("pieces", "bits"):
            kr.SELECT_IMPL = impl
            st = stats.block_stats(q, k, v, cfg)
            idx, bias[impl] = stats.route(st, cfg, q.dtype)
            idx_t, vb_t = stats.route_torch(st, cfg, q.dtype)
            out[impl] = {"idx_equal_torch": bool(torch.equal(idx, idx_t)),
                         "exact_marks_equal_torch": bool(torch.equal(bias[impl] == float("-inf"),
                                                                     vb_t == float("-inf")))}
    finally:
        kr.SELECT_IMPL = keep
    out["bias_pieces_equals_bits"] = bool(torch.equal(bias["pieces"], bias["bits"]))
    return out


@case("score_slices_wider_than_the_head_dim")
def _():
    # the GPU's whole-D score slice (SCORE_DK = 128) at head_dim 64: the slice is clamped to D, never reading
    # past a row (the next block's statistics, or past the buffer at the last row)
    from kernels.triton import route as kr
    q, k, v = (rnd(1, 2, 64 * 9 + 5, 64, seed=150 + s) for s in range(3))
    cfg = cfg_of(64, 0.3, "pwt")
    keep = kr.SCORE_DK
    out = {}
    try:
        for dk in (16, 128):
            kr.SCORE_DK = dk
            st = stats.block_stats(q, k, v, cfg)
            idx, vbias = stats.route(st, cfg, q.dtype)
            idx_t, vb_t = stats.route_torch(st, cfg, q.dtype)
            out[f"dk{dk}"] = {"idx_equal_torch": bool(torch.equal(idx, idx_t)),
                              "bias_maxdiff": float((vbias.float() - vb_t.float()).nan_to_num(0, 0, 0).abs().max())}
    finally:
        kr.SCORE_DK = keep
    return out


@case("routing_ties_keep_the_lowest_block_ids")
def _():
    # every key block the same: all scores of a row tie, so the budget beyond the forced band is filled by
    # the lowest block ids (the select kernel's tie path; without ties it skips the ranking). Small integers, so
    # every block mean and score is exact in float32 and bfloat16 whatever the summation order: the interpreter's
    # tl.dot is numpy's matmul, whose BLAS may round columns of one tile differently (numpy 2.4.6 broke the ties of
    # randn inputs, 2026-12-07)
    T, D = 64 * 40, 64
    q = rnd(1, 1, T, D, seed=130).mul(2).round()
    kb = rnd(1, 1, 64, D, seed=131).mul(2).round()
    k = kb.repeat(1, 1, 40, 1)
    v = rnd(1, 1, T, D, seed=132)
    cfg = cfg_of(D, 0.25, "pisa", band=1)
    st = stats.block_stats(q, k, v, cfg)
    idx, vbias = stats.route(st, cfg, q.dtype)
    n, kk = 40, cfg.budget(40)
    ok_size, ok_forced, ok_lowest = True, True, True
    for i in range(n):
        row = [int(x) for x in idx[0, 0, i] if x >= 0]
        forced = [j for j in range(n) if abs(i - j) <= 1]
        ok_size &= len(row) == max(kk, len(forced)) and row == sorted(row)
        ok_forced &= all(j in row for j in forced)
        rest = [j for j in range(n) if j not in forced][:len(row) - len(forced)]
        ok_lowest &= sorted(forced + rest) == row
    exact_ok = bool(torch.equal(vbias[0, 0] == float("-inf"),
                                torch.zeros(n, n, dtype=torch.bool).scatter_(1, idx[0, 0].clamp(min=0).long(), True)))
    return {"size": ok_size, "forced": ok_forced, "lowest": ok_lowest, "bias_marks_exact": exact_ok}


@case("vt_peel_equals_the_plain_virtual_loop")
def _():
    # PSA_TRITON_VT_PEEL: the virtual tiles of whole blocks below the last one in a loop of their own (log2(64) in the
    # logits, no masks, no counts). BLOCK_V 16 so small problems have such tiles: T 1100 = 18 blocks (one whole tile,
    # then blocks 16-17 with a 12-token last one), 2112 = 33 (two, then the last block alone), 1024 = 16 (none: the
    # last block is in the first tile, so the peel changes nothing)
    config = dict(BLOCK_N=64, BLOCK_V=16, USE_TMA=False, num_warps=4, num_stages=1)
    out, env0 = {}, os.environ.get("PSA_TRITON_VT_PEEL")
    try:
        for T in (1100, 2112, 1024):
            for variant in ("pwt", "pisa"):
                q, k, v = (rnd(1, 1, T, 64, seed=150 + s) for s in range(3))
                cfg = cfg_of(64, 0.125, variant, band=1)
                q64, k64, v64 = q.double(), k.double(), v.double()
                st = block_stats(q64, k64, v64, cfg.block_size, need_hnorm=cfg.cov_bias)
                r = route(st, cfg)
                ref = reference.forward(q64, k64, v64, cfg, routing=r, stats=st)
                os.environ["PSA_TRITON_VT_PEEL"] = "0"
                plain = kt.forward_with_routing(q, k, v, cfg, r, config=config)
                os.environ["PSA_TRITON_VT_PEEL"] = "1"
                peel = kt.forward_with_routing(q, k, v, cfg, r, config=config)
                out[f"T{T}_{variant}"] = {"rel_ref": rel(peel, ref), "rel_plain": rel(peel, plain),
                                          "plain_rel_ref": rel(plain, ref), "finite": bool(torch.isfinite(peel).all())}
    finally:
        if env0 is None:
            os.environ.pop("PSA_TRITON_VT_PEEL", None)
        else:
            os.environ["PSA_TRITON_VT_PEEL"] = env0
    return out


@case("custom_op_opcheck")
def _():
    q, k, v = (rnd(1, 1, 64, 64, seed=90 + s) for s in range(3))
    out = {}
    for bthd in (False, True):  # the fake output's strides must match the real one's in both layouts
        args = (q, k, v, 0.5, "pwt", 1, 0, False, 64, 0.125, None, 0, bthd)
        res = torch.library.opcheck(torch.ops.psa.triton_fwd.default, args,
                                    test_utils=("test_schema", "test_faketensor"))
        out.update({f"{k2}_bthd{int(bthd)}": str(v2) for k2, v2 in res.items()})
    return out


@case("out_layout_bthd")
def _():
    # out_layout="bthd" (kernels/layout.py): the same values, written with their memory in [B, T, H, D] order, on
    # every path that allocates the output (heads, the Morton gather with this backend's attention, a caller's
    # [B, L, H, D] view), so the node's flat [B, L, H*D] is a view
    from kernels import piecewise_sparse_attention as psa
    from kernels.layout import is_bthd
    res = {}
    B, H, T, D = 2, 2, 130, 64
    q, k, v = (rnd(B, H, T, D, seed=95 + s) for s in range(3))
    grid = (2, 8, 8)
    for name, kw in (("plain", {}), ("morton", dict(reorder="morton", grid=grid, n_prefix=T - 128))):
        base = psa(q, k, v, density=0.3, backend="triton", on_failure="raise", **kw)
        out = psa(q, k, v, density=0.3, backend="triton", on_failure="raise", out_layout="bthd", **kw)
        flat = out.transpose(1, 2).reshape(B, T, H * D)
        res[name] = {"equal": bool(torch.equal(out, base)), "bthd": is_bthd(out), "base_bthd": is_bthd(base),
                     "flat_is_view": flat.data_ptr() == out.data_ptr() and flat._base is not None}
    blhd = torch.randn(B, T, H, D).transpose(1, 2)  # ComfyUI's [B, L, H*D] seen as [B, H, L, D]
    out = psa(blhd, blhd, blhd, density=0.3, backend="triton", on_failure="raise")
    res["caller_view_default"] = {"bthd": is_bthd(out)}
    ref = psa(q, k, v, density=0.3, backend="torch", out_layout="bthd")
    res["torch_backend"] = {"bthd": is_bthd(ref), "equal": bool(torch.equal(ref, psa(q, k, v, density=0.3,
                                                                                     backend="torch")))}
    return res


@case("unavailable_reasons")
def _():
    cfg = cfg_of(64, 0.2, "pwt")
    return {"head_dim_80": kt.unavailable_reason(torch.zeros(1, 1, 8, 80), cfg),
            "float64": kt.unavailable_reason(torch.zeros(1, 1, 8, 64, dtype=torch.float64), cfg),
            "block_size_32": kt.unavailable_reason(torch.zeros(1, 1, 8, 64),
                                                   SparseConfig(block_size=32, scale=0.125)),
            "ok": kt.unavailable_reason(torch.zeros(1, 1, 8, 64), cfg), "available": kt.available(),
            "fwd_interpret": fwd._INTERPRET}


@case("nan_query_token_stays_in_its_row")
def _():
    # one NaN query token: dense attention poisons only its row; PWT's q^2 block mean must not spread it
    q, k, v = (rnd(1, 1, 256, 64, seed=100 + s) for s in range(3))
    q[0, 0, 5, 3] = float("nan")
    cfg = cfg_of(64, 0.25, "pwt", band=0)
    st = stats.block_stats(q, k, v, cfg)
    out = {}
    for name, (idx, vbias) in (("route_kernel", stats.route(st, cfg, q.dtype)),
                               ("route_torch", stats.route_torch(st, cfg, q.dtype))):
        o = torch.empty_like(q)
        fwd.attention(q, k, v, o, st, idx, vbias.contiguous(), cfg)
        bad = ~torch.isfinite(o).all(-1)
        out[name] = {"bad_rows": int(bad.sum()), "row5_bad": bool(bad[0, 0, 5])}
    return out


@case("api_morton_prefix_batch2_transposed_views")
def _():
    # the api's gather_tokens hook: B = 2, text prefix, q/k/v as [B, L, H, D] -> [B, H, L, D] views
    from kernels import dispatch, piecewise_sparse_attention as psa
    grid, npre = (3, 8, 8), 9
    T = npre + math.prod(grid)
    q, k, v = (rnd(2, T, 2, 64, seed=110 + s).transpose(1, 2) for s in range(3))
    kw = dict(density=0.25, variant="pwt", band=0, reorder="morton", grid=grid, n_prefix=npre)
    out = psa(q, k, v, backend="triton", **kw)
    ref = psa(q.double(), k.double(), v.double(), backend="torch", **kw)
    cfg = cfg_of(64, 0.25, "pwt", band=0)
    return {"rel": rel(out, ref), "shape_ok": out.shape == q.shape,
            "backend": dispatch.select_backend(q, cfg, "triton")[0],
            "fell_back": sorted(x for x in dispatch._logged if x.startswith(("fail:", "gather:")))}


@case("bfloat16_under_interpreter")
def _():
    # the interpreter's tl.dot is wrong on bfloat16: the backend must decline, not return garbage
    q = rnd(1, 1, 64, 64, seed=120, dtype=torch.bfloat16)
    return {"reason": kt.unavailable_reason(q, cfg_of(64, 0.5, "drop")),
            "float16_ok": kt.unavailable_reason(q.half(), cfg_of(64, 0.5, "drop")) is None}


@case("route_gluon_dispatch_falls_back")
def _():
    # route() with the Gluon scores (route_gl, PSA_ROUTE_GLUON) taken: when the launch fails, the Triton scores kernel
    # runs as without the switch; when it runs (a stand-in with its contract: no H-bar reduction), H-bar comes from
    # route._final_hbar_kernel. Lists, bias rows and H-bar equal the plain path's either way (Gluon cannot run here)
    from kernels.triton import route as kr
    from kernels.triton import route_gl
    q, k, v = (rnd(1, 3, 700, 128, seed=130 + s) for s in range(3))
    cfg = cfg_of(128, 0.3, "pwt", band=1, sinks=1)
    outs, calls = {}, []
    usable, scores = route_gl.usable, route_gl.scores

    def stand_in(st, score, vbias, *, n, hc, h0, hs, band, n_sink, scale, half_s2, ln_b, pwt):
        # a launch that succeeds, with the Gluon kernel's contract: the scores without H-bar's reduction (here the
        # Triton kernel's, FINAL_H off), so H-bar comes from route._final_hbar_kernel alone
        calls.append(("ok", h0))
        d = st.kbar
        kr._scores_kernel[(-(-n // 64), -(-n // 64), hs)](
            st.qbar, st.kbar, st.q2, st.ksig2, d, score, vbias, d, d, d, n, 0, hc, h0, hs, band, n_sink, scale,
            half_s2, ln_b, 1.0 / n, D=128, BM=64, BN=64, DK=16, PWT=pwt, COV=False, FINAL_H=False, PREC="ieee",
            SPLIT=0, OFF64=0)
        return True

    for arm in ("plain", "fails", "runs"):
        st = stats.block_stats(q, k, v, cfg)
        if arm != "plain":
            route_gl.usable = lambda *a: True
            route_gl.scores = stand_in if arm == "runs" else (lambda *a, **kw: calls.append(("fail", kw["h0"])))
        try:
            idx, vb = kr.route(st, cfg, q.dtype, score_bytes=2 * 4 * 11 * 11)  # two heads per score sub-chunk
        finally:
            route_gl.usable, route_gl.scores = usable, scores
        outs[arm] = (idx, vb, st.hbar, st.hbar_lp)
    eq = {arm: all(torch.equal(a, b) for a, b in zip(outs["plain"], outs[arm])) for arm in ("fails", "runs")}
    return {"fails_equal": eq["fails"], "runs_equal": eq["runs"], "gluon_calls": calls,
            "usable_off": route_gl.usable(st, cfg, "bf16x3")}


print("RESULTS_JSON " + json.dumps(RES))

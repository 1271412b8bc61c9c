"""The one-pass statistics (kernels/triton/stats_h.py) under TRITON_INTERPRET=1 on CPU, at tiny sizes, against the
two-pass kernels (PSA_STATS_H=0: statistics kernel + H-sum pass) and the float64 reference; prints one JSON line.
Run by tests/test_stats_h_interpret.py in a subprocess (TRITON_INTERPRET must be set before Triton is imported)."""
import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from kernels.reorder import apply_reorder  # noqa: E402
from kernels.routing import block_stats as ref_stats  # noqa: E402
from kernels.triton import stats, stats_h  # noqa: E402
from interp_common import case_recorder, cfg_of, rel, rnd  # noqa: E402

RES = {}
case = case_recorder(RES)
FIELDS = ("kbar", "qbar", "q2", "ksig2", "kbar_lp", "vmean_lp", "hbar", "hnorm")


def run(one_pass, q, k, v, cfg, **kw):
    os.environ["PSA_STATS_H"] = "1" if one_pass else "0"
    try:
        st = stats.block_stats(q, k, v, cfg, **kw)
    finally:
        os.environ.pop("PSA_STATS_H", None)
    stats.finalize_hbar(st, st.kbar.shape[-2], q.dtype)
    return st


def diffs(a, b):
    """largest |a - b| / max |b| per field both hold"""
    out = {}
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        if x is not None and y is not None:
            out[f] = float((x.double() - y.double()).abs().max() / y.double().abs().max().clamp_min(1e-30))
    return out


@case("one_pass_equals_two_passes")
def _():
    # B2 H2, T not a multiple of 64 (the last block's padding rows), D 64 and 128, every variant that needs H,
    # the three dtypes, raster and the Morton gathers (k, v copies; q too)
    out = {}
    T = 64 * 4 + 37
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(7)).to(torch.int32)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for D, variant, cov in ((64, "pwt", False), (128, "pwt", False), (64, "pisa", True)):
            q, k, v = (rnd(2, 2, T, D, seed=s, dtype=dt) for s in range(3))
            cfg = cfg_of(D, 0.3, variant, cov=cov)
            key = f"{str(dt)[6:]}_D{D}_{variant}{'_cov' if cov else ''}"
            one, two = run(True, q, k, v, cfg), run(False, q, k, v, cfg)
            out[key] = diffs(one, two)
            out[key]["hpart_parts"] = int(one.hpart.shape[2])
            if D == 64 and dt != torch.float16:
                for with_q in (False, True):
                    g1 = [torch.zeros_like(q) for _ in range(3)]
                    g2 = [torch.zeros_like(q) for _ in range(3)]
                    one = run(True, q, k, v, cfg, perm=perm, gathered=(g1[0] if with_q else None, g1[1], g1[2]))
                    two = run(False, q, k, v, cfg, perm=perm, gathered=(g2[0] if with_q else None, g2[1], g2[2]))
                    d = diffs(one, two)
                    d["copies_equal"] = all(torch.equal(a, b) for a, b in zip(g1, g2))
                    d["copies_are_the_permuted_inputs"] = all(
                        torch.equal(g, apply_reorder(x, perm.long())) for g, x in zip(g1[int(not with_q):],
                                                                                     (q, k, v)[int(not with_q):]))
                    out[f"{key}_gather{'_q' if with_q else ''}"] = d
    return out


@case("gather_from_copies_only_the_tail")
def _():
    # the cube order's copies (block_stats gather_from): rows from 128 on only, in copies of T - 128 rows; the
    # statistics as with every row copied; both kernels, with and without q's copy, bf16 and float32
    T = 64 * 4 + 37
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(11)).to(torch.int32)
    out = {}
    for dt in (torch.float32, torch.bfloat16):
        q, k, v = (rnd(1, 2, T, 64, seed=40 + s, dtype=dt) for s in range(3))
        cfg = cfg_of(64, 0.3, "pwt")
        for one_pass in (True, False):
            for with_q in (False, True):
                full = [torch.zeros_like(q) for _ in range(3)]
                tail = [torch.zeros(1, 2, T - 128, 64, dtype=dt) for _ in range(3)]
                a = run(one_pass, q, k, v, cfg, perm=perm, gathered=(full[0] if with_q else None, full[1], full[2]))
                b = run(one_pass, q, k, v, cfg, perm=perm, gathered=(tail[0] if with_q else None, tail[1], tail[2]),
                        gather_from=128)
                d = diffs(b, a)
                lo = int(not with_q)
                d["tails_are_the_permuted_rows"] = all(torch.equal(t, apply_reorder(x, perm.long())[:, :, 128:])
                                                       for t, x in zip(tail[lo:], (q, k, v)[lo:]))
                out[f"{str(dt)[6:]}_{'one' if one_pass else 'two'}{'_q' if with_q else ''}"] = d
    return out


@case("programs_per_head_split_the_same_sum")
def _():
    # 6 blocks over 1, 2, 3 (G 2) and 4 (G 2 -> 3 programs) programs per head: the same statistics and H-bar
    q, k, v = (rnd(1, 2, 64 * 5 + 9, 64, seed=20 + s) for s in range(3))
    cfg = cfg_of(64, 0.3, "pwt")
    keep = stats_h.STATS_H_PARTS
    out = {}
    try:
        stats_h.STATS_H_PARTS = 1
        base = run(True, q, k, v, cfg)
        for p in (2, 3, 4):
            stats_h.STATS_H_PARTS = p
            st = run(True, q, k, v, cfg)
            out[f"P{p}"] = {"parts": int(st.hpart.shape[2]), **diffs(st, base)}
    finally:
        stats_h.STATS_H_PARTS = keep
    return out


@case("offset_keys_keep_hbar_and_sigma2_accurate")
def _():
    # a common key offset of 8 (|kbar| >> the spread): the raw K^T V minus its correction and sigma^2 around one
    # key row must still match float64
    q, k, v = (rnd(1, 2, 64 * 3 + 5, 64, seed=30 + s) for s in range(3))
    k = k + 8.0
    cfg = cfg_of(64, 0.3, "pwt")
    ref = ref_stats(q.double(), k.double(), v.double(), 64)
    st = run(True, q, k, v, cfg)
    return {"hbar_rel": rel(st.hbar, ref.hbar), "ksig2_rel": rel(st.ksig2, ref.ksig2), "q2_rel": rel(st.q2, ref.q2),
            "kbar_rel": rel(st.kbar, ref.kbar)}


@case("non_finite_blocks_drop_only_their_h")
def _():
    # an inf key in block 1, a NaN value in block 3 (of 5, T ragged), one head clean: H-bar is the float64 sum of
    # the finite blocks' H_j over all N (the slow path of the program that holds them), the clean head is
    # untouched, and only the poisoned blocks' own statistics are non-finite
    T, D = 64 * 4 + 20, 64
    q, k, v = (rnd(1, 2, T, D, seed=40 + s) for s in range(3))
    k[0, 0, 64 + 5, 3] = float("inf")
    v[0, 0, 3 * 64 + 2, 7] = float("nan")
    cfg = cfg_of(D, 0.3, "pwt")
    ref = ref_stats(q.double(), k.double(), v.double(), 64)
    out = {}
    keep = stats_h.STATS_H_PARTS
    try:
        for p in (1, 2):
            stats_h.STATS_H_PARTS = p
            st = run(True, q, k, v, cfg)
            fin_k = torch.isfinite(st.kbar).all(-1)[0, 0].tolist()
            fin_v = torch.isfinite(st.vmean_lp).all(-1)[0, 0].tolist()
            out[f"P{p}"] = {"hbar_finite": bool(torch.isfinite(st.hbar).all()),
                            "hbar_rel": rel(st.hbar, ref.hbar),
                            "kbar_finite_per_block": fin_k, "vmean_finite_per_block": fin_v,
                            "clean_head_ksig2_finite": bool(torch.isfinite(st.ksig2[0, 1]).all())}
    finally:
        stats_h.STATS_H_PARTS = keep
    return out


@case("redo_flagged_programs_only")
def _():
    # stats_h.redo_flagged (the Gluon kernels' fix-up): only the flagged (head, program) is written, and it equals
    # the normal launch's output there; raster, and the Morton gather with its three copies. bf16, B1 H2, 3 programs
    out = {}
    B, H, T, D = 1, 2, 64 * 5 + 9, 64
    n = -(-T // 64)
    q, k, v = (rnd((B, H, T, D), dtype=torch.bfloat16, seed=s) for s in range(3))
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(3)).to(torch.int32)
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2))
    for mode in ("raster", "gather"):
        gather = mode == "gather"
        copies = torch.zeros(3, B, H, T, D, dtype=torch.bfloat16) if gather else None
        g_args = ((copies[0], copies[1], copies[2], copies.stride(1), copies.stride(2), copies.stride(3),
                   copies.stride(1), copies.stride(2), copies.stride(3)) if gather else (q, k, v, 0, 0, 0, 0, 0, 0))
        pm = perm if gather else q
        st32, lp, hp = stats_h.stats_with_h(q, k, v, pm, strides, g_args, n=n, bs=64, need_pwt=True, has_perm=gather,
                                            gather=gather, gather_q=gather, parts=3)
        want = copies.clone() if gather else None
        if gather:
            copies.fill_(7.0)
        st32b, lpb, hpb = torch.full_like(st32, 7.0), torch.full_like(lp, 7.0), torch.full_like(hp, 7.0)
        flag = torch.zeros(B, H, hp.shape[2], dtype=torch.int32)
        flag[0, 1, 1] = 1
        stats_h.redo_flagged(q, k, v, pm, strides, g_args, st32b, lpb, hpb, flag, n=n, bs=64, need_pwt=True,
                             gathered=gather, gather_q=gather)
        g = -(-n // hp.shape[2])
        sel = torch.zeros(B, H, n, dtype=torch.bool)
        sel[0, 1, g:2 * g] = True
        d = {"st32_flagged_equal": bool(torch.equal(st32b[:, sel], st32[:, sel])),
             "lp_flagged_equal": bool(torch.equal(lpb[:, sel], lp[:, sel])),
             "hpart_flagged_equal": bool(torch.equal(hpb[0, 1, 1], hp[0, 1, 1])),
             "others_untouched": bool((st32b[:, ~sel] == 7.0).all() and (lpb[:, ~sel] == 7.0).all()
                                      and (hpb[0, 0] == 7.0).all() and (hpb[0, 1, 0] == 7.0).all()
                                      and (hpb[0, 1, 2:] == 7.0).all())}
        if gather:  # the flagged program's rows of the copies, and nothing else
            rows = torch.zeros(T, dtype=torch.bool)
            rows[g * 64:min(2 * g * 64, T)] = True
            d["copies_flagged_equal"] = bool(torch.equal(copies[:, 0, 1][:, rows], want[:, 0, 1][:, rows]))
            d["copies_others_untouched"] = bool((copies[:, 0, 1][:, ~rows] == 7.0).all()
                                                and (copies[:, 0, 0] == 7.0).all())
        out[mode] = d
    return out


print("RESULTS_JSON " + json.dumps(RES))

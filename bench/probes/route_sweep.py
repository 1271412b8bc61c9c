"""H200 probe: the routing kernels (kernels/triton/route.py) at Wan2.1-14B 480p / 720p and FLUX.1 1024^2 (random
bf16, B1 D128, pwt at d 0.125 / 0.2, band 1), on precomputed statistics, for each build of the scores kernel:

* the dots' precision (route.SCORE_PREC: "tf32x3", "bf16x3", "tf32"), D slice, warps, load stages, a register
  cap (maxnreg: more programs per SM), int64 offset tiles or int32 offsets, the tile; the select's register cap;
* `route_ms`: the whole route() (scores + select + the H-bar reduction, H-bar reset before each call as
  bench/pieces.py does), `scores_ms`: the same with the select launches skipped (select = the difference);
  medians of triton.testing.do_bench, every build timed twice in alternated rounds;
* against "tf32x3" (float32-accurate; the default before session 13): rows whose exact lists differ and, over those rows, the largest
  float64 score gap of a swap (the best score a build left out minus the worst it took, in units of the row's
  score spread), and the largest difference of the virtual-token bias outside the exact sets.

Prints `RESULT {...}` last.    python bench/probes/route_sweep.py [--quick]
"""
import json
import math
import statistics
import sys

import torch
import triton

sys.path.insert(0, ".")
from kernels.config import SparseConfig  # noqa: E402
from kernels.triton import route as kr  # noqa: E402
from kernels.triton import select as ks  # noqa: E402
from kernels.triton import stats as kts  # noqa: E402


QUICK = "--quick" in sys.argv
SHAPES = [("wan14_720", 75600, 40, 0.125), ("wan14", 32760, 40, 0.125), ("flux", 4608, 24, 0.2)]
# knobs: prec, DK, warps, stages, maxnreg, int64 offset tiles, BM, BN (route.SCORE_*), the select's register cap
KNOBS = ("SCORE_PREC", "SCORE_DK", "SCORE_WARPS", "SCORE_STAGES", "SCORE_MAXNREG", "SCORE_OFF64", "SCORE_BM",
         "SCORE_BN")
SKNOBS = ("SELECT_MAXNREG",)
BASE = dict(SCORE_PREC="tf32x3", SCORE_DK=128, SCORE_WARPS=4, SCORE_STAGES=1, SCORE_MAXNREG=None, SCORE_OFF64=False,
            SCORE_BM=64, SCORE_BN=64, SELECT_MAXNREG=None)
BUILDS = [("tf32x3", BASE), ("tf32x3_off64", dict(BASE, SCORE_OFF64=True)),
          ("bf16x3", dict(BASE, SCORE_PREC="bf16x3")),
          ("bf16x3_off64", dict(BASE, SCORE_PREC="bf16x3", SCORE_OFF64=True)),
          ("bf16x3_sr80", dict(BASE, SCORE_PREC="bf16x3", SELECT_MAXNREG=80)),
          ("bf16x3_sr96", dict(BASE, SCORE_PREC="bf16x3", SELECT_MAXNREG=96)),
          ("bf16x3_off64_sr80", dict(BASE, SCORE_PREC="bf16x3", SCORE_OFF64=True, SELECT_MAXNREG=80))]
if QUICK:
    BUILDS = BUILDS[:4]


def setb(b):
    for kk in KNOBS:
        setattr(kr, kk, b[kk])
    for kk in SKNOBS:
        setattr(ks, kk, b[kk])


def name(b):
    return b


def ms(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def main():
    torch.manual_seed(0)
    keep = {kk: getattr(kr, kk) for kk in KNOBS}
    keep.update({kk: getattr(ks, kk) for kk in SKNOBS})
    sel = kr._select
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    for label, T, H, dens in SHAPES:
        q, k, v = (torch.randn(1, H, T, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        cfg = SparseConfig(density=dens, variant="pwt", band=1, n_sink_blocks=0, cov_bias=False, scale=128 ** -0.5)
        st = kts.block_stats(q, k, v, cfg)
        del q, k, v

        def route_once():
            st.hbar_ready = False
            return kr.route(st, cfg, torch.bfloat16)

        d = res.setdefault(label, {})
        lists = {}
        for nm, b in BUILDS:
            setb(b)
            try:
                idx, vb = route_once()
                torch.cuda.synchronize()
                lists[nm] = (idx.clone(), vb.clone())
            except Exception as e:  # noqa: BLE001
                d[nm + "_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        ok = [(nm, b) for nm, b in BUILDS if nm in lists]
        for rnd in range(2):
            for nm, b in (ok if rnd == 0 else ok[::-1]):
                setb(b)
                d.setdefault(nm + "_route_ms", []).append(round(ms(route_once), 4))
                kr._select = lambda *a, **kw: None
                try:
                    d.setdefault(nm + "_scores_ms", []).append(round(ms(route_once), 4))
                finally:
                    kr._select = sel
            print(label, "round", rnd, {kk: vv for kk, vv in d.items() if kk.endswith("_ms")}, flush=True)
        # agreement with the float32-accurate build, scored in float64
        base = "tf32x3"
        if base in lists:
            s64 = (st.qbar.double() @ st.kbar.double().transpose(-1, -2)) * cfg.scale
            w64 = (st.q2.double() @ st.ksig2.double().transpose(-1, -2)) * 0.5 * cfg.scale ** 2
            s64 = s64 + w64.clamp(max=math.log(64))
            spread = s64.std(-1)
            ia, va = lists[base]
            ea = va == float("-inf")
            for nm, (ib, vb) in lists.items():
                if nm == base:
                    continue
                eb = vb == float("-inf")
                rows = (ea != eb).any(-1)
                gap = 0.0
                if rows.any():
                    only_a = torch.where(ea & ~eb, s64, float("-inf")).amax(-1)  # best left out by b
                    only_b = torch.where(eb & ~ea, s64, float("inf")).amin(-1)  # worst taken by b
                    g = ((only_a - only_b) / spread)[rows]
                    gap = float(g.max())
                both = ~ea & ~eb
                d[nm + "_vs_base"] = {"rows_differ": int(rows.sum()), "rows": int(rows.numel()),
                                      "max_gap_in_spread": gap,
                                      "bias_maxdiff": float((va.float() - vb.float())[both].abs().max())}
            print(label, {kk: vv for kk, vv in d.items() if kk.endswith("_vs_base")}, flush=True)
        del st, lists
        torch.cuda.empty_cache()
    setb(keep)
    for sh in res.values():
        if isinstance(sh, dict):
            for kk, vv in list(sh.items()):
                if kk.endswith("_ms") and isinstance(vv, list):
                    sh[kk] = statistics.median(vv) if len(vv) > 2 else round(sum(vv) / len(vv), 4)
    print("RESULT " + json.dumps(res), flush=True)


main()

"""H200 probe (session 25): the routing scores on operand parts split once per call (route.score_presplit,
`_split_kernel` + `_score_tile_pre`) against the default (each tile splits its float32 operands into bfloat16 hi / lo
itself). Nsight Compute (B38, 720p) put 20% of the scores kernel's stall samples on F2F.BF16.F32: every tile converts
4 x 64 x 128 x 2 values at 16 conversions per clock per SM.

Wan2.1-14B 720p / 480p and FLUX.1 1024^2 (random bf16, B1 D128, pwt d 0.125 / 0.2, band 1) on precomputed statistics;
route() with the score budget the forward uses (kernels.triton.score_budget); `route_ms` the whole routing,
`scores_ms` the same with the select launches skipped (for the presplit builds: the split kernel + the scores).
Builds alternate in PROBE_ROUNDS rounds (default 5), medians of triton.testing.do_bench; lists and bias rows compared
bitwise with the default's. Prediction: the 720p scores ~0.50 -> ~0.30 ms, routing ~0.98 -> ~0.78.
Prints `RESULT {...}` last.    python bench/probes/score_presplit.py"""
import json
import os
import statistics
import sys

import torch
import triton

sys.path.insert(0, ".")
from kernels import triton as kt  # noqa: E402
from kernels.config import SparseConfig  # noqa: E402
from kernels.triton import route as kr  # noqa: E402
from kernels.triton import stats as kts  # noqa: E402

ROUNDS = int(os.environ.get("PROBE_ROUNDS", "5"))
SHAPES = [("wan14_720", 75600, 40, 0.125), ("wan14", 32760, 40, 0.125), ("flux", 4608, 24, 0.2)]
# (name, PSA_SCORE_PRESPLIT, SCORE_PRE_DK, SCORE_PRE_WARPS, SCORE_PRE_STAGES)
BUILDS = [("default", "0", 32, 8, 3), ("pre_dk32_w8_s3", "1", 32, 8, 3), ("pre_dk64_w8_s2", "1", 64, 8, 2),
          ("pre_dk128_w8", "1", 128, 8, 1), ("pre_dk128_w4", "1", 128, 4, 1)]


def setb(b):
    os.environ["PSA_SCORE_PRESPLIT"] = b[1]
    kr.SCORE_PRE_DK, kr.SCORE_PRE_WARPS, kr.SCORE_PRE_STAGES = b[2], b[3], b[4]


def ms(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def main():
    torch.manual_seed(0)
    sel = kr._select
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "rounds": ROUNDS}
    for label, T, H, dens in SHAPES:
        q, k, v = (torch.randn(1, H, T, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        cfg = SparseConfig(density=dens, variant="pwt", band=1, n_sink_blocks=0, cov_bias=False, scale=128 ** -0.5)
        budget = kt.score_budget(q.numel() * q.element_size())
        st = kts.block_stats(q, k, v, cfg)
        del q, k, v

        def route_once():
            st.hbar_ready = False
            return kr.route(st, cfg, torch.bfloat16, score_bytes=budget)

        d = res.setdefault(label, {"score_bytes": budget})
        out = {}
        for b in BUILDS:
            setb(b)
            try:
                idx, vb = route_once()
                torch.cuda.synchronize()
                out[b[0]] = (idx.clone(), vb.clone())
            except Exception as e:  # noqa: BLE001
                d[b[0] + "_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        ok = [b for b in BUILDS if b[0] in out]
        for b in ok[1:]:
            d[b[0] + "_equal"] = bool(torch.equal(out[b[0]][0], out["default"][0])
                                      and torch.equal(out[b[0]][1], out["default"][1]))
        for rnd in range(ROUNDS):
            for b in (ok if rnd % 2 == 0 else ok[::-1]):
                setb(b)
                d.setdefault(b[0] + "_route_ms", []).append(round(ms(route_once), 4))
                kr._select = lambda *a, **kw: None
                try:
                    d.setdefault(b[0] + "_scores_ms", []).append(round(ms(route_once), 4))
                finally:
                    kr._select = sel
        for kk, vv in list(d.items()):
            if kk.endswith("_ms"):
                d[kk + "_median"] = statistics.median(vv)
        if "default_route_ms" in d:
            for b in ok[1:]:
                d[b[0] + "_route_faster_rounds"] = sum(
                    x < y for x, y in zip(d[b[0] + "_route_ms"], d["default_route_ms"]))
        print(label, {kk: vv for kk, vv in d.items() if not kk.endswith("_ms")}, flush=True)
        del st, out
        torch.cuda.empty_cache()
    os.environ.pop("PSA_SCORE_PRESPLIT", None)
    print("RESULT " + json.dumps(res), flush=True)


main()

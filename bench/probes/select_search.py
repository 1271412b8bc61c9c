"""H200 probe: the routing select's threshold search, one bit per step ("bits") against interpolation ("interp",
kernels/triton/select.py _search_interp, PSA_SELECT_INTERP), on precomputed statistics (bf16, B1 D128, pwt, band 1):
Wan2.1-14B 480p / 720p at d 0.125 on random and DiT-like inputs (kernels/synthetic.py at full size, 40 heads) and
FLUX.1 1024^2 (24 heads, d 0.2, 8 sink blocks). Per shape: both searches' lists and bias rows compared bitwise
(they must be equal: the search changes the path, not the threshold's set), then PROBE_ROUNDS (default 5)
alternated rounds of `route_ms` (the whole route(): scores + select + H-bar, H-bar reset before each call, as
bench/pieces.py times routing) and `scores_ms` (the same with the select launches skipped; select = the
difference). Prints `RESULT {...}` last.

    python bench/probes/select_search.py
"""
import json
import os
import statistics
import sys

import torch
import triton

sys.path.insert(0, ".")
from kernels.config import SparseConfig  # noqa: E402
from kernels.synthetic import dit_like_qkv  # noqa: E402
from kernels.triton import route as kr  # noqa: E402
from kernels.triton import select as ks  # noqa: E402
from kernels.triton import stats as kts  # noqa: E402

ROUNDS = int(os.environ.get("PROBE_ROUNDS", "5"))
# (name, T or grid, heads, density, sink blocks, DiT-like)
SHAPES = [("wan14", 32760, 40, 0.125, 0, False), ("wan14_720", 75600, 40, 0.125, 0, False),
          ("wan14_dit", (21, 30, 52), 40, 0.125, 0, True), ("wan14_720_dit", (21, 45, 80), 40, 0.125, 0, True),
          ("flux", 4608, 24, 0.2, 8, False)]
MODES = ("bits", "interp")


def ms(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median")


def inputs(tg, H, dit):
    if dit:
        q, k, v = dit_like_qkv(tg, heads=H, head_dim=128)
        return (x.to("cuda", torch.bfloat16) for x in (q, k, v))
    return (torch.randn(1, H, tg, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))


def main():
    torch.manual_seed(0)
    keep = ks.SELECT_INTERP
    sel = kr._select
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "rounds": ROUNDS}
    try:
        for label, tg, H, dens, sinks, dit in SHAPES:
            q, k, v = inputs(tg, H, dit)
            cfg = SparseConfig(density=dens, variant="pwt", band=1, n_sink_blocks=sinks, cov_bias=False,
                               scale=128 ** -0.5)
            st = kts.block_stats(q, k, v, cfg)
            del q, k, v

            def route_once():
                st.hbar_ready = False
                return kr.route(st, cfg, torch.bfloat16)

            d = res.setdefault(label, {"n_blocks": int(st.kbar.shape[-2])})
            out = {}
            for m in MODES:
                ks.SELECT_INTERP = m == "interp"
                idx, vb = route_once()
                torch.cuda.synchronize()
                out[m] = (idx.clone(), vb.clone())
            d["idx_equal"] = bool(torch.equal(out["bits"][0], out["interp"][0]))
            d["bias_equal"] = bool(torch.equal(out["bits"][1], out["interp"][1]))
            del out
            for r in range(ROUNDS):
                for m in (MODES if r % 2 == 0 else MODES[::-1]):
                    ks.SELECT_INTERP = m == "interp"
                    d.setdefault(f"{m}_route_ms", []).append(round(ms(route_once), 4))
                    kr._select = lambda *a, **kw: None
                    try:
                        d.setdefault(f"{m}_scores_ms", []).append(round(ms(route_once), 4))
                    finally:
                        kr._select = sel
            for m in MODES:
                d[f"{m}_route_median_ms"] = statistics.median(d[f"{m}_route_ms"])
                d[f"{m}_select_median_ms"] = round(statistics.median(
                    a - b for a, b in zip(d[f"{m}_route_ms"], d[f"{m}_scores_ms"])), 4)
            d["interp_faster_rounds"] = sum(a < b for a, b in zip(d["interp_route_ms"], d["bits_route_ms"]))
            print(label, json.dumps(d), flush=True)
            del st
            torch.cuda.empty_cache()
    finally:
        ks.SELECT_INTERP = keep
    print("RESULT " + json.dumps(res), flush=True)


main()

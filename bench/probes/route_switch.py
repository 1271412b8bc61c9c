"""H200 probe: a routing environment switch (PSA_...=0 vs 1) on route() alone, on precomputed statistics, at
Wan2.1-14B 720p / 480p and FLUX.1 1024^2 (random bf16, B1 D128, pwt d 0.125 / 0.2, band 1),
with the score budget the forward uses (kernels.triton.score_budget). `route_ms` the whole routing, `scores_ms` the
same with the select launches skipped (select = the difference); medians of triton.testing.do_bench in PROBE_ROUNDS
(default 5) alternated rounds, the lists and bias rows compared bitwise between the two settings.

Session 25 built it for PSA_SCORE_PAD (the scores' rows padded to 64 floats; bitwise equal, no faster: dropped,
bench/results/route_pad_s25_h200.txt); the switch before it, PSA_SCORE_PRESPLIT (a one-off probe), is recorded in
bench/results/score_presplit_s25_h200.txt. Any on/off routing switch can be timed with it (PSA_SELECT_INTERP).
Prints `RESULT {...}` last.

    python bench/probes/route_switch.py PSA_SCORE_PAD"""
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

SWITCH = sys.argv[1]
ROUNDS = int(os.environ.get("PROBE_ROUNDS", "5"))
SHAPES = [("wan14_720", 75600, 40, 0.125), ("wan14", 32760, 40, 0.125), ("flux", 4608, 24, 0.2)]


def ms(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def main():
    torch.manual_seed(0)
    sel = kr._select
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "switch": SWITCH, "rounds": ROUNDS}
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
        for flag in ("0", "1"):
            os.environ[SWITCH] = flag
            idx, vb = route_once()
            out[flag] = (idx.clone(), vb.clone())
        d["lists_equal"] = bool(torch.equal(out["0"][0], out["1"][0]))
        d["bias_equal"] = bool(torch.equal(out["0"][1], out["1"][1]))
        for rnd in range(ROUNDS):
            for flag in (("0", "1") if rnd % 2 == 0 else ("1", "0")):
                os.environ[SWITCH] = flag
                d.setdefault(f"route_ms_{flag}", []).append(round(ms(route_once), 4))
                kr._select = lambda *a, **kw: None
                try:
                    d.setdefault(f"scores_ms_{flag}", []).append(round(ms(route_once), 4))
                finally:
                    kr._select = sel
        for kk in [kk for kk in d if kk.endswith(("_0", "_1")) and isinstance(d[kk], list)]:
            d[kk + "_median"] = statistics.median(d[kk])
        d["route_faster_rounds"] = sum(b < a for a, b in zip(d["route_ms_0"], d["route_ms_1"]))
        # (the names bench/probes/rule_check.py reads)
        d["op0_median_ms"], d["op1_median_ms"] = d["route_ms_0_median"], d["route_ms_1_median"]
        d["op1_faster_rounds"] = d["route_faster_rounds"]
        print(label, {kk: vv for kk, vv in d.items() if not isinstance(vv, list)}, flush=True)
        del st, out
        torch.cuda.empty_cache()
    os.environ.pop(SWITCH, None)
    print("RESULT " + json.dumps(res), flush=True)


main()

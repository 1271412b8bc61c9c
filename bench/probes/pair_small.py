"""H200 probe (issue 11, session 24): the CuTe pair kernel (two query blocks per CTA, fwd_pair.py) against the one-block
kernel below PAIR_MIN_BLOCKS (512 KV blocks), at the break-even table's image sizes, as the node calls them.

PAIR_MIN_BLOCKS was set in session 7 on the attention alone at 480p / 720p, when small calls were host-bound; since
sessions 13-23 they replay from CUDA graphs (kernels/graphs.py) and CuTe takes them (dispatch: replayed calls), so
their GPU time is what counts: FLUX.1 1024^2 replayed is ~0.25 ms of which the one-block kernel is ~0.17.

Per cell (pwt, backend cute, Morton over a square grid, 512 text tokens first as 8 sink blocks, 24 heads, D 128,
random bf16; graphs on: up to PSA_CUDA_GRAPH_MAX_TOKENS replayed, above it eager): PSA_CUTE_PAIR=0 / 1 alternated over PROBE_ROUNDS rounds (default 3), each a do_bench median, and the two outputs'
relative L2 difference (not bitwise: the pair build's epilogue multiplies by the reciprocal row sum). Prints one line
per cell and `RESULT {...}` last.

    python bench/probes/pair_small.py [--sides 48,64,80,96,128]
"""
import json
import os
import statistics
import sys

import torch
import triton

sys.path.insert(0, ".")
from kernels import graphs  # noqa: E402
from kernels import piecewise_sparse_attention as psa  # noqa: E402

ROUNDS = int(os.environ.get("PROBE_ROUNDS", "3"))
arg = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--sides=")), None)
if "--sides" in sys.argv:
    arg = sys.argv[sys.argv.index("--sides") + 1]
SIDES = [int(x) for x in (arg or "48,64,80,96,128").split(",")]
res = {"rounds": ROUNDS, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
       "triton": triton.__version__, "graph_max_tokens": graphs.max_tokens()}


def rnd(shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g, dtype=torch.float32).to(torch.bfloat16)


for side in SIDES:
    T = 512 + side * side
    q, k, v = (rnd((1, 24, T, 128), s) for s in range(3))
    for density in (0.125, 0.2, 0.3):
        kw = dict(density=density, variant="pwt", n_sink_blocks=8, reorder="morton", grid=(side, side),
                  n_prefix=512, backend="cute", on_failure="raise")
        d = res[f"T{T}_d{density}"] = {"T": T, "blocks": -(-T // 64), "density": density,
                                      "graphed": T <= graphs.max_tokens()}
        outs = {}
        for r in range(ROUNDS):
            for op in ("0", "1"):
                os.environ["PSA_CUTE_PAIR"] = op
                if r == 0:
                    outs[op] = psa(q, k, v, **kw).float()
                d[f"op{op}_r{r}_ms"] = triton.testing.do_bench(lambda: psa(q, k, v, **kw), warmup=25, rep=100)
        for op in ("0", "1"):
            d[f"op{op}_median_ms"] = statistics.median(d[f"op{op}_r{r}_ms"] for r in range(ROUNDS))
        d["pair_faster_rounds"] = sum(d[f"op1_r{r}_ms"] < d[f"op0_r{r}_ms"] for r in range(ROUNDS))
        d["rel_l2"] = float((outs["1"] - outs["0"]).norm() / outs["0"].norm())
        print(f"T {T} ({d['blocks']} blocks) d {density}: one-block {d['op0_median_ms']:.4f} ms, pair "
              f"{d['op1_median_ms']:.4f} ms, pair faster in {d['pair_faster_rounds']} of {ROUNDS}, rel L2 "
              f"{d['rel_l2']:.2e}", flush=True)
        del outs
    graphs.clear()
    del q, k, v
    torch.cuda.empty_cache()
os.environ.pop("PSA_CUTE_PAIR", None)
print("RESULT " + json.dumps(res), flush=True)

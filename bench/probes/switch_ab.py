"""H200 probe: an environment switch at 0 against 1, the whole operator through the public API, alternated over
PROBE_ROUNDS (default 3) rounds in one process, with the largest difference between the two outputs. The switch is
the first argument (a PSA_ variable the kernels read per call; it must be in kernels/graphs.py's key for the FLUX
rows to capture both builds). `--route` also times the routing alone on precomputed statistics at 480p / 720p
(`route_*`, as bench/pieces.py does). Session 11 ran it on two side-stream switches, built for it and removed
after it (bench/results/pieces_h200.md, Session 11): PSA_H_OVERLAP (the H pass beside the routing kernels,
`h_overlap_s11_h200.txt`) and PSA_ROUTE_PIPE (one score sub-chunk's select beside the next sub-chunk's scores,
`route_pipe_s11_h200.txt`). Shapes (pwt, random bf16, B1 D128):

* wan14 / wan14_720: Wan2.1-14B 480p / 720p as the node calls it (reorder="morton" over the [F, H, W] grid, the
  [B, L, H*D] memory seen as [B, H, L, D]), CUDA graphs off (above their token limit anyway);
* wan14_raster: 480p in plain [B, H, T, D] order (the pieces' "full operator" row);
* wan14_none / wan14_720_none (only when PROBE_SHAPES names them): the node's layout with reorder="none", the
  yardstick of Morton's time as the node sees it;
* flux: FLUX.1 1024^2 as the node calls it (512 text tokens first, 8 sink blocks, d 0.2, Morton over 64 x 64,
  out_layout="bthd" and ComfyUI's reshape), through the CUDA-graph cache, plus a graph of the call captured by
  hand and replayed alone (`*_replay_ms`).

Backends: PROBE_BACKENDS (default cute,triton); shapes: PROBE_SHAPES (default all). Eager rows also give the peak
memory of one call beyond its output in q's bytes (`op*_peak_extra_x_q`, as bench/pieces.py --morton). Prints one
line `RESULT {...}`.

    python bench/probes/switch_ab.py PSA_NAME [--route] [--flux-only]
"""
import json
import math
import os
import statistics
import sys

import torch
import triton

sys.path.insert(0, ".")
from kernels import graphs  # noqa: E402
from kernels import piecewise_sparse_attention as psa  # noqa: E402

ENV = next((a for a in sys.argv[1:] if a.startswith("PSA_")), None)
if ENV is None:
    sys.exit(__doc__)
ROUNDS = int(os.environ.get("PROBE_ROUNDS", "3"))
# PROBE_REPLAY=1: the eager shapes too are captured by hand and replayed alone (`*_replay_ms`, the GPU time of the
# whole call without the host's; session 22: the Morton call's eager rounds spread by ~8% at 480p)
REPLAY = os.environ.get("PROBE_REPLAY", "0") == "1"
BACKENDS = os.environ.get("PROBE_BACKENDS", "cute,triton").split(",")
# PROBE_PROFILE=1: each eager arm's kernels of one call too (`op*_kernels`: [name, device ms, launches], torch.profiler;
# session 37: which kernel the cube path's time went to)
PROFILE = os.environ.get("PROBE_PROFILE", "0") == "1"
if PROFILE:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from pieces import kernel_table  # noqa: E402
# (name, grid, heads, text tokens first, density, sink blocks, node layout, graphs)
SHAPES = [("wan14", (21, 30, 52), 40, 0, 0.125, 0, True, False),
          ("wan14_raster", (21, 30, 52), 40, 0, 0.125, 0, False, False),
          ("wan14_720", (21, 45, 80), 40, 0, 0.125, 0, True, False),
          ("wan14_none", (21, 30, 52), 40, 0, 0.125, 0, True, False),
          ("wan14_720_none", (21, 45, 80), 40, 0, 0.125, 0, True, False),
          ("flux", (64, 64), 24, 512, 0.2, 8, False, True)]
if "--flux-only" in sys.argv:
    SHAPES = SHAPES[-1:]
if os.environ.get("PROBE_SHAPES"):  # a comma-separated subset of the names above
    SHAPES = [s for s in SHAPES if s[0] in os.environ["PROBE_SHAPES"].split(",")]
else:  # the *_none rows (the node's layout without reorder) on request only
    SHAPES = [s for s in SHAPES if not s[0].endswith("_none")]
# PROBE_VALUES: the switch's two values, op0's then op1's (default 0,1; e.g. PSA_MORTON_SCRATCH with 1,0.5)
VALUES = os.environ.get("PROBE_VALUES", "0,1").split(",")
assert len(VALUES) == 2, f"PROBE_VALUES {VALUES}: two values"


def bench(fn, ms_hint):
    return triton.testing.do_bench(fn, warmup=25, rep=300 if ms_hint < 20 else 800)


def hand_graph(call):
    """A graph of `call` captured by hand (the cache off), replayed alone: the GPU time of the whole call."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = call()
    return g, out


res = {"rounds": ROUNDS, "env": ENV}
if "--route" in sys.argv and "--flux-only" not in sys.argv:
    from kernels.config import SparseConfig
    from kernels.triton import stats as kts
    for name, T in (("route_wan14", 32760), ("route_wan14_720", 75600)):
        q, k, v = (torch.randn(1, 40, T, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        cfg = SparseConfig(density=0.125, variant="pwt", scale=128 ** -0.5)
        st = kts.block_stats(q, k, v, cfg)

        def route_once():
            st.hbar_ready = False
            return kts.route(st, cfg, q.dtype)
        d = res[name] = {}
        lists = {}
        for r in range(ROUNDS):
            for op in ("0", "1"):
                os.environ[ENV] = VALUES[int(op)]
                lists[op] = route_once()
                d[f"op{op}_r{r}_ms"] = bench(route_once, 1.0)
        d["lists_equal"] = bool(torch.equal(lists["0"][0], lists["1"][0]) and torch.equal(lists["0"][1], lists["1"][1]))
        for op in ("0", "1"):
            d[f"op{op}_median_ms"] = statistics.median(d[f"op{op}_r{r}_ms"] for r in range(ROUNDS))
        print(name, json.dumps(d), flush=True)
        del q, k, v, st, lists
        torch.cuda.empty_cache()
for name, grid, H, npre, density, sinks, node, use_graphs in SHAPES:
    T, D = npre + math.prod(grid), 128
    torch.manual_seed(0)
    if node:
        x = [torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3)]
    else:
        x = [torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    q, k, v = x
    for backend in BACKENDS:
        kw = dict(density=density, variant="pwt", n_sink_blocks=sinks, backend=backend, on_failure="raise")
        if name != "wan14_raster" and not name.endswith("_none"):  # (*_none: the node's layout, reorder="none")
            kw.update(reorder="morton", grid=grid, n_prefix=npre)
        if use_graphs:
            kw["out_layout"] = "bthd"
            call = lambda: psa(q, k, v, **kw).transpose(1, 2).reshape(1, T, H * D)  # noqa: E731
        else:
            call = lambda: psa(q, k, v, **kw)  # noqa: E731
        d = res[f"{name}_{backend}"] = {"T": T}
        outs = {}
        try:
            for r in range(ROUNDS):
                for op in ("0", "1"):
                    os.environ[ENV] = VALUES[int(op)]
                    os.environ["PSA_CUDA_GRAPHS"] = "1" if use_graphs else "0"
                    graphs.clear()
                    outs[op] = call().clone()
                    d[f"op{op}_r{r}_ms"] = bench(call, 1.0 if use_graphs else 10.0)
                    if r == 0 and not use_graphs:  # peak extra memory of one call beyond its output, in q's bytes
                        torch.cuda.synchronize()
                        base = torch.cuda.memory_allocated()
                        torch.cuda.reset_peak_memory_stats()
                        o = call()
                        torch.cuda.synchronize()
                        d[f"op{op}_peak_extra_x_q"] = ((torch.cuda.max_memory_allocated() - base - o.numel() * 2)
                                                       / (q.numel() * 2))
                        del o
                    if use_graphs or REPLAY:
                        graphs.clear()
                        os.environ["PSA_CUDA_GRAPHS"] = "0"
                        try:
                            g, o = hand_graph(call)
                            d[f"op{op}_r{r}_replay_ms"] = bench(g.replay, 1.0 if use_graphs else 10.0)
                            d[f"op{op}_replay_equal"] = bool(torch.equal(o, outs[op]))
                            del g, o
                        except Exception as e:  # noqa: BLE001  (the eager rows stand without it)
                            d[f"op{op}_replay_error"] = f"{type(e).__name__}: {str(e)[:200]}"
                        torch.cuda.empty_cache()
            d["maxdiff"] = float((outs["0"].float() - outs["1"].float()).abs().max())
            if PROFILE and not use_graphs:  # where an arm's time goes: one call's kernels (bench/pieces.py's table)
                for op in ("0", "1"):
                    os.environ[ENV] = VALUES[int(op)]
                    d[f"op{op}_kernels"] = [[n, round(ms, 4), c] for n, ms, c in kernel_table(call, top=10)]
            for op in ("0", "1"):
                d[f"op{op}_median_ms"] = statistics.median(
                    d[f"op{op}_r{r}_ms"] for r in range(ROUNDS))
                rep = [d[f"op{op}_r{r}_replay_ms"] for r in range(ROUNDS) if f"op{op}_r{r}_replay_ms" in d]
                if rep:
                    d[f"op{op}_replay_median_ms"] = statistics.median(rep)
        except Exception as e:  # one shape or backend failing must not cost the others
            d["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(name, backend, json.dumps(d), flush=True)
        graphs.clear()
    del q, k, v, x
    torch.cuda.empty_cache()
os.environ.pop(ENV, None)
print("RESULT " + json.dumps(res), flush=True)

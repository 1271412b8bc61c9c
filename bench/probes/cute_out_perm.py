"""H200 probe: the CuTe Morton path as the node calls it (kernels.piecewise_sparse_attention, backend="cute", pwt d
0.125, [B, L, H, D] memory seen as [B, H, L, D], Wan2.1-14B 480p and 720p grids, random bf16) with the output
written over the q copy and scattered back (PSA_CUTE_OUT_PERM=0) and written through the permutation by the kernel
(=1), alternated twice, with the peak memory above inputs and output and the largest difference between the two
outputs (the same arithmetic: 0 expected). CUDA graphs off (these sizes are above their token limit anyway).
Prints one line `RESULT {...}`; bench/gpu_round.sh B picks from it.

    python bench/probes/cute_out_perm.py [NAME A B ...] [--flux | --flux-only]

alternates another environment variable instead (keys op<A> / op<B> / ...: two values or more), e.g.
`PSA_MORTON_SCRATCH 0 1`: the copies in one chunk (0) against the 2 head chunks of 20 with a scatter each (1, the
default since session 6), or `PSA_CUTE_Q_PERM 0 1 --flux`: the query rows read through the permutation by the
kernel (no q copy, no scatter) against the block-order copies, at FLUX.1 1024^2 too (24 heads, 512 text tokens
first, 8 sink blocks, d 0.2; `--flux-only`: there alone). PROBE_ROUNDS (default 2) sets how many times the builds
alternate; PROBE_BACKENDS and PROBE_RASTER below.
"""
import json
import math
import os
import sys

import torch
import triton

sys.path.insert(0, ".")
os.environ["PSA_CUDA_GRAPHS"] = "0"
from kernels import piecewise_sparse_attention as psa  # noqa: E402

ARGS = [a for a in sys.argv[1:] if a not in ("--flux", "--flux-only")]
ENV, VALS = (ARGS[0], tuple(ARGS[1:])) if len(ARGS) >= 3 else ("PSA_CUTE_OUT_PERM", ("0", "1"))
# PROBE_BACKENDS (default cute): a comma list; the first backend's keys are plain, later ones' get "_<backend>"
# after the shape name. PROBE_RASTER=1 also times reorder="none" (key raster_r<i>_ms), Morton's yardstick
BACKENDS = os.environ.get("PROBE_BACKENDS", "cute").split(",")
RASTER = os.environ.get("PROBE_RASTER", "0") == "1"
res = {"env": ENV}
# (name, grid, heads, text tokens in front, density, sink blocks); FLUX.1 1024^2 in its [B, H, L, D] memory
SHAPES = [("wan14", (21, 30, 52), 40, 0, 0.125, 0), ("wan14_720", (21, 45, 80), 40, 0, 0.125, 0)]
if "--flux" in sys.argv or "--flux-only" in sys.argv:
    SHAPES = SHAPES * ("--flux-only" not in sys.argv) + [("flux", (64, 64), 24, 512, 0.2, 8)]
for (name, grid, H, npre, density, sinks), backend in ((s, b) for s in SHAPES for b in BACKENDS):
    T, D = npre + math.prod(grid), 128
    x = (torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16) if npre else
         torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2))
    q, k, v = x, torch.randn_like(x), torch.randn_like(x)
    kw = dict(density=density, variant="pwt", reorder="morton", grid=grid, n_prefix=npre, n_sink_blocks=sinks,
              backend=backend, on_failure="raise")
    key = name if backend == BACKENDS[0] else f"{name}_{backend}"
    d = res[key] = {"T": T, "backend": backend}
    outs = {}
    for r in range(int(os.environ.get("PROBE_ROUNDS", "2"))):
        if RASTER:
            os.environ.pop(ENV, None)
            kr = dict(kw, reorder="none")
            psa(q, k, v, **kr)
            d[f"raster_r{r}_ms"] = triton.testing.do_bench(lambda: psa(q, k, v, **kr), rep=300)
        for op in VALS:
            os.environ[ENV] = op
            outs[op] = psa(q, k, v, **kw)
            d[f"op{op}_r{r}_ms"] = triton.testing.do_bench(lambda: psa(q, k, v, **kw), rep=300)
    for op in VALS:
        os.environ[ENV] = op
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        o = psa(q, k, v, **kw)
        torch.cuda.synchronize()
        d[f"op{op}_peak_extra_x_q"] = (torch.cuda.max_memory_allocated() - base - o.numel() * 2) / (q.numel() * 2)
        del o
    d["maxdiff"] = max(float((outs[op].float() - outs[VALS[0]].float()).abs().max()) for op in VALS[1:])
    print(key, d, flush=True)
    del q, k, v, outs
    torch.cuda.empty_cache()
os.environ.pop(ENV, None)
print("RESULT " + json.dumps(res))

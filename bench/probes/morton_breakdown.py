"""H200 probe: where the Morton reorder's cost goes as the node calls Wan2.1-14B (session 23 pieces: CuTe, node
layout, 480p 6.840 ms raster -> 7.230 Morton, +5.7%; 720p +2.6%). Per shape and reorder ("none" / "morton"), the
public call in ComfyUI's layout ([B, L, H*D] memory seen as [B, H, L, D], out_layout="bthd", CUDA graphs off):

* the whole call, do_bench, alternated over PROBE_ROUNDS (default 3) rounds;
* its kernels from torch.profiler (device ms, launches) and their sum, so the difference splits into the
  statistics (which gather the block-order copies under Morton), the routing (other lists), the attention kernel
  (block-order K/V vs the caller's strided ones, other lists: how often adjacent query blocks share KV blocks) and
  the scatter back;
* the exact fraction of adjacent query-block pairs' lists that coincide (`adjacent_shared_fraction`, what the pair
  kernel's shared tiles can reuse), from kernels.triton routing on the same statistics.

Inputs: PROBE_INPUTS=random (default; N(0,1): no spatial structure, so Morton's lists are no more local than
raster's) or ditlike (bench/pieces.py's DiT-like generator: smooth in space and time, as a video latent's
attention is). Prints one line `RESULT {...}`.

    python bench/probes/morton_breakdown.py
"""
import json
import math
import os
import statistics
import sys

import torch
import triton

sys.path.insert(0, ".")
sys.path.insert(0, "bench")
import pieces  # noqa: E402  (kernel_table, adjacent_shared_fraction)
from kernels import piecewise_sparse_attention as psa  # noqa: E402

ROUNDS = int(os.environ.get("PROBE_ROUNDS", "3"))
INPUTS = os.environ.get("PROBE_INPUTS", "random")
BACKEND = os.environ.get("PROBE_BACKEND", "cute")
SHAPES = [("wan14", (21, 30, 52)), ("wan14_720", (21, 45, 80))]
if os.environ.get("PROBE_SHAPES"):
    SHAPES = [s for s in SHAPES if s[0] in os.environ["PROBE_SHAPES"].split(",")]
H, D = 40, 128


def inputs(grid):
    T = math.prod(grid)
    if INPUTS == "ditlike":  # kernels/synthetic.py, [B, H, T, D] in raster order, into ComfyUI's memory layout
        from kernels.synthetic import dit_like_qkv
        q, k, v = dit_like_qkv(grid, heads=H, head_dim=D, dtype=torch.bfloat16, device="cuda")
        return [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v)]
    torch.manual_seed(0)
    return [torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3)]


def shared_fraction(q, k, v, grid, reorder):
    """bench/pieces.py's adjacent_shared_fraction of the routing the call makes (Morton: on the block-order
    copies)."""
    from kernels import triton as kt
    from kernels.config import SparseConfig
    from kernels.reorder import apply_reorder, orders_on
    qq, kk, vv = (x.contiguous() for x in (q, k, v))
    if reorder == "morton":
        perm = orders_on(grid, qq.device)[0]
        qq, kk, vv = (apply_reorder(x, perm) for x in (qq, kk, vv))
    cfg = SparseConfig(density=0.125, variant="pwt", scale=D ** -0.5)
    return pieces.adjacent_shared_fraction(kt.prepare(qq, kk, vv, cfg)[1])


res = {"rounds": ROUNDS, "inputs": INPUTS, "backend": BACKEND, "gpu": torch.cuda.get_device_name(0),
       "torch": torch.__version__, "triton": triton.__version__}
os.environ["PSA_CUDA_GRAPHS"] = "0"
for name, grid in SHAPES:
    q, k, v = inputs(grid)
    T = math.prod(grid)
    d = res[name] = {"T": T}
    calls = {}
    for reorder in ("none", "morton"):
        kw = dict(density=0.125, variant="pwt", backend=BACKEND, on_failure="raise", out_layout="bthd",
                  reorder=reorder, grid=grid if reorder == "morton" else None)
        calls[reorder] = (lambda kw=kw: psa(q, k, v, **kw))
    for r in range(ROUNDS):
        for reorder, call in calls.items():
            d[f"{reorder}_r{r}_ms"] = triton.testing.do_bench(call, warmup=25, rep=400)
    for reorder, call in calls.items():
        d[f"{reorder}_median_ms"] = statistics.median(d[f"{reorder}_r{r}_ms"] for r in range(ROUNDS))
        rows = [list(r) for r in pieces.kernel_table(call, top=50)]
        d[f"{reorder}_kernels"] = rows
        d[f"{reorder}_kernels_sum_ms"] = round(sum(r[1] for r in rows), 4)
        try:
            d[f"{reorder}_adjacent_shared_fraction"] = round(shared_fraction(q, k, v, grid, reorder), 4)
        except Exception as e:  # a diagnostic: its failure must not lose the timings
            d[f"{reorder}_adjacent_shared_fraction"] = f"failed: {type(e).__name__}: {str(e)[:160]}"
    print(name, json.dumps({k_: v_ for k_, v_ in d.items() if not k_.endswith("_kernels")}), flush=True)
    for reorder in calls:
        print(f"  {name} {reorder} kernels:", d[f"{reorder}_kernels"][:10], flush=True)
    del q, k, v, calls
    torch.cuda.empty_cache()
print("RESULT", json.dumps(res))

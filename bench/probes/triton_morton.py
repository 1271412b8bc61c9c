"""H200 probe: the Triton Morton path as the node calls it (kernels.piecewise_sparse_attention, backend="triton",
pwt d 0.125, [B, L, H, D] memory seen as [B, H, L, D], random bf16) at Wan2.1-14B 480p and 720p: this tree's kernels
(k, v copies only, q read and output written through the permutation, 2 head chunks) against the previous ones
(`kernels_old` in the folder given as argv[1], e.g. .carry/old: q, k, v copies, block-order output, scatter),
alternated twice, with reorder="none" as the baseline, the peak memory above inputs and output in units of q's
bytes, and the largest difference between the two trees' outputs. Prints one line `RESULT {...}`."""
import importlib
import json
import os
import sys

import torch
import triton

sys.path.insert(0, ".")
if len(sys.argv) > 1:
    sys.path.insert(0, sys.argv[1])
os.environ["PSA_CUDA_GRAPHS"] = "0"
trees = {"new": importlib.import_module("kernels").piecewise_sparse_attention}
try:
    trees["old"] = importlib.import_module("kernels_old").piecewise_sparse_attention
except ImportError:
    pass

res = {}
for name, grid in (("wan14", (21, 30, 52)), ("wan14_720", (21, 45, 80))):
    T, H, D = grid[0] * grid[1] * grid[2], 40, 128
    q, k, v = (torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    d = res[name] = {"T": T}
    outs = {}
    for r in range(2):
        for tree, psa in trees.items():
            for reorder in ("morton", "none"):
                kw = dict(density=0.125, variant="pwt", reorder=reorder, grid=grid if reorder == "morton" else None,
                          backend="triton", on_failure="raise")
                if reorder == "morton":
                    outs[tree] = psa(q, k, v, **kw)
                d[f"{tree}_{reorder}_r{r}_ms"] = triton.testing.do_bench(lambda: psa(q, k, v, **kw), rep=300)
    for tree, psa in trees.items():
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        o = psa(q, k, v, density=0.125, variant="pwt", reorder="morton", grid=grid, backend="triton",
                on_failure="raise")
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base - o.numel() * 2
        d[f"{tree}_morton_peak_extra_x_q"] = extra / (q.numel() * 2)
        del o
    if "old" in outs:
        d["maxdiff_new_vs_old"] = float((outs["new"].float() - outs["old"].float()).abs().max())
    print(name, d, flush=True)
    del q, k, v, outs
    torch.cuda.empty_cache()
print("RESULT " + json.dumps(res))

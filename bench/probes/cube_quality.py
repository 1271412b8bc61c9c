"""GPU probe (session 34): does the cube order (PSA_MORTON_CUBES, kernels/reorder.py _cube_cpu) keep the Morton
order's accuracy? The whole operator through the public API as the node calls it (pwt, density 0.125 and 0.2, the
caller's [B, L, H * D] memory, reorder="morton" over the grid), against dense attention (SDPA) on the same inputs:
relative L2 error per order, on DiT-like inputs (kernels/synthetic.py: local RoPE-like structure, where the order
decides which tokens share a block) and random ones, at Wan2.1 480p's grid with PROBE_HEADS heads (default 8).
Backend PROBE_BACKEND (default cute). Prints `RESULT {...}`.

    python bench/probes/cube_quality.py
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from kernels import piecewise_sparse_attention as psa  # noqa: E402
from kernels.synthetic import dit_like_qkv  # noqa: E402

GRID = tuple(int(x) for x in os.environ.get("PROBE_GRID", "21,30,52").split(","))
HEADS = int(os.environ.get("PROBE_HEADS", "8"))
BACKEND = os.environ.get("PROBE_BACKEND", "cute")


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    T = math.prod(GRID)
    res = {"gpu": torch.cuda.get_device_name(), "grid": GRID, "heads": HEADS, "backend": BACKEND}
    for inputs in ("ditlike", "random"):
        if inputs == "ditlike":
            qkv = dit_like_qkv(GRID, heads=HEADS, head_dim=128, dtype=torch.bfloat16, device="cuda")
        else:
            g = torch.Generator(device="cuda").manual_seed(0)
            qkv = [torch.randn(1, HEADS, T, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3)]
        # the node's memory: [B, L, H * D] seen as [B, H, L, D]
        q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in qkv)
        dense = F.scaled_dot_product_attention(q, k, v)
        for density in (0.125, 0.2):
            for cubes in ("0", "1"):
                os.environ["PSA_MORTON_CUBES"] = cubes
                out = psa(q, k, v, density=density, variant="pwt", reorder="morton", grid=GRID, backend=BACKEND,
                          on_failure="raise")
                res[f"{inputs}_d{density}_cubes{cubes}_rel_l2"] = round(rel(out, dense), 6)
            r = res[f"{inputs}_d{density}_cubes1_rel_l2"] / res[f"{inputs}_d{density}_cubes0_rel_l2"]
            res[f"{inputs}_d{density}_ratio"] = round(r, 4)
            print(inputs, density, res[f"{inputs}_d{density}_cubes0_rel_l2"], res[f"{inputs}_d{density}_cubes1_rel_l2"],
                  flush=True)
        del q, k, v, qkv, dense
        torch.cuda.empty_cache()
    os.environ.pop("PSA_MORTON_CUBES", None)
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()

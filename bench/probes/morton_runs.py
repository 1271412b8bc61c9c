"""CPU probe (session 32, beside G31's TMA box test): what a kernel reading Morton blocks straight from the caller's
raster layout (no block-order copies) would have to load. Per grid and 64-token block (kernels.reorder's Morton order
over the real cells of any grid): how many runs of raster-consecutive tokens it is made of (one TMA box, or one
[run, D] row range, each), and whether it is an aligned 4 x 4 x 4 cube (2D: 8 x 8 square), which one
multi-dimensional TMA box over the [F, H, W] grid (box 4 x 4 x 4 x D; 5 dimensions with the heads) fetches whole.
Prints one line `RESULT {...}` per grid: blocks, cubes, the histogram of run counts, runs' lengths.

    python bench/probes/morton_runs.py [F,H,W ...]     (default: Wan2.1 480p 21,30,52 and 720p 21,45,80; FLUX.1 64,64)
"""
import json
import sys
from collections import Counter

import torch

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from kernels.reorder import morton_order  # noqa: E402

BS = 64


def block_runs(grid):
    perm = morton_order(grid)
    side = round(BS ** (1 / len(grid)))
    n_runs, lengths, cubes = Counter(), Counter(), 0
    for b in range(-(-perm.numel() // BS)):
        rows = perm[b * BS:(b + 1) * BS].sort().values
        breaks = torch.nonzero(rows[1:] != rows[:-1] + 1).flatten() + 1
        edges = [0] + breaks.tolist() + [rows.numel()]
        n_runs[len(edges) - 1] += 1
        lengths.update(e - s for s, e in zip(edges[:-1], edges[1:]))
        coords, rest = [], rows
        for n in reversed(grid):  # raster index -> per-axis coordinates, the last axis fastest
            coords.append(rest % n)
            rest = rest // n
        cubes += rows.numel() == BS and all(int(c.max() - c.min()) == side - 1 for c in coords)
    return {"grid": list(grid), "tokens": perm.numel(), "blocks": sum(n_runs.values()), "cubes": cubes,
            "runs_per_block": dict(sorted(n_runs.items())), "run_lengths": dict(sorted(lengths.items()))}


if __name__ == "__main__":
    grids = [tuple(int(x) for x in a.split(",")) for a in sys.argv[1:]] or [(21, 30, 52), (21, 45, 80), (64, 64)]
    for g in grids:
        print("RESULT " + json.dumps(block_runs(g)))

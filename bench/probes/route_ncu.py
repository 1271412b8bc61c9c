"""H200 probe for Nsight Compute: the routing kernels alone (kernels/triton/route.py) at Wan2.1-14B 720p (random
bf16, pwt d 0.125, statistics precomputed), route() called 1 + --calls times, so that

    ncu --kernel-name regex:"_scores_kernel|_select" --launch-skip 2 --launch-count 2 --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
        --section MemoryWorkloadAnalysis --csv python bench/probes/route_ncu.py

profiles one scores and one select launch after their compile. PSA_SCORE_PREC picks the scores' dots.
With --stats only the one-pass statistics run (block_stats 1 + --calls times; session 14 at 480p):

    ncu --kernel-name regex:"_stats_h_kernel" --launch-skip 1 --launch-count 1 ... python bench/probes/route_ncu.py \
        --stats --T 32760

With --stats --gather the statistics as the Morton path runs them (session 23, A36: 0.76 ms at 480p against 0.40 in
raster order): ComfyUI's [B, L, H*D] memory seen as [B, H, L, D], read through the full Morton order of --grid (F,H,W;
T is its product) and the block-order copies of q, k, v written (kernels.triton's gathered call, all 40 heads in one
chunk).

    python bench/probes/route_ncu.py [--calls N] [--T T] [--stats [--gather [--grid F,H,W]]]"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from kernels.config import SparseConfig  # noqa: E402
from kernels.triton import stats as kts  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--calls", type=int, default=1)
ap.add_argument("--T", type=int, default=75600)
ap.add_argument("--stats", action="store_true", help="the statistics kernel alone")
ap.add_argument("--gather", action="store_true", help="with --stats: the Morton path's gathered statistics")
ap.add_argument("--grid", default="21,30,52", help="with --gather: the token grid F,H,W (T is its product)")
a = ap.parse_args()
torch.manual_seed(0)
kw = {}
if a.gather:
    from kernels.reorder import full_order, orders_on  # noqa: E402
    grid = tuple(int(x) for x in a.grid.split(","))
    a.T = grid[0] * grid[1] * grid[2]
    q, k, v = (torch.randn(1, a.T, 40, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    g = torch.empty((3, 1, 40, a.T, 128), device="cuda", dtype=torch.bfloat16)
    kw = dict(perm=full_order(orders_on(grid, "cuda")[0], 0), gathered=(g[0], g[1], g[2]))
else:
    q, k, v = (torch.randn(1, 40, a.T, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
cfg = SparseConfig(density=0.125, variant="pwt", band=1, n_sink_blocks=0, cov_bias=False, scale=128 ** -0.5)
st = kts.block_stats(q, k, v, cfg, **kw)
for _ in range(1 + a.calls):
    if a.stats:
        st = kts.block_stats(q, k, v, cfg, **kw)
    else:
        st.hbar_ready = False
        idx, vb = kts.route(st, cfg, q.dtype)
torch.cuda.synchronize()
print("done", tuple(st.kbar.shape) if a.stats else int(idx.shape[-1]))

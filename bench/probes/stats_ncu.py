"""H200 probe for Nsight Compute: the one-pass statistics kernel alone (kernels/triton/stats_h.py) at Wan2.1-14B
480p (random bf16, pwt d 0.125, raster [B, H, T, D]), block_stats called 1 + --calls times, so that

    ncu --kernel-name regex:"_stats_h_kernel" --launch-skip 1 --launch-count 1 --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
        --section MemoryWorkloadAnalysis --csv python bench/probes/stats_ncu.py

profiles one launch after its compile.

    python bench/probes/stats_ncu.py [--calls N] [--T T]"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from kernels.config import SparseConfig  # noqa: E402
from kernels.triton import stats as kts  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--calls", type=int, default=1)
ap.add_argument("--T", type=int, default=32760)
a = ap.parse_args()
torch.manual_seed(0)
q, k, v = (torch.randn(1, 40, a.T, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
cfg = SparseConfig(density=0.125, variant="pwt", band=1, n_sink_blocks=0, cov_bias=False, scale=128 ** -0.5)
for _ in range(1 + a.calls):
    st = kts.block_stats(q, k, v, cfg)
torch.cuda.synchronize()
print("done", tuple(st.kbar.shape))

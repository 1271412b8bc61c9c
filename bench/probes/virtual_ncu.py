"""H200 probe for Nsight Compute: the CuTe attention kernel alone at Wan2.1-14B 480p (random bf16, d 0.125, routing
precomputed), drop (the exact tiles only) or pwt (the same exact tiles + the virtual tiles), launched
`--calls` times after one warm-up call, so that

    ncu --kernel-name regex:cutlass --launch-skip 1 --launch-count 1 --section WarpStateStats \
        --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --csv python bench/probes/virtual_ncu.py pwt

profiles one call of the variant after its compile. The pwt - drop differences of the stall reasons, issue slots
and L2 / global load traffic say where the virtual tiles' ~1.45x per-tile cost over an exact tile goes
(session 6: 1.065 ms over 8 virtual tiles per query block, against 5.711 ms over 64 exact ones).

`novt` is the pwt build without its virtual tiles (probe="novt": wrong outputs, timing only; session 17): pwt - novt
is then the virtual tiles inside the pair kernel alone.

    python bench/probes/virtual_ncu.py {drop|pwt|novt} [--calls N] [--T T]"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from kernels.config import SparseConfig  # noqa: E402
from kernels.cute import fwd as CF  # noqa: E402
from kernels.triton import stats as kts  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("variant", choices=["drop", "pwt", "novt"])
ap.add_argument("--calls", type=int, default=2)
ap.add_argument("--T", type=int, default=32760)
a = ap.parse_args()
torch.manual_seed(0)
q, k, v = (torch.randn(1, 40, a.T, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
cp = SparseConfig(density=0.125, variant="pwt", band=1, n_sink_blocks=0, cov_bias=False, scale=128 ** -0.5)
cfg = cp if a.variant != "drop" else SparseConfig(density=0.125, variant="drop", band=1, n_sink_blocks=0,
                                                 cov_bias=False, scale=128 ** -0.5)
st = kts.block_stats(q, k, v, cp)  # pwt's routing for both: the same exact tiles
idx, vb = kts.route(st, cp, q.dtype)
out = torch.empty_like(q)
for _ in range(1 + a.calls):
    CF.attention(q, k, v, out, st, idx, None if a.variant == "drop" else vb, cfg,
                 probe="novt" if a.variant == "novt" else "")
torch.cuda.synchronize()
print(a.variant, "done", float(out.float().abs().mean()))

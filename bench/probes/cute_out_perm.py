"""H200 probe: the CuTe Morton path as the node calls it (kernels.piecewise_sparse_attention, backend="cute", pwt d
0.125, [B, L, H, D] memory seen as [B, H, L, D], Wan2.1-14B 480p and 720p grids, random bf16) with the output
written over the q copy and scattered back (PSA_CUTE_OUT_PERM=0) and written through the permutation by the kernel
(=1), alternated twice, with the peak memory above inputs and output and the largest difference between the two
outputs (the same arithmetic: 0 expected). CUDA graphs off (these sizes are above their token limit anyway).
Prints one line `RESULT {...}`; bench/gpu_round.sh B picks from it.

    python bench/probes/cute_out_perm.py [NAME A B]

alternates another environment variable instead (keys op<A> / op<B>), e.g. `PSA_MORTON_SCRATCH 0 1`: the copies in
one chunk (0) against the 2 head chunks of 20 with a scatter each (1, the default since session 6)."""
import json
import os
import sys

import torch
import triton

sys.path.insert(0, ".")
os.environ["PSA_CUDA_GRAPHS"] = "0"
from kernels import piecewise_sparse_attention as psa  # noqa: E402

ENV, VALS = (sys.argv[1], tuple(sys.argv[2:4])) if len(sys.argv) == 4 else ("PSA_CUTE_OUT_PERM", ("0", "1"))
res = {"env": ENV}
for name, (F, Hh, W) in (("wan14", (21, 30, 52)), ("wan14_720", (21, 45, 80))):
    T, H, D = F * Hh * W, 40, 128
    q, k, v = (torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    kw = dict(density=0.125, variant="pwt", reorder="morton", grid=(F, Hh, W), backend="cute", on_failure="raise")
    d = res[name] = {"T": T}
    outs = {}
    for r in range(2):
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
    d["maxdiff"] = float((outs[VALS[1]].float() - outs[VALS[0]].float()).abs().max())
    print(name, d, flush=True)
    del q, k, v, outs
    torch.cuda.empty_cache()
os.environ.pop(ENV, None)
print("RESULT " + json.dumps(res))

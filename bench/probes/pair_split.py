"""H200 probe: where the CuTe pair kernel's time goes, by removing one part at a time (timing builds, wrong outputs;
fwd_pair.py's probes via tile_ops._probe_skips): the full pwt kernel, without its virtual tiles (novt), and each of
those without the tile GEMMs (nogemm: the loads, barriers and softmax), without the softmax (nosoftmax: the loads,
barriers and GEMMs) and without both (stream: the consumers only wait for and release their tiles, so the time of
the tile stream from L2 under this kernel's pipelines). Random bf16 [1, 40, T, 128], pwt d 0.125, one precomputed
routing; PROBE_T sizes (default 480p 32760 and 720p 75600), PROBE_ROUNDS alternated rounds (default 3), medians.

Session 18 asked this after Nsight Compute's per-instruction sampling (P18) put the consumers' waits on their own
GEMMs and the softmax's dependent chains, and shortening the chains (TREE_MAX / TREE_SUM) changed nothing: if the
stream alone is as slow as the kernel, the exact part is bound by the L2 stream (the lever: fewer bytes, tiles
shared between query blocks); if the GEMMs + softmax without loads... (nogemm / nosoftmax against stream) say how
much each adds on top. Prints one line `RESULT {...}`.

    python bench/probes/pair_split.py
"""
import json
import os
import statistics
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, ".")
from kernels.config import SparseConfig  # noqa: E402
from kernels.cute import fwd as kcf  # noqa: E402
from kernels.triton import stats as kts  # noqa: E402

ROUNDS = int(os.environ.get("PROBE_ROUNDS", "3"))
PROBES = ["", "nogemm", "nosoftmax", "stream", "novt", "novt+nogemm", "novt+nosoftmax", "novt+stream"]
res = {"rounds": ROUNDS}
for T in [int(t) for t in os.environ.get("PROBE_T", "32760,75600").split(",")]:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 40, T, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cfg = SparseConfig(density=0.125, variant="pwt", band=1, n_sink_blocks=0, scale=128 ** -0.5)
    st = kts.block_stats(q, k, v, cfg)
    idx, vbias = kts.route(st, cfg, q.dtype)
    out = torch.empty_like(q)
    d = res[str(T)] = {}
    for r in range(ROUNDS):
        for p in PROBES:
            call = lambda: kcf.attention(q, k, v, out, st, idx, vbias, cfg, probe=p)  # noqa: E731
            call()
            d.setdefault(p or "pwt", []).append(do_bench(call, warmup=25, rep=300 if T < 50000 else 800,
                                                         return_mode="median"))
    med = {p: statistics.median(x) for p, x in d.items()}
    res[f"{T}_median_ms"] = med
    print(T, json.dumps({p: round(m, 3) for p, m in med.items()}), flush=True)
    del q, k, v, st, idx, vbias, out
    torch.cuda.empty_cache()
print("RESULT " + json.dumps(res), flush=True)

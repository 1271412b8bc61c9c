"""H200 probe: the CuTe pwt attention's virtual-tile bias loads (kernels/cute/fwd.py) in four builds, alternated
twice, at Wan2.1-14B 480p and 720p (random bf16, d 0.125, routing precomputed): off, BIAS_L2 (the producer
prefetches the query block's bias row into L2), BIAS_PF (a tile's bias loaded right after the previous tile's
softmax) and both; plus drop (the exact part) once, and each build's largest difference from the off build's
output (the same arithmetic: 0 expected). Prints one line `RESULT {...}`; bench/gpu_round.sh B picks from it."""
import json
import sys

import torch
import triton

sys.path.insert(0, ".")
sys.path.insert(0, "bench/probes")
from kernels.cute import fwd as CF  # noqa: E402
from routed import routed_inputs  # noqa: E402

BUILDS = {"off": (False, False), "l2": (True, False), "pf": (False, True), "l2pf": (True, True)}
res = {}
for name, T in (("wan14_720", 75600), ("wan14", 32760)):
    q, k, v, cp, cd, st, idx, vb = routed_inputs(T)
    outs = {b: torch.empty_like(q) for b in BUILDS}
    od = torch.empty_like(q)
    d = res[name] = {}
    d["drop_ms"] = triton.testing.do_bench(lambda: CF.attention(q, k, v, od, st, idx, None, cd), rep=400)
    for r in range(2):
        for b, (l2, pf) in BUILDS.items():
            d[f"pwt_{b}_r{r}_ms"] = triton.testing.do_bench(
                lambda: CF.attention(q, k, v, outs[b], st, idx, vb, cp, bias_l2=l2, bias_pf=pf), rep=400)
    for b in BUILDS:
        d[f"{b}_maxdiff_vs_off"] = float((outs[b].float() - outs["off"].float()).abs().max())
    print(name, d, flush=True)
    del q, k, v, st, idx, vb, outs, od
    torch.cuda.empty_cache()
print("RESULT " + json.dumps(res))

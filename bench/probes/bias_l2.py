"""H200 probe: the CuTe pwt attention with the bias-row L2 prefetch (kernels/cute/fwd.py BIAS_L2) on and off,
alternated twice, at Wan2.1-14B 480p and 720p (random bf16, d 0.125, routing precomputed), plus drop (the exact
part) once; and the rel L2 between the two outputs. Prints one JSON line."""
import json
import sys

import torch
import triton

sys.path.insert(0, ".")
from kernels.config import SparseConfig  # noqa: E402
from kernels.cute import fwd as CF  # noqa: E402
from kernels.triton import stats as kts  # noqa: E402

res = {}
for name, T in (("wan14_720", 75600), ("wan14", 32760)):
    q, k, v = (torch.randn(1, 40, T, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cp = SparseConfig(density=0.125, variant="pwt", band=1, n_sink_blocks=0, cov_bias=False, scale=128 ** -0.5)
    cd = SparseConfig(density=0.125, variant="drop", band=1, n_sink_blocks=0, cov_bias=False, scale=128 ** -0.5)
    st = kts.block_stats(q, k, v, cp)
    idx, vb = kts.route(st, cp, q.dtype)
    o0, o1, od = (torch.empty_like(q) for _ in range(3))
    d = res[name] = {}
    d["drop_ms"] = triton.testing.do_bench(lambda: CF.attention(q, k, v, od, st, idx, None, cd), rep=400)
    for r in range(2):
        d[f"pwt_l2off_r{r}_ms"] = triton.testing.do_bench(
            lambda: CF.attention(q, k, v, o0, st, idx, vb, cp, bias_l2=False), rep=400)
        d[f"pwt_l2on_r{r}_ms"] = triton.testing.do_bench(
            lambda: CF.attention(q, k, v, o1, st, idx, vb, cp, bias_l2=True), rep=400)
    d["rel_on_vs_off"] = float((o1.float() - o0.float()).norm() / o0.float().norm())
    print(name, d, flush=True)
    del q, k, v, st, idx, vb, o0, o1, od
    torch.cuda.empty_cache()
print("RESULT " + json.dumps(res))

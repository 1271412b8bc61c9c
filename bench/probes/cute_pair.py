"""H200 probe: the CuTe pwt attention with two query blocks per CTA (kernels/cute/fwd_pair.py: the virtual-token
tiles read once for both) against the one-block kernel (fwd.py), attention only on precomputed routing, Wan2.1-14B
480p and 720p (random bf16, H40 D128, density 0.125), alternated twice: one-block ("one"), pair with 2 / 3 / 4
shared stages ("p2", "p3", "p4"), pair with 3 exact stages per consumer and 4 shared ("p3e3"); drop (the exact part)
once, so virtual = pwt - drop per build; each build's largest difference from the one-block output (the same
operations per query block: ~0 expected). Prints one line `RESULT {...}`; bench/gpu_round.sh I picks from it.
--split: the one-block and pair (3 shared stages) builds with pieces of the virtual work removed (timing probes of
fwd_pair.py / fwd.attention(probe=): no virtual tiles, no bias loads, virtual tiles through the exact softmax, no
first-order GEMM), for where the virtual tiles' time goes (their outputs are wrong by design). --fold: the pair
build on folded bias rows (fwd_pair.fold_bias, its torch pass included in the time) against the plain rows and
against no bias at all (nobias: what folding can save at most), and the reciprocal epilogue (recip); at FLUX.1
1024^2 as well.

    python bench/probes/cute_pair.py [--split | --fold]"""
import json
import sys

import torch
import triton

sys.path.insert(0, ".")
sys.path.insert(0, "bench/probes")
from kernels.cute import fwd as CF  # noqa: E402
from routed import routed_inputs  # noqa: E402

# name -> (pair, exact stages, shared stages[, timing probe[, folded bias[, reciprocal epilogue]]])
BUILDS = {"one": (False, 4, 0), "p4": (True, 4, 4), "p3": (True, 4, 3), "p2": (True, 4, 2), "p3e3": (True, 3, 4)}
if "--split" in sys.argv:  # where the virtual tiles' time goes: pieces removed one at a time (wrong outputs)
    BUILDS = {"one": (False, 4, 0), "one_novt": (False, 4, 0, "novt"), "p3": (True, 4, 3),
              "p3_novt": (True, 4, 3, "novt"), "p3_nobias": (True, 4, 3, "nobias"),
              "p3_asexact": (True, 4, 3, "asexact"), "p3_nohbar": (True, 4, 3, "nohbar")}
SHAPES = [("wan14", 32760, 40, 0.125), ("wan14_720", 75600, 40, 0.125)]
if "--fold" in sys.argv:  # the folded bias rows (PSA_CUTE_FOLD_BIAS, fwd_pair.fold_bias; its torch pass included)
    # and the reciprocal epilogue (PSA_CUTE_RECIP_STORE); FLUX.1 1024^2 too, where the pair kernel is not the default
    BUILDS = {"one": (False, 4, 0), "p3": (True, 4, 3), "p3fold": (True, 4, 3, "", True),
              "p4fold": (True, 4, 4, "", True), "p3recip": (True, 4, 3, "", False, True),
              "p3foldrecip": (True, 4, 3, "", True, True), "p3_nobias": (True, 4, 3, "nobias")}
    SHAPES.append(("flux", 4608, 24, 0.2))
res = {}
for name, T, H, density in SHAPES:
    q, k, v, cp, cd, st, idx, vb = routed_inputs(T, H, density)
    outs = {b: torch.empty_like(q) for b in BUILDS}
    od = torch.empty_like(q)
    d = res[name] = {}
    d["drop_ms"] = triton.testing.do_bench(lambda: CF.attention(q, k, v, od, st, idx, None, cd), rep=400)

    def call(b):
        import os
        pair, kv, vt, probe, fold, recip = BUILDS[b] + ("", False, False)[len(BUILDS[b]) - 3:]
        if vt:
            os.environ["PSA_CUTE_VT_STAGES"] = str(vt)
        CF.attention(q, k, v, outs[b], st, idx, vb, cp, kv_stages=kv, pair=pair, probe=probe, fold=fold,
                     recip=recip)

    for r in range(2):
        for b in BUILDS:
            try:
                d[f"pwt_{b}_r{r}_ms"] = triton.testing.do_bench(lambda: call(b), rep=400)
            except Exception as e:  # a build that does not launch (shared memory) is reported, the rest still run
                d[f"pwt_{b}_error"] = f"{type(e).__name__}: {e}"[:300]
    for b in BUILDS:
        if f"pwt_{b}_error" not in d:
            d[f"{b}_maxdiff_vs_one"] = float((outs[b].float() - outs["one"].float()).abs().max())
        ms = [d.get(f"pwt_{b}_r{r}_ms") for r in range(2)]
        if all(isinstance(m, float) for m in ms):
            d[f"{b}_virtual_ms"] = sum(ms) / 2 - d["drop_ms"]
    print(name, d, flush=True)
    del q, k, v, st, idx, vb, outs, od
    torch.cuda.empty_cache()
print("RESULT " + json.dumps(res))

"""H200 probe: the CuTe pwt attention with two query blocks per CTA (kernels/cute/fwd_pair.py: the virtual-token
tiles read once for both) against the one-block kernel (fwd.py), attention only on precomputed routing, Wan2.1-14B
480p and 720p (random bf16, H40 D128, density 0.125), alternated twice: one-block ("one"), pair with 2 / 3 / 4
shared stages ("p2", "p3", "p4"), pair with 3 exact stages per consumer and 4 shared ("p3e3"); drop (the exact part)
once, so virtual = pwt - drop per build; each build's largest difference from the one-block output (the same
operations per query block: ~0 expected). Prints one line `RESULT {...}`; bench/gpu_round.sh I picks from it.
--split: the one-block and pair (3 shared stages) builds with pieces of the virtual work removed (timing probes of
fwd_pair.py / fwd.attention(probe=): no virtual tiles, no bias loads, virtual tiles through the exact softmax, no
first-order GEMM), for where the virtual tiles' time goes (their outputs are wrong by design). --share: the pair
build with one exact pipeline over the union of its two lists (fwd_pair.py share=True) against its own-list
pipelines, with and without virtual tiles (novt: the exact part alone), on random and on DiT-like Morton-ordered
inputs (kernels/synthetic.py at the real grid; adjacent query blocks' lists overlap there), and the share of
adjacent lists in common. (Session 8's --fold run, recorded in bench/results/cute_pair_s8_h200.txt, timed the
folded bias rows and the reciprocal epilogue; the fold option is gone.)

    python bench/probes/cute_pair.py [--split | --share]"""
import json
import sys

import torch
import triton

sys.path.insert(0, ".")
sys.path.insert(0, "bench/probes")
from kernels.cute import fwd as CF  # noqa: E402
from routed import routed_inputs  # noqa: E402

# name -> (pair, exact stages, shared stages[, timing probe[, shared exact pipeline]])
BUILDS = {"one": (False, 4, 0), "p4": (True, 4, 4), "p3": (True, 4, 3), "p2": (True, 4, 2), "p3e3": (True, 3, 4)}
if "--split" in sys.argv:  # where the virtual tiles' time goes: pieces removed one at a time (wrong outputs)
    BUILDS = {"one": (False, 4, 0), "one_novt": (False, 4, 0, "novt"), "p3": (True, 4, 3),
              "p3_novt": (True, 4, 3, "novt"), "p3_nobias": (True, 4, 3, "nobias"),
              "p3_asexact": (True, 4, 3, "asexact"), "p3_nohbar": (True, 4, 3, "nohbar")}
SHAPES = [("wan14", 32760, 40, 0.125, None), ("wan14_720", 75600, 40, 0.125, None)]
if "--share" in sys.argv:
    BUILDS = {"one": (False, 4, 0), "p3": (True, 4, 3), "p3share": (True, 4, 3, "", True),
              "one_novt": (False, 4, 0, "novt"), "p3_novt": (True, 4, 3, "novt"),
              "p3share_novt": (True, 4, 3, "novt", True)}
    SHAPES = [("wan14", 32760, 40, 0.125, None), ("wan14_ditlike", 32760, 40, 0.125, (21, 30, 52)),
              ("wan14_720", 75600, 40, 0.125, None), ("wan14_720_ditlike", 75600, 40, 0.125, (21, 45, 80))]
res = {}
for name, T, H, density, grid in SHAPES:
    q, k, v, cp, cd, st, idx, vb = routed_inputs(T, H, density, grid)
    outs = {b: torch.empty_like(q) for b in BUILDS}
    od = torch.empty_like(q)
    d = res[name] = {}
    a, b = idx[..., 0::2, :].long(), idx[..., 1::2, :].long()  # adjacent lists (ascending, -1 padded)
    m = min(a.shape[-2], b.shape[-2])
    a, b = a[..., :m, :], b[..., :m, :]
    inter = ((a[..., :, None] == b[..., None, :]) & (a[..., :, None] >= 0)).any(-1).sum(-1).float()
    d["adjacent_shared_fraction"] = float((inter / (a >= 0).sum(-1).clamp(min=1)).mean())
    d["drop_ms"] = triton.testing.do_bench(lambda: CF.attention(q, k, v, od, st, idx, None, cd), rep=400)

    def call(b):
        import os
        pair, kv, vt, probe, share = BUILDS[b] + ("", False)[len(BUILDS[b]) - 3:]
        if vt:
            os.environ["PSA_CUTE_VT_STAGES"] = str(vt)
        CF.attention(q, k, v, outs[b], st, idx, vb, cp, kv_stages=kv, pair=pair, probe=probe, share=share)

    for r in range(2):
        for b in BUILDS:
            try:
                d[f"pwt_{b}_r{r}_ms"] = triton.testing.do_bench(lambda: call(b), rep=400)
            except Exception as e:  # a build that does not launch (shared memory) is reported, the rest still run
                d[f"pwt_{b}_error"] = f"{type(e).__name__}: {e}"[:300]
    for b in BUILDS:
        if f"pwt_{b}_error" not in d:
            d[f"{b}_maxdiff_vs_one"] = float((outs[b].float() - outs["one"].float()).abs().max())
            if b.startswith("p3share"):  # the same tiles in the same order per query block: 0 expected
                ref_b = b.replace("p3share", "p3")
                d[f"{b}_maxdiff_vs_{ref_b}"] = float((outs[b].float() - outs[ref_b].float()).abs().max())
        ms = [d.get(f"pwt_{b}_r{r}_ms") for r in range(2)]
        if all(isinstance(m, float) for m in ms):
            d[f"{b}_virtual_ms"] = sum(ms) / 2 - d["drop_ms"]
    print(name, d, flush=True)
    del q, k, v, st, idx, vb, outs, od
    torch.cuda.empty_cache()
print("RESULT " + json.dumps(res))

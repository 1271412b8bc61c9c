"""H200 probe: the peeled virtual loops (PSA_CUTE_VT_PEEL, PSA_TRITON_VT_PEEL) against the plain loops in the
attention kernels alone, under one precomputed routing (pwt, d 0.125, random bf16 [1, 40, T, 128]: 480p T 32760,
720p T 75600), alternated over PROBE_ROUNDS (default 5) rounds in one process: switch_ab.py's whole-operator rows
carry the statistics, routing, copies and host time around a ~1 ms difference, too noisy at 480p (session 17's A16:
rounds of one build 7.83-7.93 ms, of the other 7.93-8.46). Also the CuTe pwt kernel without its virtual tiles
(probe="novt") so each row's virtual part is pwt - novt. Other attention switches the same way: name them
(a PSA_CUTE_* switch times the CuTe kernel, any other the Triton one; session 17: PSA_CUTE_PINGPONG), and
PROBE_T=32760 keeps one size. Session 18: PROBE_DROP=1 also times the one-block drop kernel (the exact part's own
kernel) per CuTe switch (drop_op0 / drop_op1), and PROBE_BASE="PSA_A=1,PSA_B=0" sets switches under both arms
(a switch on top of another one). Session 21: a switch may name its two values, `PSA_NAME=a/b` (arm 0 sets a,
arm 1 sets b; e.g. PSA_CUTE_STAGES=4/5), and PROBE_NOVT1=1 also times the build without virtual tiles under arm 1
(novt1: each arm's exact loop). Prints one line `RESULT {...}`.

    python bench/probes/vt_peel_kernel.py [PSA_NAME ...]
"""
import importlib
import json
import os
import statistics
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, ".")
from kernels.config import SparseConfig  # noqa: E402
from kernels.triton import fwd as ktf  # noqa: E402
from kernels.triton import stats as kts  # noqa: E402

ROUNDS = int(os.environ.get("PROBE_ROUNDS", "5"))
DROP = os.environ.get("PROBE_DROP", "0") == "1"
for kv in filter(None, os.environ.get("PROBE_BASE", "").split(",")):
    os.environ[kv.split("=")[0]] = kv.split("=")[1]
try:
    kcf = importlib.import_module("kernels.cute.fwd")
    import cutlass.cute  # noqa: F401
except Exception as e:  # Triton rows only
    print("cute unavailable:", type(e).__name__, str(e)[:200], flush=True)
    kcf = None
ENVS = [a for a in sys.argv[1:] if a.startswith("PSA_")] or ["PSA_TRITON_VT_PEEL", "PSA_CUTE_VT_PEEL"]
NOVT1 = os.environ.get("PROBE_NOVT1", "0") == "1"


def arm_values(spec):
    """(variable, arm 0's value, arm 1's value) of a switch: PSA_X -> 0 / 1, PSA_X=a/b -> a / b."""
    name, _, vals = spec.partition("=")
    a, _, b = vals.partition("/")
    return (name, a, b) if vals else (name, "0", "1")


SIZES = [(n, t) for n, t in (("wan14", 32760), ("wan14_720", 75600))
         if str(t) in os.environ.get("PROBE_T", "32760,75600").split(",")]
res = {"rounds": ROUNDS, "envs": ENVS, "base": os.environ.get("PROBE_BASE", "")}
for name, T in SIZES:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 40, T, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cfg = SparseConfig(density=0.125, variant="pwt", band=1, n_sink_blocks=0, scale=128 ** -0.5)
    cfg_drop = SparseConfig(density=0.125, variant="drop", band=1, n_sink_blocks=0, scale=128 ** -0.5)
    st = kts.block_stats(q, k, v, cfg)
    idx, vbias = kts.route(st, cfg, q.dtype)
    if getattr(st, "hbar", None) is None and hasattr(kts, "finalize_hbar"):
        kts.finalize_hbar(st, -(-T // 64), q.dtype)
    out = torch.empty_like(q)
    rows = [("cute" if e.startswith("PSA_CUTE_") else "triton", e) for e in ENVS]
    rows = [(be, e) for be, e in rows if be == "triton" or kcf is not None]
    for be, env in rows:
        mod = kcf if be == "cute" else ktf
        call = lambda: mod.attention(q, k, v, out, st, idx, vbias, cfg)  # noqa: E731
        var, val0, val1 = arm_values(env)
        novt = lambda: kcf.attention(q, k, v, out, st, idx, vbias, cfg, probe="novt")  # noqa: E731
        ms = lambda f: do_bench(f, warmup=25, rep=300 if T < 50000 else 800, return_mode="median")  # noqa: E731
        d = res[f"{name}_{be}_{env}"] = {"T": T}
        outs = {}
        try:
            for r in range(ROUNDS):
                for op in ("0", "1"):
                    os.environ[var] = val1 if op == "1" else val0
                    call()
                    outs[op] = out.clone()
                    d[f"op{op}_r{r}_ms"] = ms(call)
                    if be == "cute" and DROP:  # the same exact tiles through the one-block kernel
                        drop = lambda: kcf.attention(q, k, v, out, st, idx, None, cfg_drop)  # noqa: E731
                        drop()
                        outs["drop" + op] = out.clone()
                        d[f"drop_op{op}_r{r}_ms"] = ms(drop)
                if be == "cute":
                    os.environ[var] = val0
                    d[f"novt_r{r}_ms"] = ms(novt)
                    if NOVT1:
                        os.environ[var] = val1
                        d[f"novt1_r{r}_ms"] = ms(novt)
            d["maxdiff"] = float((outs["0"].float() - outs["1"].float()).abs().max())
            d["rel_l2"] = float((outs["0"].double() - outs["1"].double()).norm() / outs["0"].double().norm())
            novts = (("novt", "novt1") if NOVT1 else ("novt",)) if be == "cute" else ()
            for op in ("0", "1") + novts:
                p = "" if op in novts else "op"
                d[f"{p}{op}_median_ms"] = statistics.median(d[f"{p}{op}_r{r}_ms"] for r in range(ROUNDS))
            d["op1_faster_rounds"] = sum(d[f"op1_r{r}_ms"] < d[f"op0_r{r}_ms"] for r in range(ROUNDS))
            if "drop0" in outs:
                d["drop_maxdiff"] = float((outs["drop0"].float() - outs["drop1"].float()).abs().max())
                for op in ("0", "1"):
                    d[f"drop_op{op}_median_ms"] = statistics.median(d[f"drop_op{op}_r{r}_ms"] for r in range(ROUNDS))
                d["drop_op1_faster_rounds"] = sum(d[f"drop_op1_r{r}_ms"] < d[f"drop_op0_r{r}_ms"]
                                                  for r in range(ROUNDS))
            if be == "cute":
                for op in ("0", "1"):
                    nv = "novt1" if op == "1" and NOVT1 else "novt"
                    d[f"virtual_op{op}_ms"] = d[f"op{op}_median_ms"] - d[f"{nv}_median_ms"]
        except Exception as e:
            d["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        os.environ.pop(var, None)
        print(name, be, env, json.dumps(d), flush=True)
    del q, k, v, st, idx, vbias, out
    torch.cuda.empty_cache()
print("RESULT " + json.dumps(res), flush=True)

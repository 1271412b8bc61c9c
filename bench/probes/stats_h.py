"""H200 probe (issue 11): the statistics in one pass (kernels/triton/stats_h.py, PSA_STATS_H=1) against the
statistics kernel + H-sum pass (PSA_STATS_H=0), alternated over PROBE_ROUNDS (default 3) rounds in one process.

Per shape (pwt, bf16, B1 D128, random N(0,1) inputs): `block_stats` as the operator calls it, each call captured in a
CUDA graph and its replay timed (GPU time, no host overhead), in three layouts: raster [B, H, T, D]; the node's
[B, L, H*D] memory seen as [B, H, L, D]; and the Morton path's gather (the node layout read through the Morton
permutation, k and v copied in block order: `gathered=(None, kg, vg)`, as the Triton backend does it; `kvq`: q
copied too, as CuTe does). The bound is one read of q, k and v (+ the copies' writes) at the card's copy bandwidth
(measured first, as bench/pieces.py does). Also: both builds' outputs against each other and H-bar against float64,
on random inputs and on keys with a large common offset (the raw K^T V minus its correction cancels there),
then sweeps of the pipeline depth (PSA_STATS_H_STAGES; the gathered call's, STATS_H_PERM_EXTRA), warps (8, 16) and
programs per head (STATS_H_PARTS) at 480p and FLUX.1.
Prints `RESULT {...}` last. Session 14 ran two A/Bs with temporary modes of this probe: session 14's first loop
against session 13's kernel (bench/results/stats_h_s14_h200.txt: op0 / op1 = old / new) and that loop with two
programs per block range (stats_h_split_s14_h200.txt: op0 / op1 = one / two programs, measured slower, removed).

    python bench/probes/stats_h.py [--shapes wan14,wan14_720,wan13,flux] [--no-sweep]
"""
import json
import math
import os
import statistics
import sys

import torch
import triton

sys.path.insert(0, ".")
from kernels.config import SparseConfig  # noqa: E402
from kernels.reorder import full_order, orders_on  # noqa: E402
from kernels.routing import block_stats as ref_stats  # noqa: E402
from kernels.triton import stats as kts  # noqa: E402
from kernels.triton import stats_h  # noqa: E402

ROUNDS = int(os.environ.get("PROBE_ROUNDS", "3"))
# op0 / op1 = this variable at 0 / 1 (default PSA_STATS_H: the two passes / the one pass). Session 15 ran it on
# PSA_STATS_H_COLT, a build (since removed) with the column sums as [D, 16] warpgroup-MMA tiles: slower
# (bench/results/stats_h_colt_s15_h200.txt)
SWITCH = os.environ.get("PROBE_SWITCH", "PSA_STATS_H")
SHAPES = {"wan14": (40, (21, 30, 52)), "wan14_720": (40, (21, 45, 80)), "wan13": (12, (21, 30, 52)),
          "flux": (24, (64, 64))}
arg = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--shapes=")), None)
if "--shapes" in sys.argv:
    arg = sys.argv[sys.argv.index("--shapes") + 1]
names = arg.split(",") if arg else list(SHAPES)
res = {"rounds": ROUNDS, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
       "triton": triton.__version__}


def replay_ms(fn):
    """GPU time of fn() from a CUDA graph's replays (median of do_bench)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    t = triton.testing.do_bench(g.replay, warmup=25, rep=200)
    del g
    return t


def copy_tbps():
    x = torch.empty(2 ** 30 // 2, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    t = triton.testing.do_bench(lambda: y.copy_(x), warmup=25, rep=200)
    return 2 * x.numel() * 2 / t / 1e9


def stats_call(q, k, v, cfg, layout, perm, copies):
    if layout == "raster" or layout == "node":
        return lambda: kts.block_stats(q, k, v, cfg)
    qg = copies[0] if layout == "gather_kvq" else None
    return lambda: kts.block_stats(q, k, v, cfg, perm=perm, gathered=(qg, copies[1], copies[2]))


def outputs(st):
    kts.finalize_hbar(st, st.kbar.shape[-2], torch.bfloat16)
    return {n: getattr(st, n).float() for n in ("kbar", "qbar", "q2", "ksig2", "kbar_lp", "vmean_lp", "hbar")}


tbps = copy_tbps()
res["copy_TBps"] = tbps
print("copy TB/s", round(tbps, 3), flush=True)
cfg = SparseConfig(density=0.125, variant="pwt", scale=128 ** -0.5)
for name in names:
    H, grid = SHAPES[name]
    T, D = math.prod(grid), 128
    torch.manual_seed(0)
    d = res[name] = {"H": H, "T": T}
    xs = [torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    node = [x.transpose(1, 2) for x in xs]
    raster = [x.transpose(1, 2).contiguous() for x in xs]
    perm = full_order(orders_on(grid, "cuda")[0], 0)
    copies = torch.empty(3, 1, H, T, D, device="cuda", dtype=torch.bfloat16)
    qkv_bytes = 3 * T * H * D * 2
    for layout in ("raster", "node", "gather_kv", "gather_kvq"):
        q, k, v = raster if layout == "raster" else node
        call = stats_call(q, k, v, cfg, layout, perm, copies)
        writes = {"gather_kv": 2, "gather_kvq": 3}.get(layout, 0) * qkv_bytes // 3
        outs = {}
        for r in range(ROUNDS):
            for op in ("0", "1"):
                os.environ[SWITCH] = op
                if r == 0:
                    outs[op] = outputs(call())
                d[f"{layout}_op{op}_r{r}_ms"] = replay_ms(call)
        for op in ("0", "1"):
            m = statistics.median(d[f"{layout}_op{op}_r{r}_ms"] for r in range(ROUNDS))
            d[f"{layout}_op{op}_ms"] = m
            d[f"{layout}_op{op}_pct_of_bound"] = 100 * (qkv_bytes + writes) / (tbps * 1e12) * 1e3 / m
        d[f"{layout}_maxreldiff"] = {n: float((outs["1"][n] - outs["0"][n]).abs().max()
                                              / outs["0"][n].abs().max().clamp_min(1e-30)) for n in outs["0"]}
        print(name, layout, {kk: round(vv, 4) for kk, vv in d.items() if kk.startswith(layout) and kk.endswith(
            ("op0_ms", "op1_ms", "pct_of_bound"))}, d[f"{layout}_maxreldiff"], flush=True)
    # H-bar against float64, random keys and keys with a common offset of 4 (the raw sum's cancellation)
    q, k, v = raster
    for tag, kk in (("random", k), ("offset4", k + 4.0)):
        ref = ref_stats(q.double(), kk.double(), v.double(), 64)
        for op in ("0", "1"):
            os.environ[SWITCH] = op
            st = kts.block_stats(q, kk, v, cfg)
            kts.finalize_hbar(st, st.kbar.shape[-2], torch.bfloat16)
            d[f"hbar_rel_{tag}_op{op}"] = float((st.hbar.double() - ref.hbar).norm() / ref.hbar.norm())
            d[f"ksig2_rel_{tag}_op{op}"] = float((st.ksig2.double() - ref.ksig2).norm() / ref.ksig2.norm())
            d[f"q2_rel_{tag}_op{op}"] = float((st.q2.double() - ref.q2).norm() / ref.q2.norm())
        del ref
        torch.cuda.empty_cache()
    print(name, "vs float64", {kk: vv for kk, vv in d.items() if "_rel_" in kk}, flush=True)
    if "--no-sweep" not in sys.argv and name in ("wan14", "flux"):
        os.environ["PSA_STATS_H"] = "1"
        call = stats_call(q, k, v, cfg, "raster", perm, copies)
        keep = (stats_h.STATS_H_STAGES, stats_h.STATS_H_PARTS, stats_h.STATS_H_WARPS)
        try:
            for warps in (8, 16):
                stats_h.STATS_H_WARPS = warps
                for lay in ("raster", "gather_kv"):
                    c2 = stats_call(*(raster if lay == "raster" else node), cfg, lay, perm, copies)
                    d[f"sweep_warps{warps}_{lay}_ms"] = replay_ms(c2)
            stats_h.STATS_H_WARPS = keep[2]
            for stages in (2, 3, 4):
                stats_h.STATS_H_STAGES = stages
                try:
                    d[f"sweep_stages{stages}_ms"] = replay_ms(call)
                except Exception as e:  # shared memory
                    d[f"sweep_stages{stages}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            stats_h.STATS_H_STAGES = keep[0]
            # the permuted loop's depth (PSA_STATS_PERM_DEEP, session 24): the gathered call (q, k, v copied, as
            # CuTe's Morton path) at STATS_H_STAGES + extra stages (sm_90a: 3 -> one tile buffer, 5 -> two, 7 -> three)
            keep_deep, keep_extra = os.environ.get("PSA_STATS_PERM_DEEP"), stats_h.STATS_H_PERM_EXTRA
            os.environ["PSA_STATS_PERM_DEEP"] = "1"
            try:
                c3 = stats_call(*node, cfg, "gather_kvq", perm, copies)
                for extra in (0, 2, 4):
                    stats_h.STATS_H_PERM_EXTRA = extra
                    d[f"sweep_perm_stages{keep[0] + extra}_ms"] = replay_ms(c3)
            finally:
                stats_h.STATS_H_PERM_EXTRA = keep_extra
                if keep_deep is None:
                    os.environ.pop("PSA_STATS_PERM_DEEP", None)
                else:
                    os.environ["PSA_STATS_PERM_DEEP"] = keep_deep
            d["auto_parts"] = stats_h.parts_per_head(-(-T // 64), H, torch.cuda.get_device_properties(0)
                                                     .multi_processor_count)
            for parts in (2, 3, 4, 6, 8, 10, 13, 16, 20, 26, 32):
                stats_h.STATS_H_PARTS = parts
                d[f"sweep_parts{parts}_ms"] = replay_ms(call)
        finally:
            stats_h.STATS_H_STAGES, stats_h.STATS_H_PARTS, stats_h.STATS_H_WARPS = keep
        print(name, "sweep", {kk: (round(vv, 4) if isinstance(vv, float) else vv) for kk, vv in d.items()
                              if kk.startswith("sweep") or kk == "auto_parts"}, flush=True)
    del xs, node, raster, copies, q, k, v
    torch.cuda.empty_cache()
os.environ.pop(SWITCH, None)
print("RESULT " + json.dumps(res), flush=True)

"""H200 probe: PSA_CUTE_PAIR_OUT_PERM's two pieces on their own (switch_ab.py's whole Morton call moves by ~4% between
rounds, replayed or not, around a ~2% effect). Under one routing (pwt d 0.125, random bf16 [1, 40, T, 128], the
Morton order of Wan2.1-14B's [21, 30, 52] / [21, 45, 80] grid, no prefix), alternated over PROBE_ROUNDS (default 5)
rounds: arm 0 = the pair kernel writing its block-order output (`kernel0`) then the scatter into the caller's
[B, T, H, D] layout (`scatter`; `total0` = both, timed as one), arm 1 = the pair kernel writing the output rows
through the permutation into that layout (`kernel1` = `total1`). Both arms' results compared bitwise. With
PROBE_NOSTORE=1 also `kernel0_bthd` (the pair kernel writing the caller's layout in block order, no permutation) and
`nostore` (the pair kernel with its epilogue's stores skipped, fwd_pair.py probe "nostore": what the stores cost).
Prints `RESULT {...}` last.

    python bench/probes/out_perm_kernel.py
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
from kernels.layout import bthd_empty  # noqa: E402
from kernels.reorder import full_order, orders_on  # noqa: E402
from kernels.triton import _scatter_into  # noqa: E402
from kernels.triton import stats as kts  # noqa: E402

ROUNDS = int(os.environ.get("PROBE_ROUNDS", "5"))
NOSTORE = os.environ.get("PROBE_NOSTORE", "0") == "1"
res = {"rounds": ROUNDS}
for name, grid in (("wan14", (21, 30, 52)), ("wan14_720", (21, 45, 80))):
    T = grid[0] * grid[1] * grid[2]
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 40, T, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cfg = SparseConfig(density=0.125, variant="pwt", band=1, n_sink_blocks=0, scale=128 ** -0.5)
    st = kts.block_stats(q, k, v, cfg)
    idx, vbias = kts.route(st, cfg, q.dtype)
    if getattr(st, "hbar", None) is None and hasattr(kts, "finalize_hbar"):
        kts.finalize_hbar(st, -(-T // 64), q.dtype)
    perm, _ = orders_on(grid, "cuda")
    fperm = full_order(perm, 0)
    blk = torch.empty_like(q)  # the block-order output (the node path writes it over the q copy)
    dst = bthd_empty(q.shape, q.device, q.dtype)  # the caller's layout
    os.environ["PSA_CUTE_PAIR"] = "1"

    def kernel0():
        kcf.attention(q, k, v, blk, st, idx, vbias, cfg)

    def scatter():
        _scatter_into(blk, perm, 0, dst)

    def total0():
        kernel0()
        scatter()

    def kernel1():
        kcf.attention(q, k, v, dst, st, idx, vbias, cfg, perm=fperm)

    def kernel0_bthd():
        kcf.attention(q, k, v, dst, st, idx, vbias, cfg)

    def nostore():
        kcf.attention(q, k, v, blk, st, idx, vbias, cfg, probe="nostore")

    arms = (kernel0, scatter, total0, kernel1) + ((kernel0_bthd, nostore) if NOSTORE else ())
    ms = lambda f: do_bench(f, warmup=25, rep=300 if T < 50000 else 800, return_mode="median")  # noqa: E731
    d = res[name] = {"T": T}
    try:
        total0()
        a = dst.clone()
        kernel1()
        d["maxdiff"] = float((a.float() - dst.float()).abs().max())
        for r in range(ROUNDS):
            for f in (arms if r % 2 == 0 else arms[::-1]):
                d.setdefault(f.__name__, []).append(round(ms(f), 4))
        for f in arms:
            d[f.__name__ + "_median_ms"] = statistics.median(d[f.__name__])
        d["arm1_faster_rounds"] = sum(b < a for a, b in zip(d["total0"], d["kernel1"]))
        d["kernel1_faster_than_kernel0_rounds"] = sum(b < a for a, b in zip(d["kernel0"], d["kernel1"]))
    except Exception as e:  # noqa: BLE001
        d["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    print(name, json.dumps(d), flush=True)
    del q, k, v, st, idx, vbias, blk, dst
    torch.cuda.empty_cache()
print("RESULT " + json.dumps(res), flush=True)

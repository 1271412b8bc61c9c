"""The main job on an embedded default: dense vs drop vs PISA vs PWT on a DiT-like attention problem.

    python bench/demo.py            # CPU: a small Wan-like grid; GPU: the Wan2.1-1.3B 480p shape

No downloads: q, k, v come from kernels.synthetic (smooth fields + 3D RoPE on a Wan-like token grid).
Prints the relative L2 error of each variant against dense attention, with and without Morton reorder,
and the time per call of every backend that can run here.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kernels import backend_status, piecewise_sparse_attention as psa  # noqa: E402
from kernels.synthetic import dit_like_qkv  # noqa: E402


def timed(fn, device, reps):
    fn()  # warm-up (compilation, caches)
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(reps):
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--grid", default=None, help="F,H,W token grid (default: 21,30,52 on GPU, 6,16,24 on CPU)")
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--densities", default="0.125,0.25,0.5")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    grid = tuple(int(x) for x in (args.grid or ("21,30,52" if gpu else "6,16,24")).split(","))
    heads = args.heads or (12 if gpu else 4)
    dtype = torch.bfloat16 if gpu else torch.float32
    densities = [float(x) for x in args.densities.split(",")]
    q, k, v = dit_like_qkv(grid, heads=heads, head_dim=128, dtype=dtype, device=device)
    T = q.shape[2]
    print(f"DiT-like problem: grid {grid} -> B1 H{heads} T{T} D128 {str(dtype).replace('torch.', '')} on "
          f"{torch.cuda.get_device_name(device) if gpu else 'CPU'}; torch {torch.__version__}")
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())

    def err(out):
        return ((out.float() - ref).norm() / ref.norm()).item()

    print("\nRelative L2 error against dense attention (lower is better; torch reference backend)")
    print(f"{'density':>8} {'reorder':>8} | {'drop':>8} {'pisa':>8} {'pwt':>8}")
    for d in densities:
        for reorder in ("none", "morton"):
            row = [err(psa(q, k, v, density=d, variant=var, reorder=reorder, grid=grid, backend="torch"))
                   for var in ("drop", "pisa", "pwt")]
            print(f"{d:>8.3f} {reorder:>8} | " + " ".join(f"{e:>8.4f}" for e in row))

    status = backend_status(q)
    reps = 20 if gpu else 3
    print(f"\nTime per call, median of {reps} (ms); pwt with Morton; dense = torch SDPA")
    dense_ms = timed(lambda: F.scaled_dot_product_attention(q, k, v), device, reps)
    print(f"{'backend':>8} {'density':>8} {'ms':>9} {'vs dense':>9}  error")
    print(f"{'dense':>8} {1.0:>8.3f} {dense_ms:>9.2f} {1.0:>8.2f}x  0")
    for name in ("torch", "triton", "cute"):
        if status[name] is not None:
            print(f"{name:>8}  not run here: {status[name]}")
            continue
        for d in densities:
            def call():
                return psa(q, k, v, density=d, variant="pwt", reorder="morton", grid=grid, backend=name)
            ms = timed(call, device, reps if name != "torch" else min(reps, 5))
            print(f"{name:>8} {d:>8.3f} {ms:>9.2f} {dense_ms / ms:>8.2f}x  {err(call()):.4f}")


if __name__ == "__main__":
    main()

"""Time the probe build of the CuTe kernel (drop, Wan2.1-14B 480p) in its three modes: full, loads, compute.

On an SM90 GPU with nvidia-cutlass-dsl, from the repository root:
    git show 7f8e182:kernels/cute/fwd.py > bench/probes/fwd_probe.py
    patch bench/probes/fwd_probe.py bench/probes/cute_loads_compute.patch
    python bench/probes/run_cute_probe.py
loads ~ full: the L2 -> SM tile stream bounds the kernel; compute ~ full: the consumer does. Measured on the H200
(bench/results/cute_iterations_h200.md): full 5.63-5.81, loads 4.80-4.82, compute 4.85-4.86 ms at density 0.125.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository root (kernels)
sys.path.insert(0, os.path.dirname(HERE))  # bench/ (bench_attention)
sys.path.insert(0, HERE)  # fwd_probe.py

import torch  # noqa: E402

from kernels.config import SparseConfig  # noqa: E402
from kernels.triton import prepare  # noqa: E402
from bench_attention import event_ms as timeit  # noqa: E402


def main():
    import fwd_probe as P  # the patched copy (see the module docstring)

    B, H, T = 1, 40, 32760
    q = torch.randn(B, H, T, 128, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    for d in (0.125, 0.25):
        cfg = SparseConfig(density=d, variant="drop", scale=128 ** -0.5)
        st, idx, _ = prepare(q, k, v, cfg)
        o = torch.empty_like(q)
        line = f"wan14b random drop d{d}:"
        for mode in ("full", "loads", "compute"):
            for stg in (4, 5):
                t = timeit(lambda: P.attention(q, k, v, o, st, idx, None, cfg, kv_stages=stg, mode=mode))
                line += f" {mode}/s{stg} {t:.2f} ms |"
        print(line, flush=True)


if __name__ == "__main__":
    main()

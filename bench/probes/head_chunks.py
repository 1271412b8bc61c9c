"""Full operator vs head-chunk size (Wan2.1-14B 480p pwt/drop at 0.125, both backends) and the 720p breakdown:
the measurement behind kernels.triton._heads_per_chunk (bench/results/cute_iterations_h200.md). From the repository
root on an SM90 GPU with nvidia-cutlass-dsl: python bench/probes/head_chunks.py"""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_attention import event_ms  # noqa: E402
import torch
import kernels.triton as kt
import kernels.cute as kc
from kernels.config import SparseConfig
orig = kt._heads_per_chunk
def timeit(f, n=20):
    return event_ms(f, n)
for T, H in ((32760, 40),):
    q = torch.randn(1, H, T, 128, device="cuda", dtype=torch.bfloat16); k = torch.randn_like(q); v = torch.randn_like(q)
    for variant in ("pwt", "drop"):
        cfg = SparseConfig(density=0.125, variant=variant, scale=128 ** -0.5)
        kt.forward(q, k, v, cfg); kc.forward(q, k, v, cfg); torch.cuda.synchronize()
        n = -(-T // 64)
        print(f"T{T} H{H} {variant}: new default hc = {orig(1, H, T, 128, cfg, 2, 64 + 3, 0.10)}", flush=True)
        for rnd in range(2):
            line = f"  round {rnd}:"
            for hc in (10, 11, 14, 20, 40):
                kt._heads_per_chunk = lambda *a, hc=hc: hc
                line += f" hc{hc} tri {timeit(lambda: kt.forward(q, k, v, cfg)):.2f} cute {timeit(lambda: kc.forward(q, k, v, cfg)):.2f} |"
            kt._heads_per_chunk = orig
            print(line, flush=True)
    del q, k, v
T, H = 75600, 40
q = torch.randn(1, H, T, 128, device="cuda", dtype=torch.bfloat16); k = torch.randn_like(q); v = torch.randn_like(q)
cfg = SparseConfig(density=0.125, variant="pwt", scale=128 ** -0.5)
kt.forward(q, k, v, cfg); torch.cuda.synchronize()
print("720p pwt default hc", orig(1, H, T, 128, cfg, 2, 148 + 3, 0.10), flush=True)
for hc in (2, 4, 8):
    kt._heads_per_chunk = lambda *a, hc=hc: hc
    try:
        print(f"  hc{hc} tri {timeit(lambda: kt.forward(q, k, v, cfg), 5):.2f} ms  peak {torch.cuda.max_memory_allocated()/2**30:.1f} GiB", flush=True)
    except Exception as e:
        print("  hc", hc, "failed", e)
kt._heads_per_chunk = orig
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]) as p:
    kt.forward(q, k, v, cfg); torch.cuda.synchronize()
print(p.key_averages().table(sort_by="cuda_time_total", row_limit=16, max_name_column_width=50), flush=True)

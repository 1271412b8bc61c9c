"""torch.sort of the top-k lists as int64 / int16 / int32 at the 720p chunk shape, and the 720p pwt Triton full operator
with the old (int64) and new (int16) sort. From the repository root on a CUDA GPU: python bench/probes/route_sort_720p.py"""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_attention import event_ms  # noqa: E402
import torch
import kernels.triton as kt
from kernels.triton import stats as S
from kernels.config import SparseConfig
new_rt = S.route_torch
def old_rt(st, cfg, dtype):
    # the previous tail: sort int64 indices
    orig_sort = torch.sort
    def sort64(x, dim=-1):
        return orig_sort(x.long(), dim=dim)
    torch.sort = sort64
    try:
        return new_rt(st, cfg, dtype)
    finally:
        torch.sort = orig_sort
timeit = event_ms
top = torch.randint(0, 1182, (1, 3, 1182, 148), device="cuda")
print(f"sort [1,3,1182,148]: int64 {timeit(lambda: torch.sort(top, dim=-1), 50)*1e3:.1f} us, int16 {timeit(lambda: torch.sort(top.to(torch.int16), dim=-1), 50)*1e3:.1f} us, int32 {timeit(lambda: torch.sort(top.to(torch.int32), dim=-1), 50)*1e3:.1f} us", flush=True)
T, H = 75600, 40
q = torch.randn(1, H, T, 128, device="cuda", dtype=torch.bfloat16); k = torch.randn_like(q); v = torch.randn_like(q)
cfg = SparseConfig(density=0.125, variant="pwt", scale=128 ** -0.5)
a = kt.forward(q, k, v, cfg)
S.route_torch = old_rt; b = kt.forward(q, k, v, cfg); S.route_torch = new_rt
print("720p outputs equal:", bool(torch.equal(a, b)), flush=True)
for rnd in range(2):
    S.route_torch = old_rt; t_old = timeit(lambda: kt.forward(q, k, v, cfg), 5)
    S.route_torch = new_rt; t_new = timeit(lambda: kt.forward(q, k, v, cfg), 5)
    print(f"720p pwt triton full: int64 sort {t_old:.2f} ms, int16 sort {t_new:.2f} ms", flush=True)

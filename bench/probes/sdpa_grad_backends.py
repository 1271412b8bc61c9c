"""GPU probe (session 32): PyTorch's own bf16 SDPA gradient error on the backward tests' DiT-like input, computed on
the whole [B, H, T, D] tensor, per head as [T, D] matrices (session 31's test baseline: another SDPA backend) and per
head as [1, 1, T, D] slices (tests/gpu_common.sdpa_grads since session 32), each against float64. Session 32 on an
H100: 1.61e-2 / 3.47e-3 / 2.33e-3 (dq / dk / dv) whole and as 4-D slices, 1.66e-3 for all three as [T, D].

    python bench/probes/sdpa_grad_backends.py
"""
import sys

import torch
import torch.nn.functional as F

ROOT = __file__.rsplit("/bench/", 1)[0]
sys.path[:0] = [ROOT + "/tests", ROOT]
from gpu_common import rel, rnd, sdpa_grads  # noqa: E402
from kernels.synthetic import dit_like_qkv  # noqa: E402

q, k, v = dit_like_qkv((8, 32, 32), heads=2, head_dim=128, dtype=torch.bfloat16, device="cuda")
do = rnd(q.shape, q.dtype, seed=5)  # tests/test_backward_gpu.check_grads's


def whole(dtype):
    x = [t.to(dtype).requires_grad_(True) for t in (q, k, v)]
    return torch.autograd.grad(F.scaled_dot_product_attention(*x), x, do.to(dtype))


def per_head_matrices(dtype):
    out = [torch.empty(t.shape, dtype=dtype, device=t.device) for t in (q, k, v)]
    for h in range(q.shape[1]):
        x = [t[0, h].to(dtype).requires_grad_(True) for t in (q, k, v)]
        for o, g in zip(out, torch.autograd.grad(F.scaled_dot_product_attention(*x), x, do[0, h].to(dtype))):
            o[0, h] = g
    return out


ref = sdpa_grads(q, k, v, do, torch.float64)
for name, fn in (("whole [B, H, T, D]", whole), ("per head [T, D]", per_head_matrices),
                 ("per head [1, 1, T, D] (sdpa_grads)", lambda d: sdpa_grads(q, k, v, do, d))):
    print(name, " ".join("%s %.3e" % (n, rel(a, b)) for n, a, b in zip(("dq", "dk", "dv"), fn(torch.bfloat16), ref)))

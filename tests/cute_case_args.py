"""The CuTe kernels' traced arguments at a tiny shape (B1 H2 T1000 D128, zeros: only their types and layouts matter
to a compile), shared by tests/cute_compile_case.py and bench/probes/cute_sass_loops.py."""
import torch

B, H, T, D = 1, 2, 1000, 128


def kernel_args(F, vbias=None):
    """(tensor arguments, scalar arguments) of kernels.cute.fwd's kernels (F: that module); vbias: the [B, H, n, n]
    bias rows to trace with (float16 zeros by default)."""
    import cutlass
    n = -(-T // F.BS)
    x = torch.zeros(B, H, T, D, dtype=torch.bfloat16)
    kb = torch.zeros(B, H, n, D, dtype=torch.bfloat16)
    hb = torch.zeros(B, H, D, D, dtype=torch.bfloat16)
    vb = torch.zeros(B, H, n, n, dtype=torch.float16) if vbias is None else vbias
    idx = torch.zeros(B, H, n, 4, dtype=torch.int32)
    perm = torch.zeros(T, dtype=torch.int32)
    args = [F._cute(t) for t in (x, x, x, x, kb, kb, hb)]
    args += [F.from_dlpack(vb, assumed_align=vb.element_size()).mark_layout_dynamic(leading_dim=3),
             F.from_dlpack(idx, assumed_align=4).mark_layout_dynamic(leading_dim=3),
             F.from_dlpack(perm, assumed_align=4).mark_layout_dynamic(leading_dim=0)]
    return args, [cutlass.Int32(1), cutlass.Float32(0.1), cutlass.Float32(0.1)]

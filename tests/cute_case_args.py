"""The CuTe kernels' traced arguments at a tiny shape (B1 H2 T1000 D128, zeros: only their types and layouts matter
to a compile), shared by tests/cute_compile_case.py and bench/probes/cute_sass_loops.py."""
import torch

B, H, T, D = 1, 2, 1000, 128


def kernel_args(F, vbias=None, cube=False):
    """(tensor arguments, scalar arguments) of kernels.cute.fwd's kernels (F: that module); vbias: the [B, H, n, n]
    bias rows to trace with (float16 zeros by default); cube: fwd_cube.CubePairFwdSm90's (the out argument and the
    caller's q, k, v in the [B, L, H * D] layout, a 5 x 8 x 25 grid's scalars)."""
    import cutlass
    n = -(-T // F.BS)
    x = torch.zeros(B, H, T, D, dtype=torch.bfloat16)
    kb = torch.zeros(B, H, n, D, dtype=torch.bfloat16)
    hb = torch.zeros(B, H, D, D, dtype=torch.bfloat16)
    vb = torch.zeros(B, H, n, n, dtype=torch.float16) if vbias is None else vbias
    idx = torch.zeros(B, H, n, 4, dtype=torch.int32)
    perm = torch.zeros(T, dtype=torch.int32)
    raw = torch.zeros(B, T, H, D, dtype=torch.bfloat16).transpose(1, 2)
    args = [F._cute(t) for t in (x, x, x, raw if cube else x, kb, kb, hb)]
    args += [F.from_dlpack(vb, assumed_align=vb.element_size()).mark_layout_dynamic(leading_dim=3),
             F.from_dlpack(idx, assumed_align=4).mark_layout_dynamic(leading_dim=3),
             F.from_dlpack(perm, assumed_align=4).mark_layout_dynamic(leading_dim=0)]
    scal = [cutlass.Int32(1), cutlass.Float32(0.1), cutlass.Float32(0.1)]
    if cube:  # (T = 5 x 8 x 25: n_cube 12, W 25, H 8, and 6 x 2 x 1 whole cubes)
        args += [F._cute(raw) for _ in range(3)]
        scal += [cutlass.Int32(v) for v in (12, 25, 8, 6, 2, 1)]
    return args, scal

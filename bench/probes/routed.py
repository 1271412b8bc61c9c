"""Shared set-up of the CuTe attention probes (bias_l2.py, cute_pair.py): random bf16 q, k, v at a Wan2.1-14B shape
(B1 H40 D128) with the Triton backend's statistics and routing for pwt at density 0.125, band 1, and the matching
drop config (the exact part alone)."""
import torch

from kernels.config import SparseConfig
from kernels.triton import stats as kts


def routed_inputs(T: int, heads: int = 40, density: float = 0.125, grid=None):
    """(q, k, v, pwt config, drop config, statistics, idx, vbias) on the current CUDA device; grid (F, H, W):
    DiT-like inputs (kernels/synthetic.py) on that token grid in Morton order instead of random ones."""
    if grid is None:
        q, k, v = (torch.randn(1, heads, T, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    else:
        from kernels.reorder import apply_reorder, orders_on
        from kernels.synthetic import dit_like_qkv
        perm, _ = orders_on(grid, "cuda")
        q, k, v = (apply_reorder(x, perm).contiguous()
                   for x in dit_like_qkv(grid, heads=heads, head_dim=128, dtype=torch.bfloat16, device="cuda"))
        assert q.shape[2] == T, (q.shape, T)
    cp, cd = (SparseConfig(density=density, variant=var, band=1, n_sink_blocks=0, cov_bias=False, scale=128 ** -0.5)
              for var in ("pwt", "drop"))
    st = kts.block_stats(q, k, v, cp)
    idx, vb = kts.route(st, cp, q.dtype)
    return q, k, v, cp, cd, st, idx, vb

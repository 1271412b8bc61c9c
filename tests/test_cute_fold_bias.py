"""kernels/cute/fwd_pair.fold_bias on CPU: the folded bias rows the pair kernel reads instead of converting, scaling
and count-weighting each column itself (log2 units, + log2 of each KV block's token count, -inf past N). Checked
against that formula in float64; exact blocks (-inf) stay -inf. Skipped (one line) without nvidia-cutlass-dsl, the
module's import."""
import math

import pytest
import torch

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (pip install .[cute])")


@pytest.mark.parametrize("T", [1000, 4096, 100, 64])
def test_fold_bias_matches_the_formula(T):
    from kernels.cute.fwd_pair import fold_bias
    n = -(-T // 64)
    n_last = T - (n - 1) * 64
    width = -(-n // 64) * 64
    g = torch.Generator().manual_seed(T)
    vb = (torch.randn(2, 3, n, n, generator=g) * 3).to(torch.float16)
    vb[torch.rand(2, 3, n, n, generator=g) < 0.2] = float("-inf")  # routed (exact) blocks
    vb_view = torch.cat([vb, torch.zeros(2, 3, n, 1, dtype=vb.dtype)], dim=-1)[..., :n]  # route()'s N+1 wide buffer
    out = fold_bias(vb_view, n_last, width)
    assert out.shape == (2, 3, n, width) and out.dtype == torch.float32
    cnt = torch.full((n,), 64.0, dtype=torch.float64)
    cnt[-1] = n_last
    want = vb.double() / math.log(2) + torch.log2(cnt)
    body = out[..., :n].double()
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(body), fin)
    assert (body[fin] - want[fin]).abs().max().item() < 1e-5 * (1 + want[fin].abs().max().item())
    assert torch.isneginf(out[..., n:]).all()

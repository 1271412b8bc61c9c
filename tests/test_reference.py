"""The PyTorch reference against dense attention and against a from-scratch brute force of MATH.md."""
import math

import pytest
import torch
import torch.nn.functional as F

from kernels import piecewise_sparse_attention as psa
from kernels import reference
from kernels.config import SparseConfig
from kernels.routing import block_stats, pwt_bonus, route
from kernels.synthetic import dit_like_qkv

from bruteforce import bruteforce  # noqa: E402  (tests/ is on sys.path under importlib mode via conftest)

VARIANTS = ["pwt", "pisa", "drop"]


def rand(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("T", [1, 63, 64, 200, 1000])
def test_density_one_equals_dense_attention(variant, T):
    q, k, v = (rand(2, 3, T, 32, seed=s) for s in range(3))
    out = psa(q, k, v, density=1.0, variant=variant, backend="torch")
    ref = F.scaled_dot_product_attention(q, k, v)
    assert out.dtype == torch.float64 and out.shape == q.shape
    assert (out - ref).abs().max().item() <= 1e-10


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("T,bs,density,band,sinks,cov", [
    (200, 32, 0.3, 1, 0, False),   # T not a multiple of the block
    (113, 16, 0.25, 0, 1, False),  # one-token last block, a sink block
    (129, 64, 0.34, 0, 0, False),  # one-token last block at the default block size
    (160, 16, 0.2, 2, 0, True),    # cov_bias routing
])
def test_variant_equals_bruteforce_of_math_md(variant, T, bs, density, band, sinks, cov):
    q, k, v = (rand(1, 2, T, 16, seed=10 + s) for s in range(3))
    out = psa(q, k, v, density=density, variant=variant, band=band, n_sink_blocks=sinks, cov_bias=cov,
              block_size=bs, backend="torch")
    ref = bruteforce(q, k, v, density=density, variant=variant, band=band, n_sink_blocks=sinks, cov_bias=cov,
                     block_size=bs)
    assert (out - ref).abs().max().item() <= 1e-10


def test_pwt_gate_falls_back_to_pisa_when_w_exceeds_ln_b():
    # huge key variance in every block: w_ij > ln Bs everywhere, so the term is gated to 0 and the
    # ranking bonus is the constant ln Bs: PWT must reproduce PISA exactly.
    T, bs = 256, 32
    q = rand(1, 1, T, 16, seed=1) * 3
    k = rand(1, 1, T, 16, seed=2) * 30
    v = rand(1, 1, T, 16, seed=3)
    cfg = SparseConfig(density=0.25, variant="pwt", block_size=bs, scale=16 ** -0.5)
    stats = block_stats(q, k, v, bs)
    w = 0.5 * cfg.scale ** 2 * (stats.q2 @ stats.ksig2.transpose(-1, -2))
    assert (w > math.log(bs)).all()
    w_gated, w_rank = pwt_bonus(stats, cfg.scale, bs)
    assert (w_gated == 0).all() and torch.allclose(w_rank, torch.full_like(w_rank, math.log(bs)))
    a = psa(q, k, v, density=0.25, variant="pwt", block_size=bs, backend="torch")
    b = psa(q, k, v, density=0.25, variant="pisa", block_size=bs, backend="torch")
    assert (a - b).abs().max().item() <= 1e-12


def test_pwt_gate_is_per_block():
    # one block with a wild key variance is gated (behaves like PISA), the others keep their bonus
    T, bs = 256, 32
    q, k, v = (rand(1, 1, T, 16, seed=s) for s in (4, 5, 6))
    k[..., 64:96, :] *= 40
    stats = block_stats(q, k, v, bs)
    w_gated, w_rank = pwt_bonus(stats, 0.25, bs)
    w = 0.5 * 0.25 ** 2 * (stats.q2 @ stats.ksig2.transpose(-1, -2))
    assert (w[..., 2] > math.log(bs)).all() and (w_gated[..., 2] == 0).all()
    assert (w_rank[..., 2] == math.log(bs)).all()
    others = [j for j in range(8) if j != 2]
    assert torch.equal(w_gated[..., others], w[..., others]) and (w[..., others] < math.log(bs)).all()


@pytest.mark.parametrize("density,band,sinks", [(0.125, 1, 0), (0.05, 2, 3), (0.5, 0, 1), (0.01, 4, 0)])
def test_forced_blocks_always_exact_and_density_is_the_true_exact_fraction(density, band, sinks):
    T, bs = 40 * 16 + 5, 16
    q, k, v = (rand(2, 2, T, 16, seed=s) for s in (7, 8, 9))
    cfg = SparseConfig(density=density, variant="pwt", band=band, n_sink_blocks=sinks, block_size=bs, scale=0.25)
    r = route(block_stats(q, k, v, bs), cfg)
    N = math.ceil(T / bs)
    kb = math.ceil(density * N)
    i = torch.arange(N)[:, None]
    j = torch.arange(N)[None, :]
    forced = ((i - j).abs() <= band) | (j < sinks)
    assert r.exact[..., forced].all()
    per_row = r.exact.sum(-1)
    expect = torch.clamp(forced.sum(-1), min=kb)
    assert torch.equal(per_row, expect.expand_as(per_row))
    # the index list is the same set, ascending, padded with -1
    for row_idx, row_ex in zip(r.idx.reshape(-1, r.idx.shape[-1]), r.exact.reshape(-1, N)):
        real = row_idx[row_idx >= 0]
        assert torch.equal(real, torch.nonzero(row_ex).flatten().to(real.dtype))
        assert (row_idx[len(real):] == -1).all()


def test_exact_fraction_at_wan_size_equals_density():
    N = 512  # Wan2.1 480p: 32760 tokens in blocks of 64
    cfg = SparseConfig(density=0.125, block_size=64)
    assert cfg.budget(N) == 64
    assert SparseConfig(density=0.1).budget(30) == 3  # no float-noise ceil


def test_structured_input_pisa_beats_drop_and_morton_helps():
    grid = (8, 16, 16)
    q, k, v = dit_like_qkv(grid, heads=2, head_dim=64, dtype=torch.float64)
    ref = F.scaled_dot_product_attention(q, k, v)
    err = {}
    for reorder in ("none", "morton"):
        for variant in VARIANTS:
            out = psa(q, k, v, density=0.125, variant=variant, reorder=reorder, grid=grid, backend="torch")
            err[reorder, variant] = rel(out, ref)
    assert err["none", "pisa"] < 0.5 * err["none", "drop"]
    assert err["morton", "pisa"] < 0.5 * err["morton", "drop"]
    assert err["morton", "pisa"] < err["none", "pisa"]
    assert err["morton", "pwt"] <= err["morton", "pisa"]


def test_reference_accepts_external_routing_and_reproduces_itself():
    q, k, v = (rand(1, 2, 300, 32, seed=s) for s in (1, 2, 3))
    cfg = SparseConfig(density=0.2, variant="pwt", scale=32 ** -0.5)
    stats, r = reference.prepare(q, k, v, cfg)
    a = reference.forward(q, k, v, cfg, routing=r, stats=stats)
    b = reference.forward(q, k, v, cfg)
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_inputs_keep_dtype_and_stay_close(dtype):
    q, k, v = dit_like_qkv((4, 8, 8), heads=2, head_dim=64, dtype=dtype)
    out = psa(q, k, v, density=0.25, backend="torch")
    ref = psa(q.double(), k.double(), v.double(), density=0.25, backend="torch")
    assert out.dtype == dtype
    assert rel(out, ref) < {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]


def test_reference_memory_is_chunked_at_wan_length():
    # T = 32760 at density 0.125: never a T x T matrix (that alone would be 4.3 GB in fp32 per head)
    T = 32760
    q, k, v = (rand(1, 1, T, 64, seed=s, dtype=torch.float32) for s in (1, 2, 3))
    out = psa(q, k, v, density=0.125, backend="torch")
    assert out.shape == q.shape and torch.isfinite(out).all()

"""The PyTorch reference's backward (the float64 oracle of every fast backward): gradcheck, an independent
autograd of MATH.md under the same exact sets, the PWT gate, and SDPA at density 1."""
import math

import pytest
import torch
import torch.nn.functional as F

from kernels import piecewise_sparse_attention as psa
from kernels import reference
from kernels.config import SparseConfig
from kernels.routing import block_stats, route
from kernels.synthetic import dit_like_qkv

from backward_oracle import oracle  # noqa: E402  (tests/ is on sys.path via conftest)

VARIANTS = ["pwt", "pisa", "drop"]


def rand(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).requires_grad_(True)


def grads(fn, q, k, v, seed=99):
    out = fn(q, k, v)
    g = torch.Generator().manual_seed(seed)
    do = torch.randn(out.shape, generator=g, dtype=out.dtype)
    return torch.autograd.grad(out, (q, k, v), do)


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def gated_qkv(T=100, D=8, bs=16, seed=0):
    """Random q, k, v whose KV block 2 has a wild key variance: its PWT bonus is gated for every query block,
    while the other blocks keep theirs (both sides of the gate are exercised)."""
    q, k, v = (rand(1, 2, T, D, seed=seed + i) for i in range(3))
    with torch.no_grad():
        k[..., 2 * bs:3 * bs, :] *= 12
    return q, k, v


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("T,bs,density,band,sinks", [
    (100, 16, 0.3, 0, 0),  # T not a multiple of the block (4-token last block)
    (81, 16, 0.4, 1, 1),  # one-token last block, band and a sink block
])
def test_reference_passes_float64_gradcheck(variant, T, bs, density, band, sinks):
    # fast mode (random projections of the Jacobian) keeps this under a few seconds; the full Jacobian is
    # checked once below at a smaller size
    q, k, v = gated_qkv(T=T, bs=bs, seed=3)
    kw = dict(density=density, variant=variant, band=band, n_sink_blocks=sinks, block_size=bs, backend="torch")
    if variant == "pwt":
        st = block_stats(q.detach(), k.detach(), v.detach(), bs)
        w = 0.5 * (8 ** -0.5) ** 2 * st.q2 @ st.ksig2.transpose(-1, -2)
        assert (w > math.log(bs)).any() and (w <= math.log(bs)).any()  # the gate is open and closed here
    assert torch.autograd.gradcheck(lambda a, b, c: psa(a, b, c, **kw), (q, k, v), eps=1e-6, atol=1e-7,
                                    rtol=1e-5, fast_mode=True)


def test_reference_pwt_passes_full_jacobian_gradcheck():
    q, k, v = (x.detach()[:, :1, :33, :2].clone().requires_grad_(True) for x in gated_qkv(T=33, seed=5))
    kw = dict(density=0.34, variant="pwt", band=0, block_size=16, backend="torch")
    assert torch.autograd.gradcheck(lambda a, b, c: psa(a, b, c, **kw), (q, k, v), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_reference_gradients_equal_independent_autograd_of_math_md(variant):
    T, bs, D = 150, 32, 16
    q, k, v = gated_qkv(T=T, D=D, bs=bs, seed=11)
    cfg = SparseConfig(density=0.3, variant=variant, band=0, block_size=bs, scale=D ** -0.5)
    with torch.no_grad():
        exact = route(block_stats(q, k, v, bs), cfg).exact

    def ref(a, b, c):
        st = block_stats(a, b, c, bs)
        r = route(st, cfg)
        assert torch.equal(r.exact, exact)
        return reference.forward(a, b, c, cfg, routing=r, stats=st)

    got = grads(ref, q, k, v)
    want = grads(lambda a, b, c: oracle(a, b, c, exact, variant=variant, block_size=bs), q, k, v)
    assert (ref(q, k, v) - oracle(q, k, v, exact, variant=variant, block_size=bs)).abs().max() < 1e-12
    for name, a, b in zip("qkv", got, want):
        assert rel(a, b) < 1e-12, (name, rel(a, b))


def test_pwt_gradient_keeps_the_dependence_of_w_on_q2_and_sigma2():
    # with w detached (as the reference had it) dq and dk differ from the gradient of the forward: the
    # second-order term's own derivative is part of the gradient
    grid, D = (4, 8, 8), 32
    q, k, v = (x.requires_grad_(True) for x in dit_like_qkv(grid, heads=2, head_dim=D, dtype=torch.float64))
    bs = 64
    cfg = SparseConfig(density=0.25, variant="pwt", band=0, block_size=bs, scale=D ** -0.5)

    def with_w(detach):
        def f(a, b, c):
            st = block_stats(a, b, c, bs)
            r = route(st, cfg)
            if detach:
                r = type(r)(idx=r.idx, exact=r.exact, w=r.w.detach())
            return reference.forward(a, b, c, cfg, routing=r, stats=st)
        return f

    full = grads(with_w(False), q, k, v)
    detached = grads(with_w(True), q, k, v)
    # DiT-like inputs (smooth fields + RoPE, like the measurement): far above float64 rounding
    assert rel(detached[0], full[0]) > 1e-4 and rel(detached[1], full[1]) > 1e-4
    assert rel(detached[2], full[2]) < 1e-14  # w does not depend on v


def test_routing_indices_are_detached_and_w_is_not():
    q, k, v = gated_qkv(seed=31)
    cfg = SparseConfig(density=0.3, variant="pwt", band=0, block_size=16, scale=8 ** -0.5)
    r = route(block_stats(q, k, v, 16), cfg)
    assert r.w.requires_grad and not r.idx.is_floating_point() and r.exact.dtype == torch.bool
    with torch.no_grad():
        assert not route(block_stats(q, k, v, 16), cfg).w.requires_grad


@pytest.mark.parametrize("variant", VARIANTS)
def test_reference_gradients_equal_sdpa_at_density_one(variant):
    q, k, v = (rand(2, 2, 130, 16, seed=40 + i) for i in range(3))
    got = grads(lambda a, b, c: psa(a, b, c, density=1.0, variant=variant, backend="torch"), q, k, v)
    want = grads(F.scaled_dot_product_attention, q, k, v)
    for a, b in zip(got, want):
        assert (a - b).abs().max().item() < 1e-10

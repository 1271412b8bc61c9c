"""Morton order: a bijection with a correct inverse, compact blocks, prefix untouched, output in caller order."""
import pytest
import torch
import torch.nn.functional as F

from kernels import inverse_order, morton_order, piecewise_sparse_attention as psa
from kernels.reorder import apply_reorder, undo_reorder


@pytest.mark.parametrize("grid", [(8, 8), (5, 7), (16, 16, 16), (3, 5, 7), (21, 30, 52), (1, 1, 9), (64, 64)])
def test_morton_is_a_bijection_with_a_correct_inverse(grid):
    perm, inv = morton_order(grid), inverse_order(grid)
    n = 1
    for x in grid:
        n *= x
    assert perm.shape == (n,) and torch.equal(torch.sort(perm).values, torch.arange(n))
    assert torch.equal(perm[inv], torch.arange(n)) and torch.equal(inv[perm], torch.arange(n))


def test_morton_blocks_are_compact_cubes_on_power_of_two_grids():
    grid = (8, 16, 16)
    perm = morton_order(grid)
    f, h, w = perm // 256, (perm // 16) % 16, perm % 16
    for b in range(0, perm.numel(), 64):
        for axis in (f, h, w):
            span = axis[b:b + 64]
            assert span.max() - span.min() == 3  # every block is a 4x4x4 cube
    perm2 = morton_order((64, 64))
    r, c = perm2 // 64, perm2 % 64
    for b in range(0, perm2.numel(), 64):
        assert r[b:b + 64].max() - r[b:b + 64].min() == 7 and c[b:b + 64].max() - c[b:b + 64].min() == 7


def test_morton_blocks_stay_compact_on_the_wan_480p_grid():
    grid = (21, 30, 52)
    perm = morton_order(grid)
    f, h, w = perm // (30 * 52), (perm // 52) % 30, perm % 52
    spans = []
    for b in range(0, perm.numel() - 63, 64):
        spans.append(max(int(a[b:b + 64].max() - a[b:b + 64].min()) for a in (f, h, w)))
    spans = torch.tensor(spans, dtype=torch.float)
    # raster blocks of 64 tokens span 52+ columns; Morton blocks stay within a few cells on every axis
    assert spans.median() <= 4 and spans.mean() < 6


def test_morton_order_is_cached():
    assert morton_order((21, 30, 52)) is morton_order((21, 30, 52))


def test_full_order_is_the_prefix_then_the_shifted_perm_and_cached_only_for_orders_on():
    from kernels.reorder import full_order, orders_on
    perm, _ = orders_on((3, 5, 7), "cpu")
    full = full_order(perm, 4)
    assert full.dtype == torch.int32
    assert torch.equal(full.long(), torch.cat([torch.arange(4), perm + 4]))
    assert full_order(perm, 4) is full  # orders_on's perms live as long as the process: cached
    assert full_order(perm, 0) is not full and torch.equal(full_order(perm, 0).long(), perm)
    other = perm.clone()  # any other perm (it may die, its memory be reused): built anew on every call
    assert full_order(other, 4) is not full_order(other, 4) and torch.equal(full_order(other, 4), full)


def test_orders_first_made_under_inference_mode_serve_autograd_later():
    # ComfyUI samples under torch.inference_mode; the cached orders must still serve a later call that autograd
    # records (LoRA training in the same process): inference tensors cannot be saved for backward
    from kernels.reorder import apply_reorder, full_order, morton_order, orders_on
    grid = (3, 7, 11)  # a grid no other test uses, so the first call below makes the cache entries
    with torch.inference_mode():
        perm, inv = orders_on(grid, "cpu")
        full = full_order(perm, 2)
        cpu_perm = morton_order(grid)
    assert not any(t.is_inference() for t in (perm, inv, full, cpu_perm))
    x = torch.randn(1, 1, 2 + perm.numel(), 4, requires_grad=True)
    y = apply_reorder(x, full.long())
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_prefix_stays_in_front_and_undo_restores():
    grid, n_prefix = (4, 6), 5
    x = torch.arange(n_prefix + 24, dtype=torch.float64).view(1, 1, -1, 1).expand(1, 2, -1, 3).contiguous()
    y = apply_reorder(x, morton_order(grid), n_prefix)
    assert torch.equal(y[..., :n_prefix, :], x[..., :n_prefix, :])
    assert torch.equal(undo_reorder(y, inverse_order(grid), n_prefix), x)


@pytest.mark.parametrize("variant", ["pwt", "pisa", "drop"])
def test_operator_with_morton_equals_manual_permutation(variant):
    grid, n_prefix = (3, 10, 12), 40
    T = n_prefix + 360
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, T, 16, generator=g, dtype=torch.float64) for _ in range(3))
    out = psa(q, k, v, density=0.3, variant=variant, reorder="morton", grid=grid, n_prefix=n_prefix,
              n_sink_blocks=1, block_size=32, backend="torch")
    perm, inv = morton_order(grid), inverse_order(grid)
    qp, kp, vp = (apply_reorder(x, perm, n_prefix) for x in (q, k, v))
    manual = psa(qp, kp, vp, density=0.3, variant=variant, n_sink_blocks=1, block_size=32, backend="torch")
    assert torch.equal(out, undo_reorder(manual, inv, n_prefix))
    dense = psa(q, k, v, density=1.0, variant=variant, reorder="morton", grid=grid, n_prefix=n_prefix,
                backend="torch")
    assert (dense - F.scaled_dot_product_attention(q, k, v)).abs().max() <= 1e-10


@pytest.mark.parametrize("grid", [(21, 30, 52), (5, 9, 13), (8, 16, 16), (3, 8, 8), (64, 64)])
def test_cube_order_puts_the_whole_cubes_first(grid, monkeypatch):
    # PSA_MORTON_CUBES: a 3-D grid's "morton" order becomes the cube order: block b < n is the aligned 4 x 4 x 4 cube
    # b (cubes in raster order of the cube grid, W fastest; raster order inside, w fastest: one 5-D TMA box of the
    # caller's layout, kernels/cute/fwd_cube.py), then the other tokens in Morton order; 2-D grids and grids without a
    # whole cube keep the Morton order. Off by default.
    from kernels.reorder import cube_blocks, cube_layout, orders_on
    monkeypatch.delenv("PSA_MORTON_CUBES", raising=False)
    plain = morton_order(grid)
    assert cube_blocks(grid) == 0
    monkeypatch.setenv("PSA_MORTON_CUBES", "1")
    perm, inv = morton_order(grid), inverse_order(grid)
    T = perm.numel()
    assert torch.equal(torch.sort(perm).values, torch.arange(T)) and torch.equal(perm[inv], torch.arange(T))
    n = cube_blocks(grid)
    if len(grid) == 2 or min(grid) < 4:
        assert n == 0 and torch.equal(perm, plain)
        return
    F_, H, W = grid
    assert n == (F_ // 4) * (H // 4) * (W // 4)
    f, h, w = perm // (H * W), (perm // W) % H, perm % W
    cube = torch.arange(n * 64) // 64
    assert torch.equal(w[:n * 64] // 4, cube % (W // 4))
    assert torch.equal(h[:n * 64] // 4, cube // (W // 4) % (H // 4))
    assert torch.equal(f[:n * 64] // 4, cube // ((W // 4) * (H // 4)))
    inner = torch.arange(n * 64) % 64
    assert torch.equal(w[:n * 64] % 4, inner % 4) and torch.equal(h[:n * 64] % 4, inner // 4 % 4)
    assert torch.equal(f[:n * 64] % 4, inner // 16)
    rest = perm[n * 64:]  # the others keep their Morton order
    assert torch.equal(rest, plain[torch.isin(plain, rest)])
    assert cube_layout(orders_on(grid, "cpu")[0]) == (tuple(grid), n)
    monkeypatch.delenv("PSA_MORTON_CUBES")
    assert cube_layout(orders_on(grid, "cpu")[0]) is None and torch.equal(morton_order(grid), plain)

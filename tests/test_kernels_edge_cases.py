"""Edge cases of the operator found in review: non-finite inputs under PWT, bad grids, fast-backend hooks
that fail at run time."""
import logging
import types

import pytest
import torch
import torch.nn.functional as F

from kernels import dispatch, reference
from kernels import piecewise_sparse_attention as psa


def qkv(B=1, H=2, T=512, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, T, D, generator=g) for _ in range(3))


@pytest.mark.parametrize("variant", ["pwt", "pisa", "drop"])
def test_one_nan_query_token_poisons_only_its_own_row_like_dense(variant):
    # N = 8 blocks, budget 2: most KV blocks are virtual tokens. Dense attention turns exactly the
    # poisoned query row non-finite; PWT's q^2 block mean must not spread it to the other 63 rows.
    q, k, v = qkv()
    q[0, 0, 5, 3] = float("nan")
    out = psa(q, k, v, density=0.25, variant=variant, backend="torch")
    dense = F.scaled_dot_product_attention(q, k, v)
    bad = ~torch.isfinite(out).all(-1)
    assert torch.equal(bad, ~torch.isfinite(dense).all(-1))
    assert bad.sum() == 1 and bad[0, 0, 5]


@pytest.mark.parametrize("grid", [16, 4.0, object()])
def test_non_iterable_grid_is_a_value_error(grid):
    q, k, v = qkv(T=16)
    with pytest.raises(ValueError, match="grid"):
        psa(q, k, v, reorder="morton", grid=grid)


def test_failing_gather_hook_of_a_fast_backend_falls_back_to_torch_reorder(monkeypatch, caplog):
    # a fast backend whose fused Morton gather fails at run time (e.g. a kernel that does not compile on
    # this GPU) must not break the call: the reorder falls back to kernels.reorder, loudly
    def gather_tokens(x, perm, n_prefix=0):
        raise RuntimeError("gather kernel failed to compile")

    fake = types.SimpleNamespace(available=lambda: True, unavailable_reason=lambda q, cfg: None,
                                 forward=reference.forward, gather_tokens=gather_tokens)
    monkeypatch.setitem(dispatch._loaded, "triton", fake)
    grid, n_prefix = (2, 6, 8), 7
    q, k, v = qkv(B=2, T=n_prefix + 96, seed=1)
    kw = dict(density=0.5, reorder="morton", grid=grid, n_prefix=n_prefix, block_size=16)
    with caplog.at_level(logging.INFO, logger="piecewise_sparse_attention"):
        out = psa(q, k, v, backend="triton", **kw)
    assert torch.equal(out, psa(q, k, v, backend="torch", **kw))
    assert any("gather" in r.getMessage() for r in caplog.records)


def test_tma_is_only_chosen_for_16_byte_aligned_views():
    fwd = pytest.importorskip("kernels.triton.fwd", reason="triton not installed")
    x = torch.randn(1, 2, 130, 128, dtype=torch.bfloat16)
    assert fwd.tma_aligned(x)
    # the [B, L, H*D] -> [B, H, L, D] view ComfyUI's Wan attention produces is aligned too
    assert fwd.tma_aligned(torch.randn(1, 130, 2 * 128, dtype=torch.bfloat16).view(1, 130, 2, 128).transpose(1, 2))
    # a base pointer 2 bytes past an aligned one
    shifted = x.reshape(-1)[1:].as_strided((1, 2, 129, 128), (2 * 129 * 128, 129 * 128, 128, 1))
    assert not fwd.tma_aligned(shifted)
    assert fwd.tma_aligned(torch.randn(1, 2, 130, 136, dtype=torch.bfloat16)[..., :128])  # rows of 272 bytes
    assert not fwd.tma_aligned(torch.randn(1, 2, 130, 132, dtype=torch.bfloat16)[..., :128])  # rows of 264 bytes


def test_fast_backend_failure_uses_the_reference_or_raises_on_request(monkeypatch, caplog):
    def forward(q, k, v, cfg):
        raise RuntimeError("kernel launch failed")

    fake = types.SimpleNamespace(available=lambda: True, unavailable_reason=lambda q, cfg: None, forward=forward)
    monkeypatch.setitem(dispatch._loaded, "triton", fake)
    q, k, v = qkv(T=200, seed=2)
    with caplog.at_level(logging.INFO, logger="piecewise_sparse_attention"):
        out = psa(q, k, v, density=0.5, backend="triton")
    assert torch.equal(out, psa(q, k, v, density=0.5, backend="torch"))
    assert "kernel launch failed" in caplog.text
    with pytest.raises(RuntimeError, match="kernel launch failed"):
        psa(q, k, v, density=0.5, backend="triton", on_failure="raise")
    with pytest.raises(ValueError, match="on_failure"):
        psa(q, k, v, on_failure="dense")


def test_hsum_grid_keeps_at_least_eight_blocks_per_program_and_reads_its_knobs_from_the_environment(monkeypatch):
    from kernels.triton import stats
    # H200 (132 SMs), 4 programs per SM: Wan2.1-14B 480p (512 blocks, 40 heads) -> 39 blocks per program, FLUX.1
    # 1024^2 (72 blocks, 24 heads) would get 4 -> the floor of 8; a head of 3 blocks is one program of 3
    assert stats.HSUM_CTAS_PER_SM == 4 and stats.HSUM_MIN_BLOCKS == 8
    assert stats.blocks_per_program(512, 40) == 39
    assert stats.blocks_per_program(72, 24) == 8
    assert stats.blocks_per_program(3, 1) == 3
    assert stats.blocks_per_program(8192, 1) == 128  # at most 64 partials per head
    assert stats.blocks_per_program(512, 40, per_sm=1.8) == 87  # 6 partials per head: 240 programs
    # a bench process sets the knobs through PSA_HSUM_* (read at import); a malformed value keeps the default
    monkeypatch.setenv("PSA_HSUM_CTAS_PER_SM", "1.8")
    monkeypatch.setenv("PSA_HSUM_STAGES", "two")
    assert stats._env_num("PSA_HSUM_CTAS_PER_SM", 4, float) == 1.8
    assert stats._env_num("PSA_HSUM_STAGES", 3, int) == 3
    monkeypatch.delenv("PSA_HSUM_STAGES")
    assert stats._env_num("PSA_HSUM_STAGES", 3, int) == 3
    for bad in ("0", "-2", "nan"):  # never a zero or negative grid (nan compares False: the default)
        monkeypatch.setenv("PSA_HSUM_CTAS_PER_SM", bad)
        assert stats._env_num("PSA_HSUM_CTAS_PER_SM", 4, float) == 4

"""Bad input gets a ValueError that says what to pass; non-finite input never crashes; dispatch is loud."""
import logging

import pytest
import torch
import torch.nn.functional as F

from kernels import backend_status, piecewise_sparse_attention as psa


def qkv(T=128, D=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 2, T, D, generator=g).to(dtype) for _ in range(3))


@pytest.mark.parametrize("kwargs,match", [
    (dict(density=0.0), "density"),
    (dict(density=1.5), "density"),
    (dict(variant="sla2"), "variant"),
    (dict(backend="cuda"), "backend"),
    (dict(block_size=48), "power of two"),
    (dict(reorder="hilbert"), "reorder"),
    (dict(reorder="morton"), "needs grid"),
    (dict(reorder="morton", grid=(4, 4)), "prod"),
    (dict(reorder="morton", grid=(2, 8, 8), n_prefix=1), "prod"),
    (dict(band=-1), "band"),
    (dict(n_sink_blocks=-2), "n_sink_blocks"),
    (dict(n_prefix=500), "n_prefix"),
])
def test_bad_arguments_raise_value_error_saying_what_to_pass(kwargs, match):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=match):
        psa(q, k, v, **kwargs)


def test_bad_shapes_raise_value_error():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="rank 4"):
        psa(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="same shape"):
        psa(q, k[:, :, :64], v[:, :, :64])
    with pytest.raises(ValueError, match="dtype"):
        psa(q, k.double(), v)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_inputs_behave_like_dense_attention_and_never_crash(bad):
    q, k, v = qkv()
    q2 = q.clone()
    q2[0, 0, 5, 3] = bad
    out = psa(q2, k, v, density=0.25, backend="torch")
    dense = F.scaled_dot_product_attention(q2, k, v)
    assert out.shape == q.shape
    # the poisoned query row is non-finite in both; the other head is untouched in both
    assert not torch.isfinite(out[0, 0, 5]).all() and not torch.isfinite(dense[0, 0, 5]).all()
    assert torch.isfinite(out[0, 1]).all() and torch.isfinite(dense[0, 1]).all()
    v2 = v.clone()
    v2[0, 1, 7, 0] = bad
    out = psa(q, k, v2, density=0.25, backend="torch")
    assert out.shape == q.shape and torch.isfinite(out[0, 0]).all()


def test_unavailable_backend_falls_back_to_reference_loudly(caplog):
    q, k, v = qkv()
    with caplog.at_level(logging.INFO, logger="piecewise_sparse_attention"):
        out = psa(q, k, v, density=0.25, backend="cute")
    ref = psa(q, k, v, density=0.25, backend="torch")
    assert torch.equal(out, ref)
    assert any("cute" in r.getMessage() and "torch reference" in r.getMessage() for r in caplog.records)


def test_backend_status_names_a_reason_for_each_unusable_backend():
    st = backend_status(qkv()[0])
    assert st["torch"] is None
    for name in ("cute", "triton"):
        assert st[name] is None or isinstance(st[name], str) and st[name]


def test_env_override_of_auto(monkeypatch):
    q, k, v = qkv()
    monkeypatch.setenv("PSA_BACKEND", "torch")
    assert torch.equal(psa(q, k, v), psa(q, k, v, backend="torch"))
    monkeypatch.setenv("PSA_BACKEND", "bogus")
    with pytest.raises(ValueError, match="PSA_BACKEND"):
        psa(q, k, v)

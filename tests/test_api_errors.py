"""The operator's error contract (issue 12, classes 2-4): every bad argument is a ValueError / TypeError that
names it and says what to pass, numpy and 0-d tensor scalars are numbers, and inputs that require grad never
get a silently detached output."""
import logging
import types

import numpy as np
import pytest
import torch

from kernels import dispatch, reference
from kernels import piecewise_sparse_attention as psa
from kernels.config import ArgumentTypeError


def qkv(T=130, D=16, H=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, H, T, D, generator=g) for _ in range(3))


# class 2: values that used to be accepted silently (all-NaN output, truncation, the bias on, a 64 GB allocation)
@pytest.mark.parametrize("kwargs,match", [
    (dict(scale=float("nan")), "scale must be"),
    (dict(scale=float("inf")), "scale must be"),
    (dict(scale=0.0), "scale must be"),
    (dict(scale=-0.125), "scale must be"),
    (dict(reorder="morton", grid=(16.9, 16.2), n_prefix=0), "grid must be"),
    (dict(cov_bias="no"), "cov_bias must be True or False"),
    (dict(cov_bias=1), "cov_bias must be True or False"),
    (dict(block_size=2 ** 17), "block_size must be a power of two in"),
    (dict(block_size=2048), "block_size must be a power of two in"),
    (dict(band=True), "band must be an integer"),
    (dict(n_sink_blocks=1.5), "n_sink_blocks must be an integer"),
    (dict(density=float("nan")), "density must be"),
    (dict(n_prefix=-1), "n_prefix must be"),
    (dict(out_layout="bhtd"), "out_layout must be"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_bad_values_that_were_silently_accepted_now_raise_naming_the_argument(kwargs, match):
    q, k, v = qkv(T=100 if kwargs.get("block_size") else 256)
    with pytest.raises(ValueError, match=match):
        psa(q, k, v, **kwargs)


def test_a_huge_block_size_is_refused_before_anything_is_allocated(monkeypatch):
    def no_forward(*a, **k):
        raise AssertionError("the operator ran")
    monkeypatch.setattr(reference, "forward", no_forward)
    q, k, v = qkv(T=100)
    with pytest.raises(ValueError, match="block_size"):
        psa(q, k, v, block_size=2 ** 17, backend="torch")


# class 3: wrong types get a message naming the argument (not float()'s or int()'s), and are TypeErrors too
@pytest.mark.parametrize("kwargs,name,type_error", [
    (dict(scale="abc"), "scale", True),
    (dict(density="0.25"), "density", True),
    (dict(density=None), "density", True),
    (dict(band="1"), "band", True),
    (dict(block_size="64"), "block_size", True),
    (dict(reorder="morton", grid="16x16"), "grid", True),
    (dict(reorder="morton", grid=16), "grid", True),
    (dict(reorder="morton", grid=(16, 16, 1, 1)), "grid", False),
    (dict(reorder="morton", grid=None), "needs grid", False),
    (dict(variant=None), "variant", False),
    (dict(backend=3), "backend", False),
    (dict(on_failure="dense"), "on_failure", False),
], ids=lambda x: x if isinstance(x, str) else None)
def test_wrong_types_name_the_argument_and_what_to_pass(kwargs, name, type_error):
    q, k, v = qkv(T=256)
    with pytest.raises(ValueError, match=name) as e:
        psa(q, k, v, **kwargs)
    msg = str(e.value)
    assert "invalid literal" not in msg and "could not convert" not in msg, msg
    assert isinstance(e.value, TypeError) == type_error, (type(e.value), msg)


def test_non_tensor_q_is_a_type_error_naming_q():
    _, k, v = qkv()
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        psa([[0.0]], k, v)


@pytest.mark.parametrize("density", [np.float32(0.25), np.float64(0.25), torch.tensor(0.25), np.array(0.25),
                                     torch.tensor(0.25, dtype=torch.float16)],
                         ids=["np.float32", "np.float64", "tensor0d", "np.array0d", "tensor0d_fp16"])
def test_numpy_and_zero_dim_tensor_scalars_are_accepted_as_numbers(density):
    q, k, v = qkv(T=256)
    want = psa(q, k, v, density=0.25, backend="torch")
    assert torch.equal(psa(q, k, v, density=density, backend="torch"), want)


def test_numpy_and_tensor_integers_and_bools_are_accepted_where_ints_and_bools_are():
    q, k, v = qkv(T=256)
    want = psa(q, k, v, density=0.5, band=1, n_sink_blocks=1, cov_bias=True, scale=0.25, backend="torch")
    got = psa(q, k, v, density=0.5, band=np.int64(1), n_sink_blocks=torch.tensor(1), cov_bias=np.bool_(True),
              scale=np.float32(0.25), block_size=np.int32(64), backend="torch")
    assert torch.equal(got, want)
    # an integer-valued grid of any numeric type is a grid; 16.9 is not
    kw = dict(density=0.5, reorder="morton", n_prefix=0, backend="torch")
    base = psa(q, k, v, grid=(16, 16), **kw)
    assert torch.equal(psa(q, k, v, grid=(16.0, np.int64(16)), **kw), base)
    assert torch.equal(psa(q, k, v, grid=torch.tensor([16, 16]), **kw), base)


def test_argument_type_error_is_both_type_error_and_value_error():
    assert issubclass(ArgumentTypeError, TypeError) and issubclass(ArgumentTypeError, ValueError)


def test_empty_batch_or_heads_give_an_empty_output():
    q, k, v = (torch.randn(0, 2, 70, 16) for _ in range(3))
    assert psa(q, k, v).shape == (0, 2, 70, 16)
    q, k, v = (torch.randn(1, 0, 70, 16) for _ in range(3))
    assert psa(q, k, v).shape == (1, 0, 70, 16)


# class 4: autograd is never silently missing
def _fake_fast_backend(monkeypatch, name="cute"):
    """A fast backend that can run here and, like the CuTe forward (it has no backward), returns a detached
    output."""
    def forward(q, k, v, cfg):
        with torch.no_grad():
            return reference.forward(q, k, v, cfg)
    fake = types.SimpleNamespace(available=lambda: True, unavailable_reason=lambda q, cfg: None, forward=forward)
    monkeypatch.setitem(dispatch._loaded, name, fake)
    monkeypatch.delenv("PSA_BACKEND", raising=False)
    return fake


def _leaves(T=130, seed=3):
    return tuple(t.requires_grad_() for t in qkv(T=T, seed=seed))


def test_auto_with_inputs_that_require_grad_picks_a_differentiating_backend_with_one_log_line(monkeypatch, caplog):
    _fake_fast_backend(monkeypatch)
    q, k, v = _leaves()
    with torch.no_grad():
        assert dispatch.select_backend(q, reference_cfg(), "auto", k=k, v=v)[0] == "cute"  # no grad needed
    dispatch._logged.clear()
    with caplog.at_level(logging.INFO, logger="piecewise_sparse_attention"):
        out = psa(q, k, v, density=0.5)
        psa(q, k, v, density=0.5)
    assert out.grad_fn is not None
    out.square().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))
    lines = [r.getMessage() for r in caplog.records if "no backward" in r.getMessage()]
    assert len(lines) == 1 and "torch" in lines[0], lines


def test_explicit_fast_backend_with_inputs_that_require_grad_raises_naming_it_and_the_alternative(monkeypatch):
    _fake_fast_backend(monkeypatch, "cute")
    q, k, v = _leaves()
    with pytest.raises(ValueError, match=r"backend='cute'.*no backward.*backend='torch'"):
        psa(q, k, v, density=0.5, backend="cute")
    with torch.no_grad():  # no backward needed: the fast backend runs
        assert psa(q, k, v, density=0.5, backend="cute").grad_fn is None
    # one input requiring grad is enough
    q2, k2, v2 = qkv()
    with pytest.raises(ValueError, match="no backward"):
        psa(q2, k2, v2.requires_grad_(), backend="cute")


def test_psa_backend_env_with_inputs_that_require_grad_falls_back_to_torch(monkeypatch, caplog):
    _fake_fast_backend(monkeypatch)
    monkeypatch.setenv("PSA_BACKEND", "cute")
    q, k, v = _leaves()
    name, why = dispatch.select_backend(q, reference_cfg(), "auto", k=k, v=v)
    assert name == "torch" and "PSA_BACKEND" in why and "no backward" in why
    assert psa(q, k, v, density=0.5).grad_fn is not None


def test_grad_reason_is_one_switch_per_backend(monkeypatch):
    q, k, v = _leaves()
    assert dispatch.grad_reason("torch", q, k, v) is None
    assert dispatch.grad_reason("triton", q, k, v) is None  # its backward: kernels/triton/bwd.py
    assert "cute" in dispatch.grad_reason("cute", q, k, v)
    assert dispatch.grad_reason("cute", *qkv()) is None  # nothing requires grad
    with torch.no_grad():
        assert dispatch.grad_reason("cute", q, k, v) is None
    monkeypatch.setattr(dispatch, "DIFFERENTIABLE", ("torch", "triton", "cute"))  # what a cute backward would flip
    assert dispatch.grad_reason("cute", q, k, v) is None


def test_torch_reference_gradients_match_dense_attention_at_density_one():
    q, k, v = (t.double().detach().requires_grad_() for t in qkv(T=130, seed=5))
    out = psa(q, k, v, density=1.0, backend="auto")
    g = torch.autograd.grad(out.square().sum(), (q, k, v))
    d = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    gd = torch.autograd.grad(d.square().sum(), (q, k, v))
    for a, b in zip(g, gd):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def reference_cfg():
    from kernels.config import SparseConfig
    return SparseConfig(density=0.5, scale=0.25)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_auto_differentiates_inputs_that_require_grad_and_explicit_backends_without_backward_raise():
    # the same code trains on CPU and GPU: auto never hands back a detached output
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 2, 256, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for _ in range(3))
    out = psa(q, k, v, density=0.5)
    assert out.grad_fn is not None
    out.float().square().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))
    for name in ("triton", "cute"):
        if name in dispatch.DIFFERENTIABLE:
            assert psa(q, k, v, density=0.5, backend=name).grad_fn is not None
        else:
            with pytest.raises(ValueError, match=f"backend='{name}'"):
                psa(q, k, v, density=0.5, backend=name)

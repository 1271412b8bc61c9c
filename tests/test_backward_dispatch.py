"""Calls that need gradients never land on a forward-only backend: dispatch takes one with a backward."""
import logging
import types

import torch

from kernels import dispatch
from kernels import piecewise_sparse_attention as psa


def qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, 200, 32, generator=g) for _ in range(3))


def forward_only_backend(calls):
    def forward(q, k, v, cfg):
        calls.append(torch.is_grad_enabled() and q.requires_grad)
        with torch.no_grad():
            return torch.zeros_like(q)
    return types.SimpleNamespace(available=lambda: True, unavailable_reason=lambda q, cfg: None, forward=forward)


def test_forward_only_backend_is_replaced_when_gradients_are_needed(monkeypatch, caplog):
    calls = []
    monkeypatch.setitem(dispatch._loaded, "cute", forward_only_backend(calls))
    monkeypatch.setattr(dispatch, "_logged", set())
    q, k, v = (x.requires_grad_(True) for x in qkv())
    with caplog.at_level(logging.INFO, logger="piecewise_sparse_attention"):
        out = psa(q, k, v, density=0.25, backend="cute")
        psa(q, k, v, density=0.25, backend="cute")
    assert calls == [] and out.grad_fn is not None
    ref = psa(q, k, v, density=0.25, backend="torch")
    assert torch.equal(out, ref)
    lines = [r.getMessage() for r in caplog.records if "has no backward" in r.getMessage()]
    assert len(lines) == 1 and "cute backend has no backward" in lines[0]
    # without gradients the requested backend runs as before
    with torch.no_grad():
        psa(q, k, v, density=0.25, backend="cute")
    assert calls == [False]

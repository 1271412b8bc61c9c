"""The CuTe backend's dispatch on a machine without it (CI: no GPU, no nvidia-cutlass-dsl): it imports, says
why it cannot run, and "auto" / backend="cute" fall back loudly with the right output. The kernel itself is
tested on the H200 (tests/test_cute_gpu.py)."""
import importlib.util
import logging
import types

import pytest
import torch

from kernels import backend_status, dispatch
from kernels import piecewise_sparse_attention as psa
from kernels.config import SparseConfig

kc = pytest.importorskip("kernels.cute")  # must import without nvidia-cutlass-dsl; a failure here is the bug

# the fallback tests need a machine where the backend cannot run (CI); the reason tests pretend either way
cannot_run = pytest.mark.skipif(kc.available(), reason="the CuTe backend can run here (tests/test_cute_gpu.py)")

CFG = SparseConfig(density=0.25, variant="pwt", scale=128 ** -0.5)


def qkv(T=300, D=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, T, D, generator=g) for _ in range(3))


def fresh_log_keys(monkeypatch):
    # kernels.dispatch logs each reason once per process: start from an empty registry
    monkeypatch.setattr(dispatch, "_logged", set())


@cannot_run
def test_module_imports_and_names_the_reason_on_this_machine():
    q = qkv()[0]
    reason = kc.unavailable_reason(q, CFG)
    assert reason and reason.startswith("cute backend: ")
    assert not kc.available()
    if importlib.util.find_spec("cutlass") is None:
        assert "nvidia-cutlass-dsl is not installed" in reason and "pip install .[cute]" in reason
    else:  # the DSL is here but there is no usable GPU
        assert "CUDA" in reason or "SM90" in reason
    # the dispatch-level reason (what backend_status and the log line show) is the same text
    assert backend_status(q, CFG)["cute"] == reason
    with pytest.raises(RuntimeError, match="cute backend unavailable"):
        kc.forward(*qkv(), CFG)


@cannot_run
def test_auto_skips_cute_with_one_log_line_and_gives_the_reference_output(monkeypatch, caplog):
    fresh_log_keys(monkeypatch)
    q, k, v = qkv(seed=1)
    name, why = dispatch.select_backend(q, CFG, "auto")
    assert name in ("triton", "torch") and "cute backend: " in why
    with caplog.at_level(logging.INFO, logger="piecewise_sparse_attention"):
        out = psa(q, k, v, density=0.25)
        out2 = psa(q, k, v, density=0.25)
    ref = psa(q, k, v, density=0.25, backend="torch")
    assert torch.equal(out, ref) and torch.equal(out2, ref)
    lines = [r.getMessage() for r in caplog.records if "cute backend: " in r.getMessage()]
    assert len(lines) == 1, lines  # logged once, not per call
    assert lines[0].startswith(f"piecewise_sparse_attention: using the {name} backend (cute backend: ")
    assert all(r.levelno == logging.INFO for r in caplog.records if "cute backend: " in r.getMessage())


@cannot_run
def test_explicit_cute_falls_back_to_the_reference_loudly(monkeypatch, caplog):
    fresh_log_keys(monkeypatch)
    q, k, v = qkv(seed=2)
    with caplog.at_level(logging.INFO, logger="piecewise_sparse_attention"):
        out = psa(q, k, v, density=0.25, variant="pisa", backend="cute")
    assert torch.equal(out, psa(q, k, v, density=0.25, variant="pisa", backend="torch"))
    warn = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warn) == 1
    msg = warn[0].getMessage()
    assert "backend='cute' cannot run: cute backend: " in msg and "using the torch reference" in msg


@cannot_run
def test_env_override_to_cute_falls_back_to_the_reference(monkeypatch):
    fresh_log_keys(monkeypatch)
    monkeypatch.setenv("PSA_BACKEND", "cute")
    q, k, v = qkv(seed=3)
    assert torch.equal(psa(q, k, v, density=0.25), psa(q, k, v, density=0.25, backend="torch"))


def _pretend_hopper_with_the_dsl(monkeypatch, sm=(9, 0), triton_reason=None, check=None):
    """unavailable_reason's own checks, with the package, a GPU and the Triton backend pretended present:
    q is a stand-in with the attributes it reads (device, dtype, shape)."""
    monkeypatch.setattr(kc, "_IMPORT_ERROR", None)
    monkeypatch.setattr(kc, "_cute", types.SimpleNamespace(check=check or (lambda q, cfg: None)))
    monkeypatch.setattr(kc.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(kc, "_sm", lambda device: sm)
    monkeypatch.setattr(kc._kt, "unavailable_reason", lambda q, cfg: triton_reason)
    monkeypatch.setattr(kc, "_FAILED", {})


def fake_q(dtype=torch.bfloat16, D=128, device="cuda", offset=0):
    """A stand-in for a CUDA q: what unavailable_reason reads (device, dtype, shape, strides, base pointer)."""
    x = torch.empty(1, 2, 1000, D, dtype=dtype)
    return types.SimpleNamespace(device=torch.device(device, 0) if device == "cuda" else torch.device(device),
                                 dtype=dtype, shape=x.shape, stride=x.stride, element_size=x.element_size,
                                 data_ptr=lambda: 4096 + offset)


@pytest.mark.parametrize("kw,q,cfg,expect", [
    (dict(), fake_q(), CFG, None),
    (dict(sm=(8, 9)), fake_q(), CFG, "cute backend: SM90 only (Hopper); got sm_89"),
    (dict(sm=(10, 0)), fake_q(), CFG, "cute backend: SM90 only (Hopper); got sm_100"),
    (dict(), fake_q(torch.float16), CFG, "cute backend: dtype float16 unsupported (bfloat16 only)"),
    (dict(), fake_q(D=64), CFG, "cute backend: head_dim 64 unsupported (128 only)"),
    (dict(), fake_q(), SparseConfig(variant="sla", scale=0.1), "cute backend: variant 'sla' unsupported"),
    (dict(), fake_q(), SparseConfig(block_size=128, scale=0.1), "cute backend: block_size 128 unsupported"),
    (dict(), fake_q(device="cpu"), CFG, "cute backend: runs on CUDA tensors only, got cpu tensors"),
    (dict(triton_reason="triton import failed (x)"), fake_q(), CFG,
     "cute backend: needs the triton backend for statistics and routing (triton import failed (x))"),
    (dict(), fake_q(offset=2), CFG, "cute backend: q's base or strides are not 16-byte aligned"),
    (dict(check=lambda q, cfg: "T below one block"), fake_q(), CFG, "cute backend: T below one block"),
], ids=["ok", "sm89", "sm100", "fp16", "d64", "variant", "block", "cpu", "no_triton", "misaligned", "kernel_check"])
def test_reasons_read_well(monkeypatch, kw, q, cfg, expect):
    _pretend_hopper_with_the_dsl(monkeypatch, **kw)
    got = kc.unavailable_reason(q, cfg)
    if expect is None:
        assert got is None
    else:
        assert got is not None and got.startswith(expect), got


def test_a_kernel_failure_is_remembered_so_later_calls_skip_cute(monkeypatch, caplog):
    def attention(q, k, v, out, st, idx, vbias, cfg):
        raise RuntimeError("DSL compile error")

    _pretend_hopper_with_the_dsl(monkeypatch)
    kc._cute.attention = attention
    with caplog.at_level(logging.INFO, logger="piecewise_sparse_attention"):
        with pytest.raises(RuntimeError, match="DSL compile error"):
            kc._attention(None, None, None, None, None, None, None, CFG)
    assert "the cute kernel failed for pisa/pwt" in caplog.text
    why = kc.unavailable_reason(fake_q(), CFG)
    assert why.startswith("cute backend: its kernel failed earlier in this process (RuntimeError: DSL compile")
    # the other variant family is still offered
    assert kc.unavailable_reason(fake_q(), SparseConfig(variant="drop", scale=0.1)) is None


def test_alignment_check_follows_the_tma_rules():
    x = torch.randn(2 * 130 * 128 + 1, dtype=torch.bfloat16)
    shifted = x[1:].view(1, 2, 130, 128)  # contiguous, base 2 bytes past an aligned one
    assert not kc.aligned16(shifted)
    assert kc.aligned16(torch.randn(1, 130, 2 * 128, dtype=torch.bfloat16).view(1, 130, 2, 128).transpose(1, 2))
    assert not kc.aligned16(torch.randn(1, 2, 130, 132, dtype=torch.bfloat16)[..., :128])  # rows of 264 bytes


def test_auto_skip_reason_keeps_small_problems_off_cute(monkeypatch):
    """The size floor is pure arithmetic on the shape (meta tensors: no data, no GPU needed)."""
    from kernels import cute as kc
    from kernels.config import SparseConfig
    monkeypatch.delenv("PSA_CUTE_MIN_TILES", raising=False)
    cfg = SparseConfig(density=0.125, variant="pwt", scale=128 ** -0.5)
    flux = torch.empty(1, 24, 4608, 128, device="meta", dtype=torch.bfloat16)
    wan = torch.empty(1, 12, 32760, 128, device="meta", dtype=torch.bfloat16)
    why = kc.auto_skip_reason(flux, cfg)
    assert why is not None and "PSA_CUTE_MIN_TILES=100000" in why
    assert kc.auto_skip_reason(wan, cfg) is None
    monkeypatch.setenv("PSA_CUTE_MIN_TILES", "0")
    assert kc.auto_skip_reason(flux, cfg) is None


def test_auto_skip_reason_graphed_calls_have_their_own_floor(monkeypatch):
    """A call replayed from the CUDA-graph cache pays no host-side conversion: the eager floor does not apply
    (H200 session 23: cute ahead of Triton graphed at every break-even size), PSA_CUTE_MIN_TILES_GRAPHED does."""
    from kernels import cute as kc
    from kernels.config import SparseConfig
    monkeypatch.delenv("PSA_CUTE_MIN_TILES", raising=False)
    monkeypatch.delenv("PSA_CUTE_MIN_TILES_GRAPHED", raising=False)
    cfg = SparseConfig(density=0.2, variant="pwt", scale=128 ** -0.5)
    flux = torch.empty(1, 24, 4608, 128, device="meta", dtype=torch.bfloat16)
    assert "PSA_CUTE_MIN_TILES=100000" in kc.auto_skip_reason(flux, cfg)
    assert kc.auto_skip_reason(flux, cfg, graphed=True) is None
    monkeypatch.setenv("PSA_CUTE_MIN_TILES_GRAPHED", "1e9")
    why = kc.auto_skip_reason(flux, cfg, graphed=True)
    assert why is not None and "PSA_CUTE_MIN_TILES_GRAPHED=1000000000" in why
    monkeypatch.setenv("PSA_CUTE_MIN_TILES_GRAPHED", "not a number")  # a bad value keeps the default
    assert kc.auto_skip_reason(flux, cfg, graphed=True) is None


def test_auto_tells_the_skip_rule_whether_the_graph_cache_takes_the_call(monkeypatch):
    """select_backend passes kernels.graphs' own verdict (dispatch._graphed) to auto_skip_reason: CPU tensors and
    calls without k / v are never graphed; a call the cache takes is."""
    from kernels import graphs
    seen = []

    def skip(q, cfg, graphed=False):
        seen.append(graphed)
        return None if graphed else "too small eagerly"
    fake = types.SimpleNamespace(available=lambda: True, unavailable_reason=lambda q, cfg: None,
                                 auto_skip_reason=skip)
    monkeypatch.setitem(dispatch._loaded, "cute", fake)
    monkeypatch.delenv("PSA_BACKEND", raising=False)
    q, k, v = qkv(seed=4)
    name, why = dispatch.select_backend(q, CFG, "auto", k=k, v=v)  # CPU tensors: never graphed
    assert seen == [False] and name != "cute" and "too small eagerly" in why
    assert dispatch.select_backend(q, CFG, "auto")[0] != "cute" and seen[-1] is False  # no k, v: no verdict
    monkeypatch.setattr(dispatch, "_graphed", lambda q, k, v: True)
    assert dispatch.select_backend(q, CFG, "auto", k=k, v=v) == ("cute", None) and seen[-1] is True
    # the real verdict is graphs.graph_reason's: PSA_CUDA_GRAPHS=0 turns graphing, and so the exemption, off
    monkeypatch.undo()
    monkeypatch.setenv("PSA_CUDA_GRAPHS", "0")
    assert graphs.graph_reason(q, k, v) is not None and dispatch._graphed(q, k, v) is False

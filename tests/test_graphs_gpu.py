"""The CUDA-graph cache (kernels/graphs.py) on a GPU: a call replayed from its graph equals the eager call bit for
bit (Triton, and CuTe where it runs) with Morton order and a text prefix, also for ComfyUI's [B, L, H*D] strides
viewed as [B, H, L, D]; the result is the caller's own tensor; new inputs give their own answer; a capture that
syncs the host falls back eagerly; clearing the cache gives its memory back. Skipped without CUDA (CI); run on the
H200 with `pytest -m gpu tests/test_graphs_gpu.py`."""
import pytest
import torch

from gpu_common import rnd

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

H, D, SIDE, PREFIX = 4, 128, 32, 64  # a FLUX-like layout: 64 text tokens, then a 32 x 32 image grid
T = PREFIX + SIDE * SIDE
KW = dict(density=0.2, variant="pwt", n_sink_blocks=1, reorder="morton", grid=(SIDE, SIDE), n_prefix=PREFIX,
          on_failure="raise")


def _cute_skip():
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    import kernels.cute as kc
    from kernels.config import SparseConfig
    q = torch.empty(1, H, T, D, device="cuda", dtype=torch.bfloat16)
    return kc.unavailable_reason(q, SparseConfig(density=0.2, scale=D ** -0.5))


_CUTE_WHY = _cute_skip()
BACKENDS = ["triton", pytest.param("cute", marks=pytest.mark.skipif(_CUTE_WHY is not None, reason=f"{_CUTE_WHY}"))]


@pytest.fixture(autouse=True)
def cache(monkeypatch):
    from kernels import graphs
    for name in ("PSA_CUDA_GRAPHS", "PSA_CUDA_GRAPH_MAX_TOKENS", "PSA_CUDA_GRAPH_ENTRIES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PSA_CUDA_GRAPH_IN_PLACE", "0")  # the copy-in graphs; in place: its own test
    monkeypatch.setenv("PSA_CUDA_GRAPH_ZERO_COPY", "0")  # the tests hold earlier outputs; zero copy: its own test
    c = graphs.GraphCache()
    monkeypatch.setattr(graphs, "_CACHE", c)
    yield c
    c.clear()


def _qkv(seed=0, comfy=False):
    if comfy:  # ComfyUI hands over [B, L, H*D]; the override views it as [B, H, L, D]
        return tuple(rnd((1, T, H * D), seed=seed + i).view(1, T, H, D).transpose(1, 2) for i in range(3))
    return tuple(rnd((1, H, T, D), seed=seed + i) for i in range(3))


def _eager(monkeypatch, q, k, v, backend):
    from kernels import piecewise_sparse_attention as psa
    monkeypatch.setenv("PSA_CUDA_GRAPHS", "0")
    try:
        return psa(q, k, v, backend=backend, **KW)
    finally:
        monkeypatch.delenv("PSA_CUDA_GRAPHS")


@pytest.mark.parametrize("comfy", [False, True], ids=["bhtd", "comfy_blhd_view"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_replay_equals_the_eager_call_bitwise(monkeypatch, cache, backend, comfy):
    from kernels import piecewise_sparse_attention as psa
    q, k, v = _qkv(comfy=comfy)
    want = _eager(monkeypatch, q, k, v, backend)
    outs = [psa(q, k, v, backend=backend, **KW) for _ in range(3)]
    assert cache.counts["eager"] == 1 and cache.counts["captures"] == 1 and cache.counts["replays"] == 1, cache.counts
    for out in outs:
        assert out.shape == want.shape and out.stride() == want.stride()
        assert torch.equal(out, want)
    (entry,) = cache._entries.values()
    assert [s.stride() for s in entry.inputs] == [q.stride(), k.stride(), v.stride()]


@pytest.mark.parametrize("backend", BACKENDS)
def test_result_is_the_callers_own_tensor_and_new_inputs_give_their_answer(monkeypatch, cache, backend):
    from kernels import piecewise_sparse_attention as psa
    q, k, v = _qkv()
    for _ in range(2):
        psa(q, k, v, backend=backend, **KW)
    out = psa(q, k, v, backend=backend, **KW)
    (entry,) = cache._entries.values()
    assert out.data_ptr() != entry.out.data_ptr()
    want = out.clone()
    out.fill_(7.0)
    assert torch.equal(psa(q, k, v, backend=backend, **KW), want)
    q2, k2, v2 = _qkv(seed=10)
    fresh = psa(q2, k2, v2, backend=backend, **KW)
    assert cache.counts["captures"] == 1 and cache.counts["replays"] == 3
    assert torch.equal(fresh, _eager(monkeypatch, q2, k2, v2, backend))
    assert not torch.equal(fresh, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_copy_outputs_equal_eager_and_a_held_one_is_never_overwritten(monkeypatch, cache, backend):
    from kernels import piecewise_sparse_attention as psa
    monkeypatch.setenv("PSA_CUDA_GRAPH_ZERO_COPY", "1")
    monkeypatch.setenv("PSA_CUDA_GRAPH_IN_PLACE", "4")
    wants = [_eager(monkeypatch, *_qkv(seed=s, comfy=True), backend) for s in (0, 10)]
    q, k, v = _qkv(comfy=True)
    with torch.inference_mode():  # how ComfyUI samples: each output consumed before the next call
        for i in range(6):
            out = psa(q, k, v, backend=backend, **KW)
            assert torch.equal(out, wants[0]), i
            del out
        assert cache.counts["held"] == 0 and cache.counts["replays"] >= 3, cache.counts
        kept = psa(q, k, v, backend=backend, **KW)  # lent, and kept
        assert any(kept.data_ptr() == e.out.data_ptr() for e in cache._entries.values())
        q2, k2, v2 = _qkv(seed=10, comfy=True)
        for x, y in ((q, q2), (k, k2), (v, v2)):
            x.copy_(y)
        other = psa(q, k, v, backend=backend, **KW)  # the in-place graph's output is held: another path
        torch.cuda.synchronize()
    assert torch.equal(kept, wants[0]) and torch.equal(other, wants[1])
    assert cache.counts["held"] >= 1


def test_capture_under_inference_mode_then_a_call_outside_it(monkeypatch, cache):
    from kernels import piecewise_sparse_attention as psa
    q, k, v = _qkv()
    with torch.inference_mode():  # how ComfyUI samples
        for _ in range(2):
            psa(q, k, v, backend="triton", **KW)
    assert cache.counts["captures"] == 1
    assert torch.equal(psa(q, k, v, backend="triton", **KW), _eager(monkeypatch, q, k, v, "triton"))


def test_a_capture_that_syncs_the_host_falls_back_eagerly_and_later_captures_work(cache):
    from kernels import graphs
    q, k, v = _qkv()

    def syncs(a, b, c):
        return a * float(b.sum().item())  # a host read: illegal while capturing

    want = q * float(k.sum().item())
    for _ in range(3):
        assert torch.equal(cache.run("sync", syncs, lambda: syncs(q, k, v), q, k, v), want)
    assert cache.eager_only("sync") is not None and "sync" not in cache
    assert torch.cuda.current_stream() == torch.cuda.default_stream()  # the failed capture left no side stream

    def fine(a, b, c):
        return a + 2 * b - c
    for _ in range(3):
        assert torch.equal(cache.run("fine", fine, lambda: fine(q, k, v), q, k, v), q + 2 * k - v)
    assert "fine" in cache and cache.counts["replays"] == 1
    assert graphs.graph_reason(q, k, v) is None


def test_clearing_the_cache_gives_its_memory_back(cache):
    from kernels import piecewise_sparse_attention as psa
    q, k, v = _qkv()
    psa(q, k, v, backend="triton", **KW)  # the eager first call: caches (Morton order, autotune) live on
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = psa(q, k, v, backend="triton", **KW)
    del out
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    assert held >= 4 * q.numel() * q.element_size()  # static q, k, v and output at least
    cache.clear()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= before


def test_grad_and_large_calls_stay_eager(cache):
    from kernels import piecewise_sparse_attention as psa
    q, k, v = _qkv()
    qg = q.clone().requires_grad_()
    for _ in range(3):
        psa(qg, k, v, backend="triton", **KW)
    assert sum(cache.counts.values()) == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_place_graph_reads_the_callers_addresses_and_equals_eager(monkeypatch, cache, backend):
    """Same q, k, v addresses a third time: a graph captured on the caller's tensors replays with no copy-in;
    new values written at those addresses give their own answer, bit for bit the eager one."""
    from kernels import piecewise_sparse_attention as psa
    monkeypatch.setenv("PSA_CUDA_GRAPH_IN_PLACE", "4")
    q, k, v = _qkv(comfy=True)
    want = _eager(monkeypatch, q, k, v, backend)
    outs = [psa(q, k, v, backend=backend, **KW) for _ in range(4)]
    assert cache.counts["captures"] == 2 and cache.counts["in_place"] == 1, cache.counts
    for out in outs:
        assert torch.equal(out, want)
    q2, k2, v2 = _qkv(seed=20, comfy=True)
    want2 = _eager(monkeypatch, q2, k2, v2, backend)
    for x, y in ((q, q2), (k, k2), (v, v2)):
        x.copy_(y)
    assert torch.equal(psa(q, k, v, backend=backend, **KW), want2)
    assert cache.counts["in_place"] == 2

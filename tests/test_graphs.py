"""kernels/graphs.py on CPU (no GPU in CI): the policy, the key, the second-call capture rule, LRU eviction, the
failure path and the wiring into kernels.api, with a stand-in graph whose replay recomputes the captured function
from the static inputs into the static output (what a CUDA graph replay does). The real capture: test_graphs_gpu.py.
"""
import logging
import threading

import pytest
import torch

from kernels import api, dispatch, graphs, reference
from kernels.config import SparseConfig

LOGGER = "piecewise_sparse_attention"


class FakeGraph:
    def __init__(self, fn, inputs, out):
        self.fn, self.inputs, self.out = fn, inputs, out
        self.replays = 0
        self.was_reset = False
        self.fail_replay = False

    def replay(self):
        if self.fail_replay:
            raise RuntimeError("replay exploded")
        self.replays += 1
        with torch.inference_mode():  # a CUDA graph writes its output's memory whatever the caller's mode
            self.out.copy_(self.fn(*self.inputs))

    def reset(self):
        self.was_reset = True


class FakeCapture:
    """capture(fn, inputs) -> (graph, static out), recording what it captured; `fail` makes it raise."""

    def __init__(self, fail=None):
        self.graphs = []
        self.fail = fail

    def __call__(self, fn, inputs):
        if self.fail is not None:
            raise self.fail
        out = fn(*inputs)
        g = FakeGraph(fn, inputs, out)
        self.graphs.append(g)
        return g, out


class CudaLike:
    """What graph_reason reads of a tensor, for the CUDA-only conditions on a machine without CUDA."""

    is_cuda = True

    def __init__(self, T=4608, requires_grad=False, ptr=1024):
        self.shape = (1, 2, T, 64)
        self.requires_grad = requires_grad
        self._ptr = ptr

    def data_ptr(self):
        return self._ptr


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    for name in ("PSA_CUDA_GRAPHS", "PSA_CUDA_GRAPH_MAX_TOKENS", "PSA_CUDA_GRAPH_ENTRIES"):
        monkeypatch.delenv(name, raising=False)
    # the copy-in graphs' tests call with the same tensors again and again: in-place graphs (their own tests
    # below) off unless a test turns them on
    monkeypatch.setenv("PSA_CUDA_GRAPH_IN_PLACE", "0")
    # and they hold earlier outputs while they call again: zero-copy outputs (their own tests below) off too
    monkeypatch.setenv("PSA_CUDA_GRAPH_ZERO_COPY", "0")
    monkeypatch.setattr(graphs, "_capturing", lambda: False)
    monkeypatch.setattr(graphs, "_compiling", lambda: False)
    monkeypatch.setattr(dispatch, "_logged", set())  # log_once lines are seen again in each test


def _qkv(shape=(1, 2, 100, 16), seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g) for _ in range(3))


def _work(calls):
    def fn(q, k, v):
        calls.append(1)
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    return fn


def _cache_call(cache, key, q, k, v, calls):
    fn = _work(calls)
    return cache.run(key, fn, lambda: fn(q, k, v), q, k, v)


# ---------------------------------------------------------------------------------------------------
# policy

def test_policy_allows_small_cuda_calls_without_autograd():
    t = CudaLike()
    assert graphs.graph_reason(t, t, t) is None


def test_policy_env_switch_turns_graphs_off(monkeypatch):
    t = CudaLike()
    monkeypatch.setenv("PSA_CUDA_GRAPHS", "0")
    assert graphs.graph_reason(t, t, t) == "PSA_CUDA_GRAPHS=0"
    monkeypatch.setenv("PSA_CUDA_GRAPHS", "1")
    assert graphs.graph_reason(t, t, t) is None


def test_policy_refuses_cpu_tensors():
    q, k, v = _qkv()
    assert graphs.graph_reason(q, k, v) == "not CUDA tensors"


def test_policy_refuses_calls_that_need_autograd_only_when_grad_mode_is_on():
    t, g = CudaLike(), CudaLike(requires_grad=True)
    assert "autograd" in graphs.graph_reason(t, g, t)
    with torch.no_grad():
        assert graphs.graph_reason(t, g, t) is None
    with torch.inference_mode():
        assert graphs.graph_reason(t, g, t) is None


def test_policy_refuses_under_torch_compile_tracing(monkeypatch):
    t = CudaLike()
    monkeypatch.setattr(graphs, "_compiling", lambda: True)
    assert "torch.compile" in graphs.graph_reason(t, t, t)


def test_policy_refuses_while_a_capture_is_running(monkeypatch):
    t = CudaLike()
    monkeypatch.setattr(graphs, "_capturing", lambda: True)
    assert "capture is already running" in graphs.graph_reason(t, t, t)


def test_policy_token_threshold_default_16384_and_env(monkeypatch):
    assert graphs.graph_reason(*(CudaLike(T=16384),) * 3) is None
    assert "PSA_CUDA_GRAPH_MAX_TOKENS=16384" in graphs.graph_reason(*(CudaLike(T=16385),) * 3)
    monkeypatch.setenv("PSA_CUDA_GRAPH_MAX_TOKENS", "4096")
    assert "4608 tokens" in graphs.graph_reason(*(CudaLike(T=4608),) * 3)
    monkeypatch.setenv("PSA_CUDA_GRAPH_MAX_TOKENS", "not a number")
    assert graphs.max_tokens() == graphs.DEFAULT_MAX_TOKENS


def test_policy_refuses_inputs_not_16_byte_aligned():
    t = CudaLike()
    assert "16-byte aligned" in graphs.graph_reason(t, CudaLike(ptr=1026), t)


# ---------------------------------------------------------------------------------------------------
# key

def test_same_call_gives_the_same_key_and_each_change_a_new_one():
    cfg = SparseConfig(density=0.2, scale=0.25)
    q, k, v = _qkv((1, 2, 128, 16))
    base = graphs.make_key("triton", q, k, v, cfg, "morton", (8, 8), 64)
    assert base == graphs.make_key("triton", q.clone(), k.clone(), v.clone(), cfg, "morton", [8, 8], 64)
    assert hash(base) == hash(graphs.make_key("triton", q, k, v, SparseConfig(density=0.2, scale=0.25), "morton",
                                              (8, 8), 64))
    # ComfyUI's [B, L, H*D] viewed as [B, H, L, D]: same shape, other strides
    comfy = torch.randn(1, 128, 2 * 16).view(1, 128, 2, 16).transpose(1, 2)
    assert comfy.shape == q.shape
    changed = [
        graphs.make_key("cute", q, k, v, cfg, "morton", (8, 8), 64),
        graphs.make_key("triton", comfy, k, v, cfg, "morton", (8, 8), 64),
        graphs.make_key("triton", q, k, comfy, cfg, "morton", (8, 8), 64),
        graphs.make_key("triton", *_qkv((1, 2, 129, 16)), cfg, "none", None, 0),
        graphs.make_key("triton", q.half(), k.half(), v.half(), cfg, "morton", (8, 8), 64),
        graphs.make_key("triton", q, k, v, SparseConfig(density=0.3, scale=0.25), "morton", (8, 8), 64),
        graphs.make_key("triton", q, k, v, SparseConfig(density=0.2, scale=0.25, n_sink_blocks=1), "morton",
                        (8, 8), 64),
        graphs.make_key("triton", q, k, v, cfg, "none", None, 64),
        graphs.make_key("triton", q, k, v, cfg, "morton", (4, 16), 64),
        graphs.make_key("triton", q, k, v, cfg, "morton", (8, 8), 0),
    ]
    assert all(c != base for c in changed)
    assert len(set(changed)) == len(changed)


def test_every_kernel_setting_read_at_call_time_changes_the_key(monkeypatch):
    # a setting the captured work reads when it runs (the CuTe kernel's build choices, head chunking) must be
    # in the key, or a changed setting would replay a graph of the old build
    import re
    from pathlib import Path
    kdir = Path(__file__).resolve().parents[1] / "kernels"
    # (the kernel's module, the switches it reads per call, the cube path's, and the order the node asks for; the
    # package's __init__ decides the backend, before any key is made)
    read = set().union(*(re.findall(r'"(PSA_[A-Z0-9_]+)"', (kdir / f).read_text()) for f in (
        "cute/fwd.py", "cute/switches.py", "cute/fwd_cube.py", "reorder.py")))
    assert read and read <= set(graphs._ENV_IN_KEY), sorted(read - set(graphs._ENV_IN_KEY))
    # the Triton side: every PSA_ name a function of kernels/triton/ reads (per call; module-level knobs are fixed
    # for the process), e.g. stats_h.py's PSA_STATS_PERM_DEEP
    import ast
    called = set()
    for f in (kdir / "triton").glob("*.py"):
        for fn in ast.walk(ast.parse(f.read_text())):
            if isinstance(fn, ast.FunctionDef):
                called |= {n.value for n in ast.walk(fn) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                           and re.fullmatch(r"PSA_[A-Z0-9_]+", n.value)}
    assert {"PSA_STATS_PERM_DEEP", "PSA_MORTON_SCRATCH"} <= called
    assert called <= set(graphs._ENV_IN_KEY), sorted(called - set(graphs._ENV_IN_KEY))
    cfg = SparseConfig(density=0.2, scale=0.25)
    q, k, v = _qkv((1, 2, 128, 16))
    for name in graphs._ENV_IN_KEY:
        monkeypatch.delenv(name, raising=False)
        base = graphs.make_key("cute", q, k, v, cfg, "none", None, 0)
        monkeypatch.setenv(name, "1")
        assert graphs.make_key("cute", q, k, v, cfg, "none", None, 0) != base, name
        monkeypatch.delenv(name)


def test_key_includes_the_device(monkeypatch):
    cfg = SparseConfig(scale=0.25)
    q, k, v = _qkv()
    key = graphs.make_key("triton", q, k, v, cfg, "none", None, 0)
    assert "cpu" in key
    monkeypatch.setenv("PSA_TRITON_SCRATCH", "0.25")  # read by the captured work: part of the key
    assert graphs.make_key("triton", q, k, v, cfg, "none", None, 0) != key


# ---------------------------------------------------------------------------------------------------
# the cache

def test_first_call_runs_eagerly_the_second_captures_and_later_calls_replay():
    cap = FakeCapture()
    cache = graphs.GraphCache(capture=cap)
    q, k, v = _qkv()
    want = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    calls = []
    out1 = _cache_call(cache, "key", q, k, v, calls)
    assert cap.graphs == [] and "key" not in cache and cache.counts["eager"] == 1
    out2 = _cache_call(cache, "key", q, k, v, calls)
    assert len(cap.graphs) == 1 and "key" in cache and cache.counts["captures"] == 1
    out3 = _cache_call(cache, "key", q, k, v, calls)
    assert cache.counts["replays"] == 1 and len(cap.graphs) == 1 and cap.graphs[0].replays == 2
    for out in (out1, out2, out3):
        torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_returned_tensor_is_never_the_static_buffer_and_new_inputs_give_their_answer():
    cap = FakeCapture()
    cache = graphs.GraphCache(capture=cap)
    q, k, v = _qkv()
    for _ in range(2):
        _cache_call(cache, "key", q, k, v, [])
    out = _cache_call(cache, "key", q, k, v, [])
    entry = cache._entries["key"]
    assert out.data_ptr() != entry.out.data_ptr()
    assert all(out.data_ptr() != s.data_ptr() for s in entry.inputs)
    want = out.clone()
    out.fill_(123.0)  # the caller owns its result
    torch.testing.assert_close(_cache_call(cache, "key", q, k, v, []), want, rtol=0, atol=0)
    q2, k2, v2 = _qkv(seed=7)
    fresh = _cache_call(cache, "key", q2, k2, v2, [])
    torch.testing.assert_close(fresh, torch.softmax(q2 @ k2.transpose(-1, -2), -1) @ v2, rtol=0, atol=0)
    assert not torch.equal(fresh, want)


def test_zero_copy_lends_the_static_output_while_nobody_holds_the_last_one(monkeypatch):
    monkeypatch.setenv("PSA_CUDA_GRAPH_ZERO_COPY", "1")
    cache = graphs.GraphCache(capture=FakeCapture())
    _cache_call(cache, "key", *_qkv(), [])  # eager
    for seed in range(4):  # a sampling loop: each output consumed (here: checked, then dropped) before the next call
        q, k, v = _qkv(seed=seed)
        out = _cache_call(cache, "key", q, k, v, [])
        entry = cache._entries["key"]
        assert out.data_ptr() == entry.out.data_ptr()  # no copy
        torch.testing.assert_close(out, torch.softmax(q @ k.transpose(-1, -2), -1) @ v, rtol=0, atol=0)
        del out
    assert cache.counts["held"] == 0 and cache.counts["replays"] == 3 and entry.lend


def test_zero_copy_never_overwrites_an_output_still_held(monkeypatch, caplog):
    monkeypatch.setenv("PSA_CUDA_GRAPH_ZERO_COPY", "1")
    cap = FakeCapture()
    cache = graphs.GraphCache(capture=cap)
    q, k, v = _qkv()
    _cache_call(cache, "key", q, k, v, [])
    kept = _cache_call(cache, "key", q, k, v, [])  # captured: a view of the static output, and the caller keeps it
    want = kept.clone()
    view = kept.view(-1)  # a view of the view holds it too
    del kept
    q2, k2, v2 = _qkv(seed=5)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        other = _cache_call(cache, "key", q2, k2, v2, [])  # a replay would overwrite `view`: eager instead
    assert cache.counts["held"] == 1 and cap.graphs[0].replays == 1
    torch.testing.assert_close(view.view_as(want), want, rtol=0, atol=0)
    torch.testing.assert_close(other, torch.softmax(q2 @ k2.transpose(-1, -2), -1) @ v2, rtol=0, atol=0)
    assert "still held" in caplog.text
    entry = cache._entries["key"]
    assert not entry.lend  # copies from now on
    again = _cache_call(cache, "key", q2, k2, v2, [])  # `view` is still alive: eager again, never a replay
    assert cache.counts["held"] == 2 and cap.graphs[0].replays == 1
    del view
    third = _cache_call(cache, "key", q2, k2, v2, [])  # nothing held: a replay, returned as a copy
    assert cap.graphs[0].replays == 2 and third.data_ptr() != entry.out.data_ptr()
    keep_third = third
    fourth = _cache_call(cache, "key", q, k, v, [])  # copies are the caller's own: replays go on
    assert cap.graphs[0].replays == 3 and cache.counts["held"] == 2
    torch.testing.assert_close(keep_third, other, rtol=0, atol=0)
    torch.testing.assert_close(fourth, want, rtol=0, atol=0)
    torch.testing.assert_close(again, other, rtol=0, atol=0)


def test_zero_copy_copies_an_inference_capture_for_a_call_outside_inference_mode(monkeypatch):
    monkeypatch.setenv("PSA_CUDA_GRAPH_ZERO_COPY", "1")
    cache = graphs.GraphCache(capture=FakeCapture())
    q, k, v = _qkv()
    with torch.inference_mode():  # how ComfyUI samples
        for _ in range(2):
            out = _cache_call(cache, "key", q, k, v, [])
            del out
    out = _cache_call(cache, "key", q, k, v, [])  # outside: a view of an inference tensor could not be saved
    assert not out.is_inference() and out.data_ptr() != cache._entries["key"].out.data_ptr()
    w = torch.ones((), requires_grad=True)
    (out * w).sum().backward()  # autograd may save it
    assert cache.counts["held"] == 0


def test_zero_copy_in_place_graph_held_falls_back_to_the_copy_in_graph(monkeypatch):
    monkeypatch.setenv("PSA_CUDA_GRAPH_ZERO_COPY", "1")
    monkeypatch.setenv("PSA_CUDA_GRAPH_IN_PLACE", "4")
    cap = FakeCapture()
    cache = graphs.GraphCache(capture=cap)
    q, k, v = _qkv()
    outs = [_cache_call(cache, "key", q, k, v, []) for _ in range(3)]  # eager, copy-in capture, in-place capture
    del outs
    a = _cache_call(cache, "key", q, k, v, [])  # nothing held: an in-place replay
    b = _cache_call(cache, "key", q, k, v, [])  # `a` held: the in-place graph cannot replay; the copy-in one can
    want = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    for out in (a, b):
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert a.data_ptr() != b.data_ptr()
    assert len(cap.graphs) == 2 and cache.counts["in_place"] == 1 and cache.counts["held"] == 1
    assert b.data_ptr() == cache._entries["key"].out.data_ptr()  # lent by the copy-in graph


def test_static_buffers_keep_the_callers_strides():
    cap = FakeCapture()
    cache = graphs.GraphCache(capture=cap)
    x = torch.randn(1, 100, 2 * 16)
    q = x.view(1, 100, 2, 16).transpose(1, 2)  # ComfyUI's [B, L, H*D] as [B, H, L, D]
    k, v = q * 0.5, q.transpose(1, 2).contiguous().transpose(1, 2) + 1
    for _ in range(2):
        _cache_call(cache, "key", q, k, v, [])
    entry = cache._entries["key"]
    assert [s.stride() for s in entry.inputs] == [q.stride(), k.stride(), v.stride()]


def test_lru_evicts_the_least_recently_used_entry_and_frees_its_graph(monkeypatch):
    cap = FakeCapture()
    cache = graphs.GraphCache(capture=cap, max_entries_fn=lambda: 2)
    q, k, v = _qkv()
    for key in ("a", "b"):
        for _ in range(2):
            _cache_call(cache, key, q, k, v, [])
    _cache_call(cache, "a", q, k, v, [])  # a is now the most recent
    for _ in range(2):
        _cache_call(cache, "c", q, k, v, [])
    assert len(cache) == 2 and "b" not in cache and "a" in cache and "c" in cache
    assert cache.counts["evictions"] == 1
    graph_b = cap.graphs[1]
    assert graph_b.was_reset and graph_b.inputs is not None  # the cache dropped its own references
    # an evicted key starts again: one eager call, then a capture
    before = cache.counts["captures"]
    _cache_call(cache, "b", q, k, v, [])
    assert "b" not in cache and cache.counts["captures"] == before
    _cache_call(cache, "b", q, k, v, [])
    assert "b" in cache and cache.counts["captures"] == before + 1


def test_entries_env_limits_the_cache_and_zero_disables_capture(monkeypatch):
    assert graphs.max_entries() == graphs.DEFAULT_ENTRIES == 8
    monkeypatch.setenv("PSA_CUDA_GRAPH_ENTRIES", "0")
    cap = FakeCapture()
    cache = graphs.GraphCache(capture=cap)
    q, k, v = _qkv()
    for _ in range(3):
        _cache_call(cache, "key", q, k, v, [])
    assert cap.graphs == [] and cache.counts["eager"] == 3


def test_capture_failure_is_logged_once_marks_the_key_eager_and_returns_the_eager_result(caplog):
    cap = FakeCapture(fail=RuntimeError("operation not permitted when stream is capturing"))
    cache = graphs.GraphCache(capture=cap)
    q, k, v = _qkv()
    want = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    key = ("triton", "cuda:0", torch.bfloat16, (1, 2, 100, 16))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        outs = [_cache_call(cache, key, q, k, v, []) for _ in range(4)]
    for out in outs:
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert "stream is capturing" in cache.eager_only(key)
    assert key not in cache and cache.counts["failures"] == 1 and cache.counts["eager"] == 4
    lines = [r.getMessage() for r in caplog.records if "CUDA graph" in r.getMessage()]
    assert len(lines) == 1
    assert "capture failed" in lines[0] and "stream is capturing" in lines[0] and "triton" in lines[0]


def test_capture_failure_inside_the_captured_work_falls_back_too():
    cache = graphs.GraphCache(capture=FakeCapture())
    q, k, v = _qkv()

    def fn(a, b, c):
        raise ValueError("a kernel failed inside the capture")
    eager = []
    for _ in range(3):
        out = cache.run("key", fn, lambda: eager.append(1) or q + k + v, q, k, v)
        torch.testing.assert_close(out, q + k + v)
    assert len(eager) == 3 and "kernel failed" in cache.eager_only("key")


def test_replay_failure_drops_the_entry_and_runs_eagerly_from_then_on(caplog):
    cap = FakeCapture()
    cache = graphs.GraphCache(capture=cap)
    q, k, v = _qkv()
    want = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    key = ("triton", "cuda:0", torch.float16, (1, 2, 100, 16))
    for _ in range(2):
        _cache_call(cache, key, q, k, v, [])
    cap.graphs[0].fail_replay = True
    with caplog.at_level(logging.INFO, logger=LOGGER):
        outs = [_cache_call(cache, key, q, k, v, []) for _ in range(3)]
    for out in outs:
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert key not in cache and "replay failed" in cache.eager_only(key) and cap.graphs[0].was_reset
    assert sum("CUDA graph replay failed" in r.getMessage() for r in caplog.records) == 1
    assert len(cap.graphs) == 1  # never captured again


def test_capture_under_inference_mode_then_calls_outside_it():
    cache = graphs.GraphCache(capture=FakeCapture())
    q, k, v = _qkv()
    with torch.inference_mode():
        qi, ki, vi = (x.clone() for x in (q, k, v))
        for _ in range(2):
            _cache_call(cache, "key", qi, ki, vi, [])
    assert not any(s.is_inference() for s in cache._entries["key"].inputs)
    out = _cache_call(cache, "key", q, k, v, [])
    torch.testing.assert_close(out, torch.softmax(q @ k.transpose(-1, -2), -1) @ v, rtol=0, atol=0)


def test_threads_with_their_own_keys_get_their_own_answers():
    cache = graphs.GraphCache(capture=FakeCapture())
    inputs = [_qkv(seed=i) for i in range(4)]
    wants = [torch.softmax(q @ k.transpose(-1, -2), -1) @ v for q, k, v in inputs]
    bad = []

    def worker(i):
        for _ in range(20):
            out = _cache_call(cache, f"device{i}", *inputs[i], [])
            if not torch.equal(out, wants[i]):
                bad.append(i)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == [] and len(cache) == 4 and cache.counts["replays"] == 4 * 18


def test_clear_frees_every_graph():
    cap = FakeCapture()
    cache = graphs.GraphCache(capture=cap)
    q, k, v = _qkv()
    for key in ("a", "b"):
        for _ in range(2):
            _cache_call(cache, key, q, k, v, [])
    cache.clear()
    assert len(cache) == 0 and all(g.was_reset for g in cap.graphs)


# ---------------------------------------------------------------------------------------------------
# kernels.api through the cache (a stand-in "triton" backend: the reference, with a counter)

class _FakeFast:
    def __init__(self):
        self.calls = 0
        self.fail = False

    def forward(self, q, k, v, cfg):
        self.calls += 1
        if self.fail:
            raise RuntimeError("fast kernel failed")
        return reference.forward(q, k, v, cfg)


class _FakeFused(_FakeFast):
    """A backend that takes the Morton permutation itself (FUSED_REORDER, like triton and cute)."""

    FUSED_REORDER = True

    def forward(self, q, k, v, cfg, perm=None, n_prefix=0):
        from kernels.reorder import apply_reorder
        if perm is None:
            return super().forward(q, k, v, cfg)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel())
        out = super().forward(*(apply_reorder(x, perm, n_prefix) for x in (q, k, v)), cfg)
        return apply_reorder(out, inv, n_prefix)


@pytest.fixture(params=["reordered_copies", "fused_reorder"])
def fast_api(monkeypatch, request):
    fake = _FakeFast() if request.param == "reordered_copies" else _FakeFused()
    cap = FakeCapture()
    cache = graphs.GraphCache(capture=cap)
    monkeypatch.setattr(graphs, "_CACHE", cache)
    monkeypatch.setattr(api, "select_backend",
                        lambda q, cfg, backend, **kw: ("torch" if backend == "torch" else "triton", None))
    monkeypatch.setattr(api, "backend_module", lambda name: fake if name == "triton" else reference)
    # CPU tensors stand in for CUDA ones: every other condition of the policy still applies
    real = graphs.graph_reason
    monkeypatch.setattr(graphs, "graph_reason", lambda q, k, v: real(*(_as_cuda(x) for x in (q, k, v))))
    return fake, cap, cache


def _as_cuda(x):
    t = CudaLike(T=x.shape[2], requires_grad=x.requires_grad, ptr=x.data_ptr())
    t.shape = x.shape
    return t


KW = dict(density=0.5, variant="pwt", n_sink_blocks=1, reorder="morton", grid=(8, 8), n_prefix=36)


def _api_calls_equal_the_reference(calls):
    """`calls` API calls of one q, k, v through the cache, each equal to the torch reference's answer."""
    q, k, v = _qkv((1, 2, 100, 16))
    want = api.piecewise_sparse_attention(q, k, v, backend="torch", **KW)
    for _ in range(calls):
        torch.testing.assert_close(api.piecewise_sparse_attention(q, k, v, **KW), want, rtol=0, atol=0)


def test_api_fast_backend_calls_go_through_the_cache_with_morton_and_prefix(fast_api):
    fake, cap, cache = fast_api
    _api_calls_equal_the_reference(3)
    assert cache.counts == {"eager": 1, "captures": 1, "replays": 1, "failures": 0, "evictions": 0, "in_place": 0,
                            "held": 0}
    q2, k2, v2 = _qkv((1, 2, 100, 16), seed=3)
    torch.testing.assert_close(api.piecewise_sparse_attention(q2, k2, v2, **KW),
                               api.piecewise_sparse_attention(q2, k2, v2, backend="torch", **KW), rtol=0, atol=0)


def test_api_calls_with_zero_copy_outputs_equal_the_reference(fast_api, monkeypatch):
    fake, cap, cache = fast_api
    monkeypatch.setenv("PSA_CUDA_GRAPH_ZERO_COPY", "1")
    _api_calls_equal_the_reference(5)
    assert cache.counts["replays"] == 3 and cache.counts["held"] == 0
    assert next(iter(cache._entries.values())).lend


def test_api_keeps_autograd_calls_and_the_torch_backend_out_of_the_cache(fast_api, monkeypatch):
    fake, cap, cache = fast_api
    q, k, v = _qkv((1, 2, 100, 16))
    qg = q.clone().requires_grad_()
    for _ in range(3):
        api.piecewise_sparse_attention(qg, k, v, **KW)
    monkeypatch.setattr(api, "select_backend", lambda q, cfg, backend, **kw: ("torch", None))
    for _ in range(3):
        api.piecewise_sparse_attention(q, k, v, **KW)
    assert sum(cache.counts.values()) == 0


def test_api_backend_failure_during_capture_still_falls_back_to_the_reference(fast_api, caplog):
    fake, cap, cache = fast_api
    q, k, v = _qkv((1, 2, 100, 16))
    want = api.piecewise_sparse_attention(q, k, v, backend="torch", **KW)
    api.piecewise_sparse_attention(q, k, v, **KW)  # eager, fine
    fake.fail = True
    with caplog.at_level(logging.INFO, logger=LOGGER):
        out = api.piecewise_sparse_attention(q, k, v, **KW)  # capture raises, then eager falls back
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    msgs = [r.getMessage() for r in caplog.records]
    assert any("CUDA graph capture failed" in m for m in msgs)
    assert any("the triton backend failed" in m for m in msgs)
    with pytest.raises(RuntimeError, match="fast kernel failed"):
        api.piecewise_sparse_attention(q, k, v, on_failure="raise", **KW)


# ---------------------------------------------------------------------------------------------------
# in place: the same addresses again (a sampling loop) replay without the copy-in

def test_same_addresses_capture_in_place_on_the_third_call_and_read_what_they_hold(monkeypatch):
    monkeypatch.setenv("PSA_CUDA_GRAPH_IN_PLACE", "4")
    cap = FakeCapture()
    cache = graphs.GraphCache(capture=cap)
    q, k, v = _qkv()
    want = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    outs = [_cache_call(cache, "key", q, k, v, []) for _ in range(5)]
    assert len(cap.graphs) == 2 and cache.counts["captures"] == 2  # copy-in on call 2, in place on call 3
    assert cache.counts["in_place"] == 2 and cache.counts["replays"] == 2
    ikey = graphs._in_place_key("key", q, k, v)
    assert ikey in cache and cache._entries[ikey].inputs is None  # nothing of the caller's is held
    assert cap.graphs[1].inputs[0] is q  # captured on the caller's own tensor
    for out in outs:
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    # new values at the same addresses (what the caching allocator does between steps): their own answer
    q2, k2, v2 = _qkv(seed=3)
    for x, y in ((q, q2), (k, k2), (v, v2)):
        x.copy_(y)
    out = _cache_call(cache, "key", q, k, v, [])
    assert cache.counts["in_place"] == 3
    torch.testing.assert_close(out, torch.softmax(q2 @ k2.transpose(-1, -2), -1) @ v2, rtol=0, atol=0)
    # other addresses of the same shape: the copy-in graph, no new capture
    q3, k3, v3 = _qkv(seed=5)
    out = _cache_call(cache, "key", q3, k3, v3, [])
    assert len(cap.graphs) == 2 and cache.counts["replays"] == 4
    torch.testing.assert_close(out, torch.softmax(q3 @ k3.transpose(-1, -2), -1) @ v3, rtol=0, atol=0)


def test_addresses_that_keep_changing_never_capture_more_than_the_limit(monkeypatch):
    monkeypatch.setenv("PSA_CUDA_GRAPH_IN_PLACE", "2")
    cap = FakeCapture()
    cache = graphs.GraphCache(capture=cap)
    triples = [_qkv(seed=10 * i) for i in range(5)]
    for _ in range(4):
        for q, k, v in triples:
            out = _cache_call(cache, "key", q, k, v, [])
            torch.testing.assert_close(out, torch.softmax(q @ k.transpose(-1, -2), -1) @ v, rtol=0, atol=0)
    assert len(cap.graphs) == 1 + 2, "one copy-in graph and at most PSA_CUDA_GRAPH_IN_PLACE in-place ones"
    cache.clear()  # a new sampling run may capture again
    for _ in range(3):
        _cache_call(cache, "key", *triples[0], [])
    assert len(cap.graphs) == 3 + 2


def test_in_place_capture_failure_keeps_the_copy_in_graph_and_logs_once(monkeypatch, caplog):
    monkeypatch.setenv("PSA_CUDA_GRAPH_IN_PLACE", "4")

    class FailSecond(FakeCapture):
        def __call__(self, fn, inputs):
            if len(self.graphs) == 1:
                self.graphs.append(None)
                raise RuntimeError("in-place capture exploded")
            return super().__call__(fn, inputs)

    cap = FailSecond()
    cache = graphs.GraphCache(capture=cap)
    q, k, v = _qkv()
    want = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        outs = [_cache_call(cache, "key", q, k, v, []) for _ in range(5)]
    for out in outs:
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    lines = [r.getMessage() for r in caplog.records if "in-place capture failed" in r.getMessage()]
    assert len(lines) == 1 and "copy-in graph" in lines[0], lines
    assert cache.counts["failures"] == 1 and cache.counts["replays"] == 3 and "key" in cache


def test_api_calls_at_the_same_addresses_replay_in_place(fast_api, monkeypatch):
    monkeypatch.setenv("PSA_CUDA_GRAPH_IN_PLACE", "4")
    fake, cap, cache = fast_api
    _api_calls_equal_the_reference(5)
    assert cache.counts["captures"] == 2 and cache.counts["in_place"] == 2, cache.counts

"""CUDA graphs of whole operator calls, for small problems where the host's work costs more than the GPU's.

At FLUX.1 1024^2 (B1 H24 T4608 D128, pwt 0.2, Morton, 512 text tokens) one call takes 1.40 ms eagerly and 0.40 ms
replayed from a CUDA graph on the H200 (bench/results/pieces_h200.md): argument checks, ~9 launches, allocations
and the Morton gather / scatter are host time. This module keeps, per process, graphs of everything
`kernels.api._run` does for a fast backend (gather, statistics, routing, attention, scatter), keyed by all that
changes the captured work (`make_key`), and replays them:

* a key's first call runs eagerly (Triton autotune / JIT, the CuTe compile and lazy CUDA init happen outside any
  capture); its second call captures, after a warm-up on the side stream the capture then uses (PyTorch's CUDA
  graph rules); later calls copy the caller's q, k, v into the entry's static buffers (stream-ordered, no host
  sync), replay on the current stream and return a clone of the static output (never the buffer itself);
* `graph_reason` is the one policy (CUDA tensors, no autograd, no capture or torch.compile trace running, at most
  PSA_CUDA_GRAPH_MAX_TOKENS tokens, 16-byte aligned inputs; PSA_CUDA_GRAPHS=0 turns it off);
* in place: when the same q, k, v addresses (same shapes and strides) come back, as in a sampling loop where the
  caching allocator hands every block and step the same blocks, a third call captures the work once more on
  the caller's own tensors; later calls at those addresses replay it with no copy-in (it reads whatever those
  addresses hold when it runs, which the key guarantees is this call's q, k, v). No reference to the caller's
  tensors is kept. At most PSA_CUDA_GRAPH_IN_PLACE such graphs (default 4) are ever captured per cache, so
  addresses that keep changing never make calls re-capture;
* zero copy (PSA_CUDA_GRAPH_ZERO_COPY, default on): a replay returns a view of the static output instead of a clone
  when no earlier output of that graph is still held anywhere (its storage's use count is back to what the
  capture left: a sampling loop consumes each attention output before the next call). A replay would overwrite
  an output someone still holds, so such a call runs eagerly instead, and that graph clones from then on; a graph
  captured under inference_mode clones for calls outside it (autograd cannot save an inference tensor). The
  returned view is only as stream-safe as any output read on the stream that produced it;
* at most PSA_CUDA_GRAPH_ENTRIES graphs (LRU); evicting one frees its graph, memory pool and buffers;
* a capture or replay failure is logged once with its reason, the key runs eagerly from then on, and the call
  returns the eager result: the graph path never makes a call fail.

Host syncs: nothing the captured path runs reads GPU values on the host for T <= 16384 (N <= 256 blocks: the
Triton routing kernels, not kernels/triton/route.py's torch path, whose `int(n_forced.max())` is a sync; a process
where those kernels failed would fail the capture, which then falls back as above). The capture function is
injectable (`GraphCache(capture=...)`) so the cache logic is tested on CPU with a stand-in graph.
"""
from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from .dispatch import log_once

log = logging.getLogger("piecewise_sparse_attention")

DEFAULT_MAX_TOKENS = 16384
DEFAULT_ENTRIES = 8
DEFAULT_IN_PLACE = 4
# PyTorch's whole-network capture example warms up 3 iterations on the side stream before capturing
WARMUP_ITERS = 3
# environment variables the captured work reads at run time (head chunking, TMA, CuTe pipeline stages)
# (tests/test_graphs.py checks that every PSA_ variable kernels/cute/fwd.py reads is here)
_ENV_IN_KEY = ("PSA_TRITON_SCRATCH", "PSA_MORTON_SCRATCH", "PSA_TRITON_TMA", "PSA_CUTE_STAGES", "PSA_CUTE_QRS",
               "PSA_CUTE_BIAS_L2", "PSA_CUTE_BIAS_PF", "PSA_CUTE_OUT_PERM", "PSA_CUTE_PAIR", "PSA_CUTE_VT_STAGES",
               "PSA_CUTE_RECIP_STORE", "PSA_CUTE_PAIR_SHARE", "PSA_CUTE_Q_PERM",
               "PSA_CUTE_PAIR_Q_PERM", "PSA_CUTE_PAIR_OUT_PERM", "PSA_CUTE_TMA_STORE", "PSA_CUTE_TMA_STORE_ONE",
               "PSA_STATS_TMA_COPY", "PSA_STATS_PERM_DEEP", "PSA_STATS_GLUON", "PSA_STATS_GL_STAGES", "PSA_CUTE_BIAS_SLACK",
               "PSA_STATS_H",
               "PSA_SCORE_PREC", "PSA_SELECT_INTERP", "PSA_MORTON_ROLL",
               "PSA_CUTE_VT_PEEL", "PSA_TRITON_VT_PEEL", "PSA_CUTE_PINGPONG",
               "PSA_CUTE_TREE_MAX", "PSA_CUTE_TREE_SUM", "PSA_CUTE_S_AHEAD",
               "PSA_CUTE_PV_FENCE", "PSA_CUTE_PV_FENCE_VT", "PSA_CUTE_PV_PIN",
               "PSA_CUTE_S_AHEAD_VT", "PSA_CUTE_PAIR_DROP",
               "PSA_ROUTE_GLUON", "PSA_MORTON_CUBES", "PSA_CUTE_CUBE_VIEW",
               "PSA_CUTE_CUBE_KV")
# keys seen once (waiting for their second call) that are remembered
_MAX_SEEN = 256


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "").strip() or default)
    except ValueError:
        log_once(f"graphs-env:{name}", "piecewise_sparse_attention: %s=%r is not an integer; using %d", name,
                 os.environ.get(name), default, level=logging.WARNING)
        return default


def enabled() -> bool:
    return os.environ.get("PSA_CUDA_GRAPHS", "1").strip() != "0"


def zero_copy() -> bool:
    return os.environ.get("PSA_CUDA_GRAPH_ZERO_COPY", "1").strip() != "0"


def _uses(t) -> int | None:
    """How many tensors share t's storage (torch's storage use count, a private API: None where it is missing)."""
    try:
        return int(torch._C._storage_Use_Count(t.untyped_storage()._cdata))
    except Exception:  # noqa: BLE001  (another torch, or a stand-in output)
        return None


def max_tokens() -> int:
    return _env_int("PSA_CUDA_GRAPH_MAX_TOKENS", DEFAULT_MAX_TOKENS)


def max_entries() -> int:
    return max(0, _env_int("PSA_CUDA_GRAPH_ENTRIES", DEFAULT_ENTRIES))


def max_in_place() -> int:
    return max(0, _env_int("PSA_CUDA_GRAPH_IN_PLACE", DEFAULT_IN_PLACE))


def _in_place_key(key, q, k, v) -> tuple:
    return ("in place", key, q.data_ptr(), k.data_ptr(), v.data_ptr())


def _is_in_place(key) -> bool:
    return isinstance(key, tuple) and len(key) == 5 and key[0] == "in place"


def _capturing() -> bool:
    return torch.cuda.is_current_stream_capturing()


def _compiling() -> bool:
    comp = getattr(torch, "compiler", None)
    return bool(comp is not None and hasattr(comp, "is_compiling") and comp.is_compiling())


def graph_reason(q, k, v) -> str | None:
    """None when this call of a fast backend may go through the graph cache, else why not (data, not logged:
    most reasons are the normal case, e.g. a large problem)."""
    if not enabled():
        return "PSA_CUDA_GRAPHS=0"
    if not (q.is_cuda and k.is_cuda and v.is_cuda):
        return "not CUDA tensors"
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return "autograd needs the eager call (q, k or v requires grad)"
    if _compiling():
        return "torch.compile is tracing"
    if _capturing():
        return "a CUDA graph capture is already running on this stream"
    limit = max_tokens()
    if q.shape[2] > limit:
        return f"{q.shape[2]} tokens > PSA_CUDA_GRAPH_MAX_TOKENS={limit}"
    if any(t.data_ptr() % 16 for t in (q, k, v)):
        # the static buffers are aligned: the captured kernels (TMA or not) could differ from the eager call's
        return "q, k or v is not 16-byte aligned"
    return None


def make_key(backend: str, q, k, v, cfg, reorder: str, grid, n_prefix: int) -> tuple:
    """Everything that changes the captured work. `cfg` is the frozen kernels.config.SparseConfig (hashable)."""
    return (backend, str(q.device), q.dtype, tuple(q.shape), tuple(k.shape), tuple(v.shape), q.stride(), k.stride(),
            v.stride(), cfg, reorder, tuple(grid) if grid is not None else None, int(n_prefix),
            tuple(os.environ.get(e) for e in _ENV_IN_KEY))


def _static_like(x: torch.Tensor) -> torch.Tensor:
    """A buffer of x's shape and dtype with x's strides when x is non-overlapping and dense (else a dense layout in
    x's dimension order); a normal tensor even under inference_mode, so later calls outside it can copy in."""
    with torch.inference_mode(False):
        return torch.empty_like(x, memory_format=torch.preserve_format)


_streams: dict[str, torch.cuda.Stream] = {}


def _side_stream(device) -> torch.cuda.Stream:
    """One side stream per device for warm-up and capture (torch.cuda.graph's own default stream is created once
    per process on whichever device was current: wrong for a second GPU)."""
    s = _streams.get(str(device))
    if s is None:
        s = _streams.setdefault(str(device), torch.cuda.Stream(device))
    return s


def cuda_capture(fn, inputs):
    """(graph, static output) of fn(*inputs) on their CUDA device: WARMUP_ITERS calls on a side stream, then the
    capture on that stream. "thread_local": another thread's CUDA calls (ComfyUI MultiGPU: one thread per GPU)
    neither break this capture nor fail because of it."""
    device = inputs[0].device
    with torch.cuda.device(device):
        cur = torch.cuda.current_stream(device)
        side = _side_stream(device)
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_ITERS):
                fn(*inputs)
        cur.wait_stream(side)
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g, stream=side, capture_error_mode="thread_local"):
                out = fn(*inputs)
        finally:
            # a failed capture_end skips torch.cuda.graph's own stream restore: the caller's stream comes back here
            if torch.cuda.current_stream(device) != cur:
                torch.cuda.set_stream(cur)
    return g, out


def _describe(key) -> str:
    """'triton (1, 24, 4608, 128) bfloat16 on cuda:0' for a make_key key, else its repr."""
    if isinstance(key, tuple) and len(key) >= 4:
        backend, device, dtype, shape = key[:4]
        return f"{backend} {tuple(shape)} {str(dtype).replace('torch.', '')} on {device}"
    return repr(key)


@dataclass
class Entry:
    inputs: tuple | None  # static q, k, v (None: captured in place on the caller's tensors)
    graph: object  # .replay() (and .reset() for a CUDA graph)
    out: torch.Tensor  # static output, written by each replay
    done: object = None  # torch.cuda.Event after the last replay's clone; None off CUDA
    base_uses: int | None = None  # the static output's storage use count with nothing lent out (None: unknown)
    lend: bool = True  # replays may return views of `out` (zero copy) until an output was found still held


class GraphCache:
    """Captured graphs of operator calls by key (see the module docstring); thread-safe with one lock."""

    def __init__(self, capture=None, max_entries_fn=max_entries, max_in_place_fn=max_in_place):
        self._capture = capture if capture is not None else cuda_capture
        self._max_entries = max_entries_fn
        self._max_in_place = max_in_place_fn
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple, Entry] = OrderedDict()
        self._seen: OrderedDict[tuple, None] = OrderedDict()
        self._addr_seen: OrderedDict[tuple, int] = OrderedDict()  # in-place key -> calls seen at those addresses
        self._in_place_captured = 0
        self._eager_only: dict[tuple, str] = {}
        self.counts = {"eager": 0, "captures": 0, "replays": 0, "failures": 0, "evictions": 0, "in_place": 0,
                       "held": 0}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key) -> bool:
        return key in self._entries

    def eager_only(self, key) -> str | None:
        """Why `key` runs eagerly for good (a failure), or None."""
        return self._eager_only.get(key)

    def run(self, key, fn, eager, q, k, v):
        """This call's output. fn(q, k, v) is the work to capture and must raise on any failure; eager() computes
        the call without a graph (with its own fallbacks): the first call of a key and every failure use it."""
        with self._lock:
            ikey = _in_place_key(key, q, k, v) if self._max_in_place() > 0 else None
            if ikey is not None:
                ientry = self._entries.get(ikey)
                if ientry is not None:
                    self._entries.move_to_end(ikey)
                    try:
                        out = self._replay(ientry, q, k, v)
                        if out is not None:
                            self.counts["replays"] += 1
                            self.counts["in_place"] += 1
                            return out
                        self.counts["held"] += 1  # its last output is still held: the copy-in graph, or eager
                    except Exception as e:
                        self._fail(ikey, "in-place replay", e)
                seen = self._addr_seen.pop(ikey, 0)
                self._addr_seen[ikey] = seen + 1
                while len(self._addr_seen) > _MAX_SEEN:
                    self._addr_seen.popitem(last=False)
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                if (ikey is not None and seen >= 2 and ikey not in self._eager_only and ikey not in self._entries
                        and self._in_place_captured < self._max_in_place()):
                    try:
                        out = self._new_in_place(ikey, fn, q, k, v)
                        self.counts["captures"] += 1
                        return out
                    except Exception as e:
                        self._fail(ikey, "in-place capture", e)
                try:
                    out = self._replay(entry, q, k, v)
                    if out is not None:
                        self.counts["replays"] += 1
                        return out
                    self.counts["held"] += 1  # its last output is still held: this call runs eagerly
                except Exception as e:
                    self._fail(key, "replay", e)
            elif key in self._seen and key not in self._eager_only and self._max_entries() > 0:
                try:
                    out = self._new_entry(key, fn, q, k, v)
                    self.counts["captures"] += 1
                    return out
                except Exception as e:
                    self._fail(key, "capture", e)
            elif key not in self._eager_only:
                # the first call: JIT, autotune, compile and lazy CUDA init happen here, outside any capture
                self._seen[key] = None
                while len(self._seen) > _MAX_SEEN:
                    self._seen.popitem(last=False)
            self.counts["eager"] += 1
        return eager()

    def _make_room(self):
        while self._entries and len(self._entries) >= self._max_entries():
            self._free(self._entries.popitem(last=False)[1])
            self.counts["evictions"] += 1

    def _new_in_place(self, ikey, fn, q, k, v):
        """Capture fn on the caller's own q, k, v (their addresses are part of `ikey`); counted against
        max_in_place for good, whether it succeeds or not, so changing addresses never re-capture."""
        self._in_place_captured += 1
        self._make_room()
        with torch.no_grad():
            graph, out = self._capture(fn, (q, k, v))
        entry = Entry(None, graph, out, torch.cuda.Event() if q.is_cuda else None, _uses(out))
        result = self._replay(entry, q, k, v)
        self._addr_seen.pop(ikey, None)
        self._entries[ikey] = entry
        log_once("graphs:in-place", "piecewise_sparse_attention: CUDA graphs in place: calls whose q, k, v come back "
                 "at the same addresses replay without copying them in (at most %d such graphs, "
                 "PSA_CUDA_GRAPH_IN_PLACE)", self._max_in_place())
        return result

    def _new_entry(self, key, fn, q, k, v):
        self._make_room()
        static = tuple(_static_like(x) for x in (q, k, v))
        with torch.no_grad():
            for s, x in zip(static, (q, k, v)):
                s.copy_(x)
            graph, out = self._capture(fn, static)
        entry = Entry(static, graph, out, torch.cuda.Event() if q.is_cuda else None, _uses(out))
        result = self._replay(entry, q, k, v)
        self._seen.pop(key, None)
        self._entries[key] = entry
        log_once("graphs:on", "piecewise_sparse_attention: CUDA graphs on: calls of at most %d tokens replay a graph "
                 "captured on their second call (up to %d shapes held; PSA_CUDA_GRAPHS=0 turns this off)",
                 max_tokens(), self._max_entries())
        return result

    @staticmethod
    def _replay(entry: Entry, q, k, v):
        """This call's output from the graph, or None when an earlier output of it is still held (a replay would
        overwrite it): the caller then runs the call eagerly."""
        with torch.no_grad():
            if entry.base_uses is not None:
                uses = _uses(entry.out)
                if uses is not None and uses < entry.base_uses:
                    entry.base_uses = uses  # a reference the capture left has gone: the lower count is the base
                if uses is not None and uses > entry.base_uses:
                    if entry.lend:
                        entry.lend = False
                        log_once("graphs:held", "piecewise_sparse_attention: an attention output was still held at "
                                 "the next call of its CUDA graph: that call ran eagerly, and the graph's calls return "
                                 "copies from now on", level=logging.INFO)
                    return None
            if entry.done is not None:
                # the last replay's clone may still be running on another stream: finish it before the copy-in
                torch.cuda.current_stream(q.device).wait_event(entry.done)
            if entry.inputs is not None:  # an in-place graph reads the caller's tensors where they are
                for s, x in zip(entry.inputs, (q, k, v)):
                    s.copy_(x)
            entry.graph.replay()
            # a view (the storage's use count says when the caller let it go); a copy where the caller could not
            # use a view: an inference tensor (captured under inference_mode) for a call outside it
            if (entry.lend and entry.base_uses is not None and zero_copy()
                    and (torch.is_inference_mode_enabled() or not entry.out.is_inference())):
                out = entry.out[...]
            else:
                out = entry.out.clone()
            if entry.done is not None:
                entry.done.record(torch.cuda.current_stream(q.device))
        return out

    def _fail(self, key, stage: str, e: BaseException) -> None:
        reason = f"{type(e).__name__}: {str(e)[:240]}"
        self._eager_only[key] = f"{stage} failed ({reason})"
        self._seen.pop(key, None)
        self.counts["failures"] += 1
        old = self._entries.pop(key, None)
        if old is not None:
            self._free(old)
        then = ("its calls use the copy-in graph from now on" if _is_in_place(key)
                else "this shape runs eagerly from now on")
        if log_once(f"graphs:fail:{stage}:{key!r}", "piecewise_sparse_attention: CUDA graph %s failed for %s (%s); "
                    "%s", stage, _describe(key[1] if _is_in_place(key) else key), reason, then,
                    level=logging.WARNING):
            log.debug("piecewise_sparse_attention: CUDA graph %s traceback", stage, exc_info=e)

    @staticmethod
    def _free(entry: Entry) -> None:
        if entry.done is not None:
            entry.done.synchronize()  # its last replay and clone are done before the memory goes back
        reset = getattr(entry.graph, "reset", None)
        if callable(reset):
            reset()
        entry.inputs = entry.out = entry.graph = None

    def clear(self) -> None:
        """Free every graph and forget which keys were seen or failed."""
        with self._lock:
            while self._entries:
                self._free(self._entries.popitem(last=False)[1])
            self._seen.clear()
            self._addr_seen.clear()
            self._in_place_captured = 0
            self._eager_only.clear()


_CACHE = GraphCache()


def cache() -> GraphCache:
    """The process's cache (kernels.api uses it)."""
    return _CACHE


def run(key, fn, eager, q, k, v):
    return _CACHE.run(key, fn, eager, q, k, v)


def clear() -> None:
    """Free every cached graph (e.g. before a memory-hungry step; later calls capture again)."""
    _CACHE.clear()

"""Installing piecewise sparse attention on a ComfyUI model.

`apply_piecewise_sparse_attention(model, **knobs)` clones the ModelPatcher and sets
`transformer_options["optimized_attention_override"]` to a `SparseAttentionOverride` that keeps any
override installed before it as `prev`. Per sampling run it reads, for every attention call:
- the block index: `block_index`/`block_type` in newer ComfyUI, else by counting self-attention calls of
  the current forward (the counter lives in per-run state keyed by CFG branch and device and is reset by
  a DIFFUSION_MODEL wrapper at the start of every forward);
- the step: the current sigma against `sample_sigmas` (a pass that starts where the previous one left
  off with leftover noise continues its step count);
- the token grid: `grid_sizes` in newer ComfyUI, else the DIFFUSION_MODEL wrapper reads the latent's
  shape (FLUX: text length from the context, image grid from the latent).
`policy.call_reason` decides; the operator runs with Morton order and the text prefix untouched; every
other call goes to the previous override or ComfyUI's own attention. An ON_PREPARE_STATE callback and the
wrapper re-install the override if a later node displaced it without chaining.

No ComfyUI import at module import time: ModelPatcher methods are used with their string keys.
Set PSA_DECISION_LOG=/path/file.jsonl to get one JSON line per attention call (tests read it).
"""
from __future__ import annotations

import json
import logging
import math
import os
import threading
import uuid
import weakref
from dataclasses import dataclass, field, replace

import torch

from ..kernels import piecewise_sparse_attention, select_backend
from ..kernels import dispatch as _dispatch
from ..kernels.config import SparseConfig
from . import policy, training

log = logging.getLogger("piecewise_sparse_attention.nodes")

KEY = "piecewise_sparse_attention"  # key of our wrapper and callbacks on the ModelPatcher
WRAPPER_DIFFUSION_MODEL = "diffusion_model"  # comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL
CB_PREPARE_STATE = "on_prepare_state"  # CallbacksMP.ON_PREPARE_STATE
CB_PRE_RUN = "on_pre_run"  # CallbacksMP.ON_PRE_RUN
CB_CLEANUP = "on_cleanup"  # CallbacksMP.ON_CLEANUP
OVERRIDE = "optimized_attention_override"
FORWARD_KEY = "psa_forward"  # transformer_options entry the wrapper sets for the current forward
DECISION_LOG_ENV = "PSA_DECISION_LOG"

_ARG_NAMES = ("q", "k", "v", "heads", "mask", "attn_precision", "skip_reshape", "skip_output_reshape")
_lock = threading.Lock()  # serialises the decision log's appends
_tls = threading.local()
_logged = _dispatch._logged  # one "logged once" registry for the whole pack (tests reset it)


def log_once(key: str, msg: str, *args, level=logging.INFO) -> bool:
    return _dispatch.log_once(key, msg, *args, level=level, logger=log)


# ---------------------------------------------------------------------------------------------------
# per-run state (module level, keyed by the override's uid: the override itself is deep-copied by
# ModelPatcher.clone(), so it holds no mutable state)

@dataclass
class BranchState:
    self_calls: int = 0  # self-attention calls seen in the current forward of this branch


@dataclass
class ProbeRecord:
    rel_err: dict[tuple[int, int], list[float]] = field(default_factory=dict)  # (step, block) -> errors
    pattern: torch.Tensor | None = None  # [Nq, N] bool, exact blocks of one head of one layer
    pattern_where: tuple[int, int] | None = None  # (step, block) of the pattern
    n_steps: int | None = None
    total_blocks: int = 0
    tokens: int = 0
    family: str = ""
    knobs: policy.Knobs | None = None
    tally: policy.Tally = field(default_factory=policy.Tally)
    runs: int = 0


@dataclass
class RunState:
    branches: dict[tuple, BranchState] = field(default_factory=dict)
    sigma_window: tuple[float, float] | None = None
    dense_sigma: float | None = None  # training: samples noisier than this stay dense (policy.training_dense_fraction)
    tally: policy.Tally = field(default_factory=policy.Tally)


_RUNS: dict[str, RunState] = {}
PROBES: dict[str, ProbeRecord] = {}
MAX_PROBES = 16  # probe records kept (most recent runs)


def run_state(uid: str) -> RunState:
    st = _RUNS.get(uid)
    if st is None:
        st = _RUNS[uid] = RunState()
    return st


def reset_run(uid: str) -> None:
    _RUNS.pop(uid, None)


# ---------------------------------------------------------------------------------------------------
# per-forward layout

@dataclass(frozen=True)
class ForwardInfo:
    family: str
    grid: tuple[int, ...] | None  # token grid after the prefix
    n_prefix: int
    reason: str | None = None  # the whole forward stays dense (with this reason)
    sigma: float | None = None  # read once per forward: on a GPU each read of a tensor is a device sync
    step: tuple[int, int] | None = None
    timing_known: bool = False
    sigmas: tuple[float, ...] | None = None  # each sample's sigma (read while training: per-sample decisions)

    @property
    def n_tokens(self) -> int | None:
        return None if self.grid is None else self.n_prefix + math.prod(self.grid)


_SCHEDULES: dict[tuple, tuple[weakref.ref, list[float]]] = {}


def sigma_and_step(to: dict) -> tuple[float | None, tuple[int, int] | None]:
    """The current sigma and (step, n_steps) from transformer_options; the schedule is read from the device
    once per run (cached by tensor identity), not once per attention call."""
    sig_t = to.get("sigmas")
    if not isinstance(sig_t, torch.Tensor) or not sig_t.numel():
        return None, None
    sigma = float(sig_t.detach().flatten()[0])
    sched = to.get("sample_sigmas")
    if isinstance(sched, torch.Tensor):
        key = (id(sched), sched.data_ptr(), sched.numel())
        hit = _SCHEDULES.get(key)
        # a freed schedule's id and storage can be recycled by the next run's: check it is the same tensor
        if hit is None or hit[0]() is not sched:
            if len(_SCHEDULES) > 64:
                _SCHEDULES.clear()
            values = [float(x) for x in sched.detach().float().cpu().tolist()]
            hit = _SCHEDULES[key] = (weakref.ref(sched), values, _pass_offset(values))
        sched, offset = hit[1], hit[2]
        step = policy.step_of(sigma, sched)
        return sigma, None if step is None else (step[0] + offset, step[1] + offset)
    return sigma, policy.step_of(sigma, sched)


# the last schedule seen: (its last sigma, steps done by its end). A pass that starts where the previous one
# stopped with leftover noise (two KSamplerAdvanced, Wan2.2 high/low noise models) continues its step count.
_LAST_PASS: list = [None]


def _pass_offset(values: list[float]) -> int:
    offset = 0
    last = _LAST_PASS[0]
    if last is not None and len(values) >= 2 and last[0] > 0.0:
        if abs(values[0] - last[0]) <= 1e-5 * max(1.0, abs(last[0])):
            offset = last[1]
    if len(values) >= 2:
        _LAST_PASS[0] = (values[-1], offset + len(values) - 1)
    return offset


def _ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def forward_info(family: str, diffusion_model, args, kwargs) -> ForwardInfo:
    """Token layout of one forward from the diffusion model's own arguments (old and new ComfyUI)."""
    x = args[0] if args else kwargs.get("x")
    context = args[2] if len(args) > 2 else kwargs.get("context")
    if not isinstance(x, torch.Tensor):
        return ForwardInfo(family, None, 0, "latent not a tensor")
    if family == "wan":
        if x.dim() != 5:
            return ForwardInfo(family, None, 0, f"Wan latent of rank {x.dim()}, expected 5")
        p = tuple(getattr(diffusion_model, "patch_size", (1, 2, 2)))
        t = x.shape[2]
        tdc = args[4] if len(args) > 4 else kwargs.get("time_dim_concat")
        if isinstance(tdc, torch.Tensor):
            t = _ceil_div(t, p[0]) * p[0] + tdc.shape[2]
        grid = (_ceil_div(t, p[0]), _ceil_div(x.shape[3], p[1]), _ceil_div(x.shape[4], p[2]))
        reason = None
        if isinstance(context, torch.Tensor) and context.shape[1] == math.prod(grid):
            # old ComfyUI has no block index: self and cross-attention would be indistinguishable
            reason = (f"the text context has as many tokens as the video ({context.shape[1]}); this ComfyUI "
                      f"gives no block index, so self- and cross-attention cannot be told apart")
        return ForwardInfo(family, grid, 0, reason)
    if family == "flux":
        if x.dim() != 4:
            return ForwardInfo(family, None, 0, f"FLUX latent of rank {x.dim()}, expected 4")
        p = int(getattr(diffusion_model, "patch_size", 2))
        n_txt = int(context.shape[1]) if isinstance(context, torch.Tensor) else 0
        grid = (_ceil_div(x.shape[2], p), _ceil_div(x.shape[3], p))
        return ForwardInfo(family, grid, n_txt)
    return ForwardInfo(family, None, 0, f"unknown family {family}")


# ---------------------------------------------------------------------------------------------------
# the override

def _unwrap(x):
    """Newer ComfyUI passes q/k/v in an AttentionTensorContainer: take the tensor out."""
    if isinstance(x, torch.Tensor) or x is None:
        return x
    take = getattr(x, "take", None)
    if callable(take):
        return take()
    for name in ("tensor", "data", "value"):
        t = getattr(x, name, None)
        if isinstance(t, torch.Tensor):
            return t
    return x


def _bind(args, kwargs) -> dict:
    bound = dict(zip(_ARG_NAMES, args))
    bound.update(kwargs)
    return bound


def _with_plain(args, kwargs, q, k, v):
    """The call's arguments with q/k/v as the plain tensors we took out of any container."""
    args = list(args)
    for i, (name, t) in enumerate((("q", q), ("k", k), ("v", v))):
        if i < len(args):
            args[i] = t
        elif name in kwargs:
            kwargs = {**kwargs, name: t}
    return tuple(args), kwargs


def _decision_log(entry: dict) -> None:
    path = os.environ.get(DECISION_LOG_ENV)
    if not path:
        return
    line = json.dumps(entry, sort_keys=True)
    with _lock:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


class SparseAttentionOverride:
    """`optimized_attention_override(func, *args, **kwargs)`: sparse where the policy allows, else `prev`.

    Picklable and deep-copyable (plain attributes); all mutable state is in module-level dicts keyed by
    `uid`."""

    def __init__(self, knobs: policy.Knobs, *, family: str, total_blocks: int, n_double: int = 0,
                 prev=None, uid: str | None = None, probe_id: str | None = None):
        self.knobs = knobs
        self.family = family
        self.total_blocks = int(total_blocks)
        self.n_double = int(n_double)
        self.prev = prev
        self.uid = uid or uuid.uuid4().hex
        self.probe_id = probe_id

    def with_prev(self, prev) -> "SparseAttentionOverride":
        return SparseAttentionOverride(self.knobs, family=self.family, total_blocks=self.total_blocks,
                                       n_double=self.n_double, prev=prev, uid=self.uid, probe_id=self.probe_id)

    def __repr__(self):
        return f"SparseAttentionOverride({self.family}, {self.knobs}, prev={self.prev!r})"

    def _next(self, func, args, kwargs):
        if self.prev is not None:
            return self.prev(func, *args, **kwargs)
        return func(*args, **kwargs)

    def __call__(self, func, *args, **kwargs):
        if getattr(_tls, "inside", False):
            # an override installed after ours chained an older copy of ours: decide only once per call
            return self._next(func, args, kwargs)
        _tls.inside = True
        try:
            return self._call(func, args, kwargs)
        finally:
            _tls.inside = False

    def _block_index(self, to: dict, st: RunState, branch: tuple, is_self: bool) -> int | None:
        if "block_index" in to:
            b = int(to["block_index"])
            btype = str(to.get("block_type", ""))
            if self.family == "flux" and "single" in btype:
                b += self.n_double
            return b
        if not is_self:
            return None
        bs = st.branches.setdefault(branch, BranchState())
        b = bs.self_calls % max(1, self.total_blocks)
        bs.self_calls += 1
        return b

    def _call(self, func, args, kwargs):
        bound = _bind(args, kwargs)
        q, k, v = (_unwrap(bound.get(n)) for n in ("q", "k", "v"))
        if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
            log_once("no-tensors", "piecewise sparse attention: q/k/v are not tensors (%s); attention stays "
                     "dense", type(bound.get("q")).__name__, level=logging.WARNING)
            return self._next(func, args, kwargs)
        args, kwargs = _with_plain(args, kwargs, q, k, v)
        to = bound.get("transformer_options") or {}
        heads = bound.get("heads")
        skip_reshape = bool(bound.get("skip_reshape", False))
        skip_output_reshape = bool(bound.get("skip_output_reshape", False))
        if skip_reshape:
            q_len, k_len, head_dim = q.shape[2], k.shape[2], q.shape[3]
        else:
            if not heads:
                return self._next(func, args, kwargs)
            q_len, k_len, head_dim = q.shape[1], k.shape[1], q.shape[2] // int(heads)
        st = run_state(self.uid)
        branch = (tuple(to.get("cond_or_uncond", ()) or ()), str(q.device))
        train = training.is_training(q, k, v)
        if train:  # the same index in a checkpointed block's forward and its recompute (nodes/training.py)
            block = training.block_from_stack(self.uid) if q_len == k_len else None
        else:
            block = self._block_index(to, st, branch, q_len == k_len)

        info: ForwardInfo | None = to.get(FORWARD_KEY)
        grid, n_prefix, fwd_reason = None, 0, None
        if "grid_sizes" in to and self.family == "wan":
            grid = tuple(int(g) for g in to["grid_sizes"])
        elif info is not None:
            grid, n_prefix, fwd_reason = info.grid, info.n_prefix, info.reason
        if "block_index" in to and fwd_reason is not None and fwd_reason.startswith("the text context"):
            fwd_reason = None  # newer ComfyUI tells the blocks apart
        n_expected = None if grid is None else n_prefix + math.prod(grid)

        sigma, step = (info.sigma, info.step) if info is not None and info.timing_known else sigma_and_step(to)

        call = policy.Call(q_len=int(q_len), k_len=int(k_len), head_dim=int(head_dim), dtype=str(q.dtype),
                           has_mask=bound.get("mask") is not None, n_tokens_expected=n_expected, block=block,
                           total_blocks=self.total_blocks, step=None if step is None else step[0],
                           n_steps=None if step is None else step[1], sigma=sigma,
                           sigma_window=st.sigma_window, forward_reason=fwd_reason, training=train,
                           dense_sigma=st.dense_sigma)
        rows = row_sigmas = None
        if train:  # each sample's own noise level decides (random per-sample sigmas)
            row_sigmas = training.per_row(training.sample_sigmas(to, info), q.shape[0])
            rows = [policy.call_reason(self.knobs, replace(call, sigma=sg)) for sg in row_sigmas]
            # all rows dense: the call is dense (first row's reason); some sparse: split below
            reason = None if any(r is None for r in rows) else rows[0]
        else:
            reason = policy.call_reason(self.knobs, call)
        if reason is None:
            reason = slow_path_reason(q, int(head_dim), self.knobs)
        if reason is not None:
            st.tally.add(reason)
        if reason is not None and not policy.is_routine(reason):
            log_once(f"reason:{self.family}:{reason}", "piecewise sparse attention (%s): dense because %s",
                     self.family, reason)
        sparse_rows = None if reason is not None or rows is None else [r is None for r in rows]
        _decision_log({"family": self.family, "block": block, "step": call.step, "n_steps": call.n_steps,
                       "q_len": call.q_len, "k_len": call.k_len, "branch": list(branch[0]),
                       "sparse": reason is None, "reason": reason, "probe": self.probe_id is not None,
                       "training": train, "recompute": train and training.in_recompute(),
                       "sparse_rows": sparse_rows, "row_sigmas": row_sigmas})
        if reason is not None:
            return self._next(func, args, kwargs)
        if sparse_rows is not None and not all(sparse_rows):
            return self._split_rows(func, args, kwargs, q, k, v, sparse_rows, rows, bound, st, call, grid, n_prefix)
        return self._sparse(func, args, kwargs, q, k, v, bound, st, call, grid, n_prefix)

    def _split_rows(self, func, args, kwargs, q, k, v, sparse_rows, rows, bound, st, call, grid, n_prefix):
        """Training batch whose samples disagree (random per-sample sigmas): the sparse rows through the
        operator, the others through the next attention, reassembled in batch order (differentiable)."""
        on = [b for b, x in enumerate(sparse_rows) if x]
        off = [b for b, x in enumerate(sparse_rows) if not x]
        for b in off:
            st.tally.add(rows[b])
        i_on = torch.tensor(on, device=q.device, dtype=torch.long)
        i_off = torch.tensor(off, device=q.device, dtype=torch.long)
        parts = []
        for idx, sparse in ((i_on, True), (i_off, False)):
            a, kw = _with_plain(args, kwargs, q[idx], k[idx], v[idx])
            if sparse:
                parts.append(self._sparse(func, a, kw, q[idx], k[idx], v[idx], bound, st, call, grid, n_prefix))
            else:
                parts.append(_unwrap(self._next(func, a, kw)))
        order = torch.argsort(torch.cat([i_on, i_off]))
        return torch.cat(parts)[order]

    def _sparse(self, func, args, kwargs, q, k, v, bound, st, call, grid, n_prefix):
        heads = bound.get("heads")
        skip_reshape = bool(bound.get("skip_reshape", False))
        skip_output_reshape = bool(bound.get("skip_output_reshape", False))
        head_dim = call.head_dim

        # [B, H, T, D] views for the operator
        if skip_reshape:
            qh, kh, vh = q, k, v
        else:
            b_, h_ = q.shape[0], int(heads)
            qh, kh, vh = (t.view(b_, t.shape[1], h_, head_dim).transpose(1, 2) for t in (q, k, v))
        kn = self.knobs
        sinks = policy.resolve_sink_blocks(kn.sink_blocks, n_prefix, kn.block_size)
        try:
            out = piecewise_sparse_attention(
                qh, kh, vh, density=kn.density, variant=kn.variant, band=kn.band, n_sink_blocks=sinks,
                cov_bias=kn.cov_bias, block_size=kn.block_size, reorder=kn.reorder,
                grid=grid if kn.reorder == "morton" else None, n_prefix=n_prefix, backend=kn.backend,
                on_failure="raise")
        except Exception:
            if training.in_recompute():
                # a checkpointed block's recompute (which may also stop early by raising) must take the
                # forward's path: never swap in dense attention here
                raise
            st.tally.add("operator failed, ran dense")
            if log_once("kernel-failure", "piecewise sparse attention: the operator failed; this call and "
                        "later failures run dense (traceback below, logged once)", level=logging.ERROR):
                log.exception("piecewise sparse attention: operator traceback")
            return self._next(func, args, kwargs)
        st.tally.add(None)

        if self.probe_id is not None:
            try:
                self._probe(func, args, kwargs, qh, kh, vh, out, call, sinks, n_prefix, grid, skip_output_reshape)
            except Exception:  # the probe only measures: its failure (e.g. out of memory) never breaks sampling
                if log_once("probe-failure", "piecewise sparse attention: the probe's dense comparison failed; "
                            "sampling goes on without it (traceback below, logged once)", level=logging.ERROR):
                    log.exception("piecewise sparse attention: probe traceback")

        if skip_output_reshape:
            return out
        return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)

    def _probe(self, func, args, kwargs, qh, kh, vh, out, call, sinks, n_prefix, grid, skip_output_reshape):
        """Side-by-side: the dense result of this very call, its relative error, one kept-block pattern."""
        rec = PROBES.setdefault(self.probe_id, ProbeRecord())
        rec.knobs, rec.family, rec.total_blocks, rec.n_steps = self.knobs, self.family, self.total_blocks, call.n_steps
        rec.tokens = call.q_len
        with torch.no_grad():
            dense = _unwrap(self._next(func, args, kwargs))
            if not skip_output_reshape:
                dense = dense.view(out.shape[0], out.shape[2], out.shape[1], out.shape[3]).transpose(1, 2)
            d = dense.float()
            err = float((out.float() - d).norm() / d.norm().clamp_min(1e-12))
        rec.rel_err.setdefault((call.step if call.step is not None else -1, call.block), []).append(err)
        mid = self.total_blocks // 2
        if rec.pattern is None and call.block is not None and call.block >= mid:
            rec.pattern = _kept_pattern(qh, kh, vh, self.knobs, sinks, n_prefix, grid)
            rec.pattern_where = (call.step, call.block)


def slow_path_reason(q: torch.Tensor, head_dim: int, kn: policy.Knobs, *, on_gpu: bool | None = None) -> str | None:
    """With backend "auto" on a GPU, inputs that no fast kernel takes would run on the PyTorch reference,
    which is slower than dense attention there: such calls stay dense (the reason is logged once). On a CPU
    the reference is what runs; an explicit backend (node input or PSA_BACKEND) is obeyed."""
    if kn.backend != "auto" or not (q.is_cuda if on_gpu is None else on_gpu):
        return None
    # once per (device, dtype, head_dim, knobs, PSA_BACKEND), not per attention call (`on_gpu` given: tests)
    key = (str(q.device), q.dtype, head_dim, kn.variant, kn.block_size, kn.cov_bias, os.environ.get("PSA_BACKEND"))
    if on_gpu is None and key in _SLOW_PATH:
        return _SLOW_PATH[key]
    reason = _slow_path_check(q, head_dim, kn)
    if on_gpu is None:
        _SLOW_PATH[key] = reason
    return reason


_SLOW_PATH: dict[tuple, str | None] = {}


def _slow_path_check(q: torch.Tensor, head_dim: int, kn: policy.Knobs) -> str | None:
    probe = q.new_empty((1, 1, 1, head_dim))  # what the backends check: device, dtype, head_dim
    cfg = SparseConfig(density=kn.density, variant="pwt" if kn.variant == "off" else kn.variant,
                       band=kn.band, cov_bias=kn.cov_bias, block_size=kn.block_size, scale=head_dim ** -0.5)
    try:
        name, why = select_backend(probe, cfg, "auto")
    except ValueError:  # e.g. a bad PSA_BACKEND: the operator call reports it and the call runs dense
        return None
    if name == "torch" and why is not None:
        return f"no fast kernel takes these inputs on the GPU ({why}); the reference would be slower than dense"
    return None


def _kept_pattern(qh, kh, vh, kn: policy.Knobs, sinks: int, n_prefix: int, grid) -> torch.Tensor:
    """[Nq, N] bool: the exact KV blocks of batch 0, head 0, in the operator's (reordered) token order."""
    from ..kernels.config import SparseConfig
    from ..kernels.reorder import apply_reorder, orders_on
    from ..kernels.routing import block_stats, route

    q, k, v = (t[:1, :1] for t in (qh, kh, vh))
    if kn.reorder == "morton" and grid is not None:
        perm, _ = orders_on(grid, q.device)
        q, k, v = (apply_reorder(t, perm, n_prefix) for t in (q, k, v))
    variant = kn.variant if kn.variant in ("pwt", "pisa", "drop") else "pwt"
    cfg = SparseConfig(density=kn.density, variant=variant, band=kn.band, n_sink_blocks=sinks,
                       cov_bias=kn.cov_bias, block_size=kn.block_size, scale=q.shape[-1] ** -0.5)
    stats = block_stats(q, k, v, kn.block_size, need_hnorm=kn.cov_bias)
    return route(stats, cfg).exact[0, 0].cpu()


# ---------------------------------------------------------------------------------------------------
# keeping the override installed

def _chain_contains(obj, uid: str, depth: int = 0) -> bool:
    """Best effort: does this override (or what it wraps) contain our override `uid`?"""
    if obj is None or depth > 8:
        return False
    if isinstance(obj, SparseAttentionOverride):
        return obj.uid == uid or _chain_contains(obj.prev, uid, depth + 1)
    inner = []
    for name in ("prev", "previous", "__wrapped__", "func", "__self__", "orig", "original"):
        inner.append(getattr(obj, name, None))
    inner.extend(getattr(obj, "args", ()) or ())
    for cell in getattr(obj, "__closure__", None) or ():
        try:
            inner.append(cell.cell_contents)
        except ValueError:
            pass
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        inner.extend(d.values())
    return any(x is not obj and callable(x) and _chain_contains(x, uid, depth + 1) for x in inner)


def ensure_installed(transformer_options: dict, override: SparseAttentionOverride) -> bool:
    """Re-install `override` if a later node displaced it without chaining; True when it re-installed."""
    if not isinstance(transformer_options, dict):
        return False
    cur = transformer_options.get(OVERRIDE)
    if _chain_contains(cur, override.uid):
        return False
    if isinstance(cur, SparseAttentionOverride):
        return False  # another of our nodes, applied later, replaced this one on purpose
    transformer_options[OVERRIDE] = override.with_prev(cur)
    if cur is not None:
        log_once(f"reinstall:{override.uid}", "piecewise sparse attention: another node replaced the attention "
                 "override without chaining it; re-installed ours in front (it runs the calls we leave dense)")
    return True


class ForwardWrapper:
    """DIFFUSION_MODEL wrapper: layout of this forward, fresh block counter, override still installed."""

    def __init__(self, override: SparseAttentionOverride):
        self.override = override

    def __call__(self, executor, *args, **kwargs):
        to = kwargs.get("transformer_options")
        if not isinstance(to, dict):
            to = next((a for a in reversed(args) if isinstance(a, dict)), None)
        if to is None:
            return executor(*args, **kwargs)
        ensure_installed(to, self.override)
        dm = getattr(executor, "class_obj", None)
        info = forward_info(self.override.family, dm, args, kwargs)
        sigma, step = sigma_and_step(to)
        train = training.grad_mode()
        info = replace(info, sigma=sigma, step=step, timing_known=True,
                       sigmas=training.sample_sigmas(to, None) if train else None)
        if train:
            training.register_blocks(self.override.uid, self.override.family, dm)
        x = args[0] if args else kwargs.get("x")
        device = str(x.device) if isinstance(x, torch.Tensor) else "?"
        st = run_state(self.override.uid)
        st.branches[(tuple(to.get("cond_or_uncond", ()) or ()), device)] = BranchState()
        prev_info = to.get(FORWARD_KEY)
        to[FORWARD_KEY] = info
        try:
            return executor(*args, **kwargs)
        finally:
            # while training, checkpointed blocks are recomputed after this returns and read the entry again
            # (this dict belongs to this one model call)
            if train:
                pass
            elif prev_info is None:
                to.pop(FORWARD_KEY, None)
            else:
                to[FORWARD_KEY] = prev_info


def _patcher_in(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if hasattr(a, "model_options") and hasattr(a, "model"):
            return a
    return None


class PrepareStateCallback:
    """ON_PREPARE_STATE (called with any arguments): keep our override installed on the running patcher."""

    def __init__(self, override: SparseAttentionOverride):
        self.override = override

    def __call__(self, *args, **kwargs):
        patcher = _patcher_in(args, kwargs)
        if patcher is not None:
            ensure_installed(patcher.model_options.setdefault("transformer_options", {}), self.override)
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, dict) and isinstance(a.get("transformer_options"), dict):
                ensure_installed(a["transformer_options"], self.override)


class PreRunCallback:
    """ON_PRE_RUN: fresh run state; resolve start/end percent to sigmas with the running model_sampling."""

    def __init__(self, override: SparseAttentionOverride):
        self.override = override

    def __call__(self, *args, **kwargs):
        reset_run(self.override.uid)
        st = run_state(self.override.uid)
        kn = self.override.knobs
        patcher = _patcher_in(args, kwargs)
        if patcher is not None:
            try:
                ms = patcher.get_model_object("model_sampling")
                start = math.inf if kn.start_percent <= 0.0 else float(ms.percent_to_sigma(kn.start_percent))
                end = -math.inf if kn.end_percent >= 1.0 else float(ms.percent_to_sigma(kn.end_percent))
                st.sigma_window = (start, end)
                st.dense_sigma = float(ms.percent_to_sigma(policy.training_dense_fraction(kn.dense_steps)))
            except Exception as e:  # keep sampling; the policy reports the unknown window
                log_once("sigma-window", "piecewise sparse attention: cannot resolve start/end percent (%s)", e)
        if self.override.probe_id is not None:
            rec = PROBES.pop(self.override.probe_id, None)
            runs = rec.runs if rec is not None else 0
            PROBES[self.override.probe_id] = ProbeRecord(runs=runs + 1)
            while len(PROBES) > MAX_PROBES:  # every prompt's probe node has a fresh id: forget the oldest
                PROBES.pop(next(iter(PROBES)))


class CleanupCallback:
    """ON_CLEANUP: one summary line for the run, then forget its state."""

    def __init__(self, override: SparseAttentionOverride):
        self.override = override

    def __call__(self, *args, **kwargs):
        st = _RUNS.get(self.override.uid)
        if st is not None and (st.tally.sparse or st.tally.dense):
            log.info("piecewise sparse attention (%s, %s d=%.3f): %s", self.override.family,
                     self.override.knobs.variant, self.override.knobs.density, st.tally.summary())
            if self.override.probe_id is not None and self.override.probe_id in PROBES:
                PROBES[self.override.probe_id].tally = st.tally
        reset_run(self.override.uid)


# ---------------------------------------------------------------------------------------------------
# the pure entry point

def _uninstall(m) -> None:
    to = m.model_options.setdefault("transformer_options", {})
    cur = to.get(OVERRIDE)
    if isinstance(cur, SparseAttentionOverride):
        if cur.prev is None:
            to.pop(OVERRIDE, None)
        else:
            to[OVERRIDE] = cur.prev
    m.remove_wrappers_with_key(WRAPPER_DIFFUSION_MODEL, KEY)
    for cb in (CB_PREPARE_STATE, CB_PRE_RUN, CB_CLEANUP):
        m.remove_callbacks_with_key(cb, KEY)


def installed_override(model) -> SparseAttentionOverride | None:
    cur = model.model_options.get("transformer_options", {}).get(OVERRIDE)
    return cur if isinstance(cur, SparseAttentionOverride) else None


def model_layout(model) -> tuple[str | None, str | None, int, int]:
    """(family, reason, total_blocks, n_double) of a ModelPatcher."""
    base = getattr(model, "model", None)
    dm = getattr(base, "diffusion_model", None)
    family, reason = policy.model_family(type(base).__name__, type(dm).__name__)
    if family == "wan":
        return family, None, len(dm.blocks), 0
    if family == "flux":
        return family, None, len(dm.double_blocks) + len(dm.single_blocks), len(dm.double_blocks)
    return None, reason, 0, 0


def apply_piecewise_sparse_attention(model, *, variant: str = "pwt", density: float = 0.125, band: int = 1,
                                     sink_blocks: int | None = None, dense_steps: int = -1,
                                     start_percent: float = 0.0, end_percent: float = 1.0,
                                     dense_blocks=(0, -1), reorder: str = "morton", cov_bias: bool = False,
                                     min_tokens: int = 4096, backend: str = "auto", probe: bool = False):
    """A clone of `model` (a ComfyUI ModelPatcher) whose self-attention runs piecewise sparse.

    Knobs are in operator units (fractions, ints, a tuple of block indices; see policy.Knobs). A model
    that is not Wan2.1 or FLUX, or variant "off", comes back as a clone with attention untouched (one
    log line). With `probe=True` the next sampling run also computes dense attention for every sparse
    call and records the error (read with `probe_id_of`)."""
    knobs = policy.Knobs(variant=variant, density=float(density), band=int(band), sink_blocks=sink_blocks,
                         dense_steps=int(dense_steps), start_percent=float(start_percent),
                         end_percent=float(end_percent), dense_blocks=tuple(int(b) for b in dense_blocks),
                         reorder=reorder, cov_bias=bool(cov_bias), min_tokens=int(min_tokens), backend=backend)
    policy.validate_knobs(knobs)
    m = model.clone()
    _uninstall(m)
    if variant == "off":
        log_once("variant-off", "piecewise sparse attention: variant is off, the model passes through dense")
        return m
    family, reason, total_blocks, n_double = model_layout(m)
    if family is None:
        log_once(f"family:{reason}", "piecewise sparse attention: %s", reason)
        return m
    to = m.model_options.setdefault("transformer_options", {})
    override = SparseAttentionOverride(knobs, family=family, total_blocks=total_blocks, n_double=n_double,
                                       prev=to.get(OVERRIDE), probe_id=uuid.uuid4().hex if probe else None)
    to[OVERRIDE] = override
    m.add_wrapper_with_key(WRAPPER_DIFFUSION_MODEL, KEY, ForwardWrapper(override))
    m.add_callback_with_key(CB_PREPARE_STATE, KEY, PrepareStateCallback(override))
    m.add_callback_with_key(CB_PRE_RUN, KEY, PreRunCallback(override))
    m.add_callback_with_key(CB_CLEANUP, KEY, CleanupCallback(override))
    return m


def knobs_of(model) -> policy.Knobs | None:
    ov = installed_override(model)
    return None if ov is None else ov.knobs


def probe_id_of(model) -> str | None:
    ov = installed_override(model)
    return None if ov is None else ov.probe_id


def apply_probe(model):
    """The probe node: keep the knobs of a Piecewise Sparse Attention node upstream (defaults if none)."""
    kn = knobs_of(model) or policy.Knobs()
    if kn.variant == "off":
        kn = replace(kn, variant="pwt")
    return apply_piecewise_sparse_attention(
        model, variant=kn.variant, density=kn.density, band=kn.band, sink_blocks=kn.sink_blocks,
        dense_steps=kn.dense_steps, start_percent=kn.start_percent, end_percent=kn.end_percent,
        dense_blocks=kn.dense_blocks, reorder=kn.reorder, cov_bias=kn.cov_bias, min_tokens=kn.min_tokens,
        backend=kn.backend, probe=True)

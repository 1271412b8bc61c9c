"""Installing piecewise sparse attention on a ComfyUI model.

`apply_piecewise_sparse_attention(model, **knobs)` clones the ModelPatcher and sets
`transformer_options["optimized_attention_override"]` to a `SparseAttentionOverride` that keeps any
override installed before it as `prev`. Per sampling run it reads, for every attention call:
- the block index: `block_index`/`block_type` in newer ComfyUI, else by counting self-attention calls of
  the current forward (the counter lives in per-run state keyed by CFG branch and device and is reset by
  a DIFFUSION_MODEL wrapper at the start of every forward);
- the step (nodes/layout.py): the current sigma against `sample_sigmas` (a pass that starts where the
  previous one left off with leftover noise continues its step count);
- the token grid: `grid_sizes` in newer ComfyUI (Wan; the exact tokens around it from the wrapper's reading when its
  grid agrees), else the DIFFUSION_MODEL wrapper reads the latent's shape and the text length per model family
  (nodes/models.py; text in front or behind the latent tokens).
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
from dataclasses import replace

import torch

from ..kernels import piecewise_sparse_attention
from ..kernels import dispatch as _dispatch
from ..kernels import graphs
from . import chain, policy, state, training
from .call import block_index_of, bind, grid_of, layout_of, stg_skipped, unskipped, unwrap, with_plain
from .layout import _SCHEDULES, sigma_and_step  # noqa: F401 (tests read them here)
from .models import ForwardInfo, forward_info, model_spec, token_order  # noqa: F401 (re-exported)
from .speed import slow_path_reason  # noqa: F401 (tests call it here)
from .state import (MAX_PROBES, PROBES, _RUNS, BranchState, ProbeRecord, RunState,  # noqa: F401 (re-exported)
                    reset_run, run_state)

log = logging.getLogger("piecewise_sparse_attention.nodes")

KEY = "piecewise_sparse_attention"  # key of our wrapper and callbacks on the ModelPatcher
WRAPPER_DIFFUSION_MODEL = "diffusion_model"  # comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL
CB_PREPARE_STATE = "on_prepare_state"  # CallbacksMP.ON_PREPARE_STATE
CB_PRE_RUN = "on_pre_run"  # CallbacksMP.ON_PRE_RUN
CB_CLEANUP = "on_cleanup"  # CallbacksMP.ON_CLEANUP
OVERRIDE = "optimized_attention_override"
FORWARD_KEY = "psa_forward"  # transformer_options entry the wrapper sets for the current forward
DECISION_LOG_ENV = "PSA_DECISION_LOG"

_lock = threading.Lock()  # serialises the decision log's appends
_tls = threading.local()
_logged = _dispatch._logged  # one "logged once" registry for the whole pack (tests reset it)


def log_once(key: str, msg: str, *args, level=logging.INFO) -> bool:
    return _dispatch.log_once(key, msg, *args, level=level, logger=log)


# ---------------------------------------------------------------------------------------------------
# per-run state: nodes/state.py (module-level, keyed by the override's uid, locked: several devices' threads
# call one override at once under ComfyUI's MultiGPU CFG split)

# ---------------------------------------------------------------------------------------------------
# the override

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

    Every exception before or inside the sparse path becomes a dense call (`prev`, else ComfyUI's `func`) with
    one log line naming the reason; exceptions of the dense path itself are not ours to hide. Picklable and
    deep-copyable (plain attributes); all mutable state is in module-level dicts keyed by `uid`."""

    _psa_override = True  # how nodes/chain.py recognises ours

    def __init__(self, knobs: policy.Knobs, *, family: str, total_blocks: int, n_double: int = 0,
                 prev=None, uid: str | None = None, probe_id: str | None = None, foreign_below=frozenset()):
        self.knobs = knobs
        self.family = family
        self.total_blocks = int(total_blocks)
        self.n_double = int(n_double)
        self.prev = prev
        self.uid = uid or uuid.uuid4().hex
        self.probe_id = probe_id
        self.foreign_below = frozenset(foreign_below)  # core sparse nodes applied before ours (nodes/chain.py)

    def with_prev(self, prev) -> "SparseAttentionOverride":
        return SparseAttentionOverride(self.knobs, family=self.family, total_blocks=self.total_blocks,
                                       n_double=self.n_double, prev=prev, uid=self.uid, probe_id=self.probe_id,
                                       foreign_below=self.foreign_below)

    def __repr__(self):
        return f"SparseAttentionOverride({self.family}, {self.knobs}, prev={self.prev!r})"

    def _next(self, func, args, kwargs):
        prev = self.prev
        if self.foreign_below:
            prev = chain.skip_foreign(prev, self.foreign_below)
            if prev is not self.prev:
                log_once(f"skip-core:{self.uid}", "piecewise sparse attention: %s, applied before this node, is "
                         "skipped (the sparse node nearer the sampler decides; never both on one call)",
                         chain.CORE_NAME, level=logging.WARNING)
        if prev is not None:
            return prev(func, *args, **kwargs)
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

    def _dense(self, func, args, kwargs, reason: str, st: RunState | None = None, entry: dict | None = None):
        """The call goes on dense (prev or ComfyUI's function); the reason is tallied and logged once."""
        state.count(st or run_state(self.uid), reason)
        if not policy.is_routine(reason):
            log_once(f"reason:{self.family}:{reason}", "piecewise sparse attention (%s): dense because %s",
                     self.family, reason)
        _decision_log({"family": self.family, "sparse": False, "reason": reason, "probe": self.probe_id is not None,
                       **(entry or {})})
        return self._next(func, args, kwargs)

    def _block_index(self, to: dict, st: RunState, branch: tuple, is_self: bool):
        """(block index or None, reason it is unreadable or None)."""
        b, why = block_index_of(to)
        if why is not None:
            return None, why
        if b is not None:
            if self.n_double and "single" in str(to.get("block_type", "")):
                b += self.n_double  # FLUX, HunyuanVideo: single blocks numbered from 0
            return b, None
        if not is_self:  # counted: the joint self-attention calls of the forward (not refiners, not audio)
            return None, None
        # LTX's STG forward makes no call in its skipped blocks: count over the others
        skipped = stg_skipped(to, self.total_blocks)
        return unskipped(state.next_block(st, branch, self.total_blocks - len(skipped)), skipped), None

    def _call(self, func, args, kwargs):
        try:
            bound = bind(args, kwargs)
            q, k, v = (unwrap(bound.get(n)) for n in ("q", "k", "v"))
        except Exception as e:
            return self._dense(func, args, kwargs, f"its q/k/v could not be read ({type(e).__name__}: {e})")
        if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
            return self._dense(func, args, kwargs, f"q/k/v are not tensors ({type(bound.get('q')).__name__})")
        args, kwargs = with_plain(args, kwargs, q, k, v)
        try:
            plan = self._plan(bound, q, k, v)
        except Exception as e:  # a call this version does not understand: dense, never a broken sampling run
            if log_once(f"plan-failure:{type(e).__name__}", "piecewise sparse attention: reading an attention call "
                        "failed; it runs dense (traceback below, logged once)", level=logging.ERROR):
                log.exception("piecewise sparse attention: call traceback")
            return self._dense(func, args, kwargs, f"the call could not be read ({type(e).__name__}: {e})")
        reason, st, entry = plan[0], plan[1], plan[2]
        if reason is not None:
            return self._dense(func, args, kwargs, reason, st, entry)
        _decision_log({"family": self.family, "sparse": True, "reason": None, "probe": self.probe_id is not None,
                       **entry})
        rows = entry.get("sparse_rows")
        if rows is not None and not all(rows):
            return self._split_rows(func, args, kwargs, bound, q, k, v, rows, plan)
        return self._sparse(func, args, kwargs, bound, q, k, v, *plan[1:])

    def _split_rows(self, func, args, kwargs, bound, q, k, v, rows, plan):
        """Training batch whose samples disagree (random per-sample sigmas): the sparse rows through the
        operator, the others through the next attention, reassembled in batch order (differentiable)."""
        i_on = torch.tensor([b for b, x in enumerate(rows) if x], device=q.device, dtype=torch.long)
        i_off = torch.tensor([b for b, x in enumerate(rows) if not x], device=q.device, dtype=torch.long)
        state.count(plan[1], plan[2]["row_reasons"][int(i_off[0])])
        a, kw = with_plain(args, kwargs, q[i_on], k[i_on], v[i_on])
        on = self._sparse(func, a, kw, bound, q[i_on], k[i_on], v[i_on], *plan[1:])
        a, kw = with_plain(args, kwargs, q[i_off], k[i_off], v[i_off])
        off = unwrap(self._next(func, a, kw))
        return torch.cat([on, off])[torch.argsort(torch.cat([i_on, i_off]))]

    def _plan(self, bound, q, k, v):
        """(reason or None, run state, decision-log entry, call, layout, grid, n_prefix)."""
        to = bound.get("transformer_options") or {}
        if not isinstance(to, dict):
            return f"transformer_options is a {type(to).__name__}", run_state(self.uid), {}, None, None, None, 0
        lay = layout_of(bound, q, k, v)
        st = run_state(self.uid)
        branch = (tuple(to.get("cond_or_uncond", ()) or ()), str(q.device))
        info: ForwardInfo | None = to.get(FORWARD_KEY)
        grid, n_prefix, n_suffix, fwd_reason, side = None, 0, 0, None, None
        if to.get("grid_sizes") is not None and self.family == "wan":
            try:
                grid = grid_of(to["grid_sizes"])
            except ValueError as e:
                fwd_reason = f"grid_sizes unreadable ({e})"
            else:  # grid_sizes is the video's grid alone: the forward's exact tokens around it (Fun reference, Bernini)
                if info is not None and info.grid == grid:
                    n_prefix, n_suffix, fwd_reason = info.n_prefix, info.n_suffix, info.reason
        elif info is not None:
            grid, n_prefix, n_suffix, fwd_reason = info.grid, info.n_prefix, info.n_suffix, info.reason
        is_joint = lay.q_len is not None and lay.q_len == lay.k_len
        if info is not None and is_joint:
            side = info.side_stream(int(lay.q_len))
        n_expected = None if grid is None else n_prefix + math.prod(grid) + n_suffix
        counted = is_joint and side is None and (n_expected is None or lay.q_len == n_expected)
        train = training.is_training(q, k, v)
        if train:  # the same index in a checkpointed block's forward and its recompute (nodes/training.py)
            block, block_why = (training.block_from_stack(self.uid) if counted else None), None
        else:
            block, block_why = self._block_index(to, st, branch, counted)
        entry = {"block": block, "q_len": lay.q_len, "k_len": lay.k_len, "branch": list(branch[0]), "device": branch[1],
                 "step": None, "n_steps": None, "training": train, "recompute": train and training.in_recompute()}
        if lay.q_len is None or (lay.reason is not None and lay.q_len == lay.k_len):
            return lay.reason, st, entry, None, lay, None, 0, 0
        if block_why is None and to.get("block_index") is not None and fwd_reason is not None \
                and fwd_reason.startswith("the text context"):
            fwd_reason = None  # newer ComfyUI tells the blocks apart
        fwd_reason = fwd_reason or block_why or chain.step_aside_reason(to.get(chain.OVERRIDE), self)
        sigma, step = (info.sigma, info.step) if info is not None and info.timing_known else sigma_and_step(to)
        mask = bound.get("mask")  # Lens passes an all-zero mask to every call: none when its forward shows it
        has_mask = mask is not None and not (info is not None and is_joint and side is None
                                             and info.mask_is_none(mask, int(lay.q_len)))
        call = policy.Call(q_len=int(lay.q_len), k_len=int(lay.k_len), head_dim=int(lay.head_dim or 0),
                           dtype=str(q.dtype), has_mask=has_mask, n_tokens_expected=n_expected,
                           block=block, total_blocks=self.total_blocks, step=None if step is None else step[0],
                           n_steps=None if step is None else step[1], sigma=sigma, sigma_window=st.sigma_window,
                           forward_reason=fwd_reason, side_stream=side, training=train, dense_sigma=st.dense_sigma)
        entry.update(step=call.step, n_steps=call.n_steps)
        if train:  # each sample's own noise level decides (random per-sample sigmas); all dense: the first's reason
            row_sigmas = training.per_row(training.sample_sigmas(to, info), q.shape[0])
            row_reasons = [policy.call_reason(self.knobs, replace(call, sigma=sg)) for sg in row_sigmas]
            reason = None if any(r is None for r in row_reasons) else row_reasons[0]
            entry.update(row_sigmas=row_sigmas, row_reasons=row_reasons,
                         sparse_rows=[r is None for r in row_reasons])
        else:
            reason = policy.call_reason(self.knobs, call)
        if reason is None:
            reason = slow_path_reason(q, int(lay.head_dim), self.knobs, q_len=int(lay.q_len))
        return reason, st, entry, call, lay, grid, n_prefix, n_suffix

    def _sparse(self, func, args, kwargs, bound, q, k, v, st, entry, call, lay, grid, n_prefix, n_suffix):
        kn = self.knobs
        skip_reshape = bool(bound.get("skip_reshape", False))
        skip_output_reshape = bool(bound.get("skip_output_reshape", False))
        order = None
        if n_suffix:  # exact tokens behind the grid: one permutation puts them in front (Morton composed in)
            n_front, op_reorder, op_grid = n_prefix + n_suffix, "none", None
        else:
            n_front, op_reorder, op_grid = n_prefix, kn.reorder, grid if kn.reorder == "morton" else None
        sinks = policy.resolve_sink_blocks(kn.sink_blocks, n_front, kn.block_size)
        try:
            # [B, H, T, D] views for the operator
            if skip_reshape:
                qh, kh, vh = q, k, v
            else:
                qh, kh, vh = (t.view(t.shape[0], t.shape[1], lay.heads, lay.head_dim).transpose(1, 2)
                              for t in (q, k, v))
            if n_suffix:
                order = token_order(n_prefix, grid, n_suffix, kn.reorder == "morton", qh.device)
                qh, kh, vh = (t.index_select(-2, order[0]) for t in (qh, kh, vh))
            # the [B, L, H*D] ComfyUI wants back is then a view of the output (written in that order), not a copy
            layout = "bthd" if order is None and not skip_output_reshape else "q"
            out = piecewise_sparse_attention(
                qh, kh, vh, density=kn.density, variant=kn.variant, band=kn.band, n_sink_blocks=sinks,
                cov_bias=kn.cov_bias, block_size=kn.block_size, scale=lay.scale, reorder=op_reorder, grid=op_grid,
                n_prefix=0 if order is not None else n_prefix, backend=kn.backend, on_failure="raise",
                out_layout=layout)
            if order is not None:
                out = out.index_select(-2, order[1])
            flat = out if skip_output_reshape else out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)
        except Exception as e:
            if training.is_checkpoint_stop(e):  # a checkpointed recompute stopping early: not a failure
                raise
            if log_once("kernel-failure", "piecewise sparse attention: the operator failed; this call and "
                        "later failures run dense (traceback below, logged once)", level=logging.ERROR):
                log.exception("piecewise sparse attention: operator traceback")
            log_once(f"kernel-failure:{type(e).__name__}:{e}", "piecewise sparse attention: operator failure: "
                     "%s: %s", type(e).__name__, e, level=logging.WARNING)
            state.count(st, "operator failed, ran dense")
            return self._next(func, args, kwargs)
        state.count(st, None)

        if self.probe_id is not None:
            try:
                self._probe(func, args, kwargs, qh, kh, vh, out, call, sinks, n_front, op_grid, skip_output_reshape)
            except Exception:  # the probe only measures: its failure (e.g. out of memory) never breaks sampling
                if log_once("probe-failure", "piecewise sparse attention: the probe's dense comparison failed; "
                            "sampling goes on without it (traceback below, logged once)", level=logging.ERROR):
                    log.exception("piecewise sparse attention: probe traceback")
        return flat

    def _probe(self, func, args, kwargs, qh, kh, vh, out, call, sinks, n_prefix, grid, skip_output_reshape):
        """Side-by-side: the dense result of this very call, its relative error, one kept-block pattern."""
        rec = state.probe_record(self.probe_id)
        with torch.no_grad():
            dense = unwrap(self._next(func, args, kwargs))
            if not skip_output_reshape:
                dense = dense.view(out.shape[0], out.shape[2], out.shape[1], out.shape[3]).transpose(1, 2)
            d = dense.float()
            err = float((out.float() - d).norm() / d.norm().clamp_min(1e-12))
        want_pattern = rec.pattern is None and call.block is not None and call.block >= self.total_blocks // 2
        pattern = _kept_pattern(qh, kh, vh, self.knobs, sinks, n_prefix, grid) if want_pattern else None
        with state.locked():  # several devices' threads probe at once (MultiGPU CFG split)
            rec.knobs, rec.family, rec.total_blocks, rec.n_steps = self.knobs, self.family, self.total_blocks, call.n_steps
            rec.tokens = call.q_len
            rec.rel_err.setdefault((call.step if call.step is not None else -1, call.block), []).append(err)
            if pattern is not None and rec.pattern is None:
                rec.pattern, rec.pattern_where = pattern, (call.step, call.block)


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

def ensure_installed(transformer_options: dict, override: SparseAttentionOverride, *, settle: bool = True) -> bool:
    """Keep `override` in the chain (re-installed in front if a later node displaced it without chaining) and,
    with `settle`, on top when the core sparse nodes above it were applied before it (nodes/chain.py; done on a
    forward's own transformer_options, never on the sampler's, which the core node re-wraps every step); True
    when it moved."""
    if not isinstance(transformer_options, dict):
        return False
    cur = transformer_options.get(OVERRIDE)
    if chain.ensure_installed(transformer_options, override):
        if cur is not None:
            log_once(f"reinstall:{override.uid}", "piecewise sparse attention: another node replaced the attention "
                     "override without chaining it; re-installed ours in front (it runs the calls we leave dense)")
        return True
    return settle and chain.settle(transformer_options, override)


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
        if isinstance(x, (list, tuple)) and x:  # LTX-2, MiniMax-H3: [video, audio], one device
            x = x[0]
        device = str(x.device) if isinstance(x, torch.Tensor) else "?"
        st = run_state(self.override.uid)
        state.new_forward(st, (tuple(to.get("cond_or_uncond", ()) or ()), device))
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
            ensure_installed(patcher.model_options.setdefault("transformer_options", {}), self.override, settle=False)
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, dict) and isinstance(a.get("transformer_options"), dict):
                ensure_installed(a["transformer_options"], self.override, settle=False)


class PreRunCallback:
    """ON_PRE_RUN: fresh run state; resolve start/end percent to sigmas with the running model_sampling."""

    def __init__(self, override: SparseAttentionOverride):
        self.override = override

    def __call__(self, *args, **kwargs):
        patcher = _patcher_in(args, kwargs)
        if _is_multigpu_clone(patcher):
            return  # the main patcher's pre_run, called first, started this run for every device
        reset_run(self.override.uid)
        st = run_state(self.override.uid)
        kn = self.override.knobs
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
            state.new_probe(self.override.probe_id)


def _is_multigpu_clone(patcher) -> bool:
    """A per-device clone of ComfyUI's MultiGPU CFG split (comfy/multigpu.py): it carries copies of our
    callbacks, and its pre_run / cleanup follow the main patcher's within the same run."""
    return bool(getattr(patcher, "is_multigpu_base_clone", False))


class CleanupCallback:
    """ON_CLEANUP: one summary line for the run, then forget its state and free the operator's cached CUDA
    graphs (their static buffers are memory ComfyUI's model management does not see; the next run captures
    again on its second call of a shape)."""

    def __init__(self, override: SparseAttentionOverride):
        self.override = override

    def __call__(self, *args, **kwargs):
        if _is_multigpu_clone(_patcher_in(args, kwargs)):
            return  # the main patcher's cleanup, called first, ended the run
        st = _RUNS.get(self.override.uid)
        if st is not None and (st.tally.sparse or st.tally.dense):
            log.info("piecewise sparse attention (%s, %s d=%.3f): %s", self.override.family,
                     self.override.knobs.variant, self.override.knobs.density, st.tally.summary())
            if self.override.probe_id is not None and self.override.probe_id in PROBES:
                PROBES[self.override.probe_id].tally = st.tally
        reset_run(self.override.uid)
        graphs.clear()


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
    """(family, reason, total_blocks, n_double) of a ModelPatcher (nodes/models.py: by class hierarchy)."""
    spec = model_spec(model)
    return spec.family, spec.reason, spec.total_blocks, spec.n_double


def apply_piecewise_sparse_attention(model, *, variant: str = "pwt", density: float = 0.125, band: int = 1,
                                     sink_blocks: int | None = None, dense_steps: int = -1,
                                     start_percent: float = 0.0, end_percent: float = 1.0,
                                     dense_blocks=(0, -1), reorder: str = "morton", cov_bias: bool = False,
                                     min_tokens: int = 4096, backend: str = "auto", probe: bool = False):
    """A clone of `model` (a ComfyUI ModelPatcher) whose self-attention runs piecewise sparse.

    Knobs are in operator units (fractions, ints, a tuple of block indices; see policy.Knobs; `sink_blocks` and
    `dense_blocks` may also be the node's text), checked by policy.knobs_from (ValueError naming the input). A model
    of no family in policy.FAMILY_CLASSES, or variant "off", comes back as a clone with attention untouched (one
    log line). With `probe=True` the next sampling run also computes dense attention for every sparse
    call and records the error (read with `probe_id_of`)."""
    knobs = policy.knobs_from(variant=variant, density=density, band=band, sink_blocks=sink_blocks,
                              dense_steps=dense_steps, start_percent=start_percent, end_percent=end_percent,
                              dense_blocks=dense_blocks, reorder=reorder, cov_bias=cov_bias, min_tokens=min_tokens,
                              backend=backend)
    m = model.clone()
    _uninstall(m)
    if knobs.variant == "off":
        log_once("variant-off", "piecewise sparse attention: variant is off, the model passes through dense")
        return m
    family, reason, total_blocks, n_double = model_layout(m)
    if family is None:
        log_once(f"family:{reason}", "piecewise sparse attention: %s", reason)
        return m
    to = m.model_options.setdefault("transformer_options", {})
    prev = to.get(OVERRIDE)
    override = SparseAttentionOverride(knobs, family=family, total_blocks=total_blocks, n_double=n_double, prev=prev,
                                       probe_id=uuid.uuid4().hex if probe else None,
                                       foreign_below=chain.foreign_below(prev))
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

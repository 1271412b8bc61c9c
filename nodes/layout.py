"""Per-forward layout for the attention override: the token grid of one forward and the sampling step.

- the step: the current sigma against `sample_sigmas` (a pass that starts where the previous one left off
  with leftover noise continues its step count);
- the token grid: `grid_sizes` in newer ComfyUI, else the DIFFUSION_MODEL wrapper reads the latent's shape
  (FLUX: text length from the context, image grid from the latent).

No ComfyUI import; nodes/patch.py uses these per attention call and per forward.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch

from . import policy


@dataclass(frozen=True)
class ForwardInfo:
    family: str
    grid: tuple[int, ...] | None  # token grid after the prefix
    n_prefix: int
    reason: str | None = None  # the whole forward stays dense (with this reason)
    sigma: float | None = None  # read once per forward: on a GPU each read of a tensor is a device sync
    step: tuple[int, int] | None = None
    timing_known: bool = False

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
    sigma = float(sig_t.flatten()[0])
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

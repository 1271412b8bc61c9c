"""The sampling step of an attention call: the current sigma against `sample_sigmas` (a pass that starts where
the previous one left off with leftover noise continues its step count). The token grid of a forward per model
family is nodes/models.py's.

No ComfyUI import; nodes/patch.py uses these per attention call and per forward.
"""
from __future__ import annotations

import threading
import weakref

import torch

from . import policy


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
            values = [float(x) for x in sched.detach().float().cpu().tolist()]
            with _pass_lock:
                if len(_SCHEDULES) > 64:
                    _SCHEDULES.clear()
                hit = _SCHEDULES[key] = (weakref.ref(sched), values, _pass_offset(values))
        sched, offset = hit[1], hit[2]
        step = policy.step_of(sigma, sched)
        return sigma, None if step is None else (step[0] + offset, step[1] + offset)
    return sigma, policy.step_of(sigma, sched)


# the last schedule seen: (its sigmas, its step offset). A pass that starts where the previous one stopped with
# leftover noise (two KSamplerAdvanced, Wan2.2 high/low noise models) continues its step count. The same
# schedule seen again keeps its offset: ComfyUI's MultiGPU CFG split hands each extra device a copy
# (sample_sigmas.to(device), a new tensor every forward), read while the pass runs on every device.
_LAST_PASS: list = [None]
_pass_lock = threading.Lock()  # several devices' threads read schedules at once (MultiGPU CFG split)


def _pass_offset(values: list[float]) -> int:
    last = _LAST_PASS[0]
    if last is not None and last[0] == values:
        return last[1]
    offset = 0
    if last is not None and len(values) >= 2 and last[0][-1] > 0.0:
        end = last[0][-1]
        if abs(values[0] - end) <= 1e-5 * max(1.0, abs(end)):
            offset = last[1] + len(last[0]) - 1
    if len(values) >= 2:
        _LAST_PASS[0] = (values, offset)
    return offset

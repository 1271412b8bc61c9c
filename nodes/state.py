"""Per-run state of the attention override, shared by every thread that calls it.

The override itself is deep-copied by ModelPatcher.clone() and holds no mutable state; what a sampling run
accumulates lives here, in module-level dicts keyed by the override's uid. ComfyUI's MultiGPU CFG split
(comfy/multigpu.py, 0.33) calls one override from one worker thread per device at the same time, so every
mutation goes through `_lock` (a check-then-set or a read-modify-write of a counter would otherwise lose
updates: measured unlocked, 8 threads lost 0-13.5% of the dense counts in five trials). Per-forward block counters are keyed by
(cond_or_uncond, device): each device's thread counts only its own calls.

No ComfyUI import; nodes/patch.py re-exports these names.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from . import policy

_lock = threading.RLock()


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
        with _lock:
            st = _RUNS.setdefault(uid, RunState())
    return st


def reset_run(uid: str) -> None:
    with _lock:
        _RUNS.pop(uid, None)


def count(st: RunState, reason: str | None) -> None:
    """One decision of the run: sparse (None) or dense with `reason`."""
    with _lock:
        st.tally.add(reason)


def next_block(st: RunState, branch: tuple, total_blocks: int) -> int:
    """The counted block index of this self-attention call of `branch`'s current forward."""
    with _lock:
        bs = st.branches.setdefault(branch, BranchState())
        b = bs.self_calls % max(1, total_blocks)
        bs.self_calls += 1
    return b


def new_forward(st: RunState, branch: tuple) -> None:
    """A forward of `branch` starts: its block counter restarts at 0."""
    with _lock:
        st.branches[branch] = BranchState()


def new_probe(probe_id: str) -> None:
    """A probe run starts: a fresh record (keeping the run count); the oldest records beyond MAX_PROBES go."""
    with _lock:
        rec = PROBES.pop(probe_id, None)
        PROBES[probe_id] = ProbeRecord(runs=(rec.runs if rec is not None else 0) + 1)
        while len(PROBES) > MAX_PROBES:  # every prompt's probe node has a fresh id: forget the oldest
            PROBES.pop(next(iter(PROBES)))


def probe_record(probe_id: str) -> ProbeRecord:
    with _lock:
        return PROBES.setdefault(probe_id, ProbeRecord())


def locked():
    """The lock for a multi-field update of a record (probe errors, the kept-block pattern)."""
    return _lock

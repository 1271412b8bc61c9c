"""When the sparse path would be slower than dense attention on this GPU (the calls then stay dense, with the
reason): inputs no fast kernel takes (the PyTorch reference would run) and sizes below the measured break-even
(`nodes/breakeven_h200.json`, bench/pieces.py --breakeven). nodes/policy.py decides everything else; no ComfyUI
import.
"""
from __future__ import annotations

import json
import logging
import os

import torch

from ..kernels import dispatch as _dispatch
from ..kernels import graphs, select_backend
from ..kernels.config import SparseConfig
from . import policy

log = logging.getLogger("piecewise_sparse_attention.nodes")


def log_once(key: str, msg: str, *args, level=logging.INFO) -> bool:
    return _dispatch.log_once(key, msg, *args, level=level, logger=log)


def slow_path_reason(q: torch.Tensor, head_dim: int, kn: policy.Knobs, *, on_gpu: bool | None = None,
                     q_len: int | None = None) -> str | None:
    """With backend "auto" on a GPU, inputs that no fast kernel takes would run on the PyTorch reference,
    which is slower than dense attention there: such calls stay dense (the reason is logged once). On a CPU
    the reference is what runs; an explicit backend (node input or PSA_BACKEND) is obeyed. Under "auto" on a GPU
with a measured break-even table, sizes where the sparse operator is slower than dense stay dense too."""
    if kn.backend != "auto" or not (q.is_cuda if on_gpu is None else on_gpu):
        return None
    if on_gpu is None and q_len is not None:
        why = policy.breakeven_reason(_breakeven_table(), _gpu_name(q.device), q_len, kn.density,
                                      graphs=graphs.enabled() and q_len <= graphs.max_tokens())
        if why is not None:
            return why
    # once per (device, dtype, head_dim, knobs, PSA_BACKEND), not per attention call (`on_gpu` given: tests)
    key = (str(q.device), q.dtype, head_dim, kn.variant, kn.block_size, kn.cov_bias, os.environ.get("PSA_BACKEND"))
    if on_gpu is None and key in _SLOW_PATH:
        return _SLOW_PATH[key]
    reason = _slow_path_check(q, head_dim, kn)
    if on_gpu is None:
        _SLOW_PATH[key] = reason
    return reason


_SLOW_PATH: dict[tuple, str | None] = {}
_GPU_NAMES: dict[str, str] = {}
_BREAKEVEN: list = []


def _gpu_name(device) -> str | None:
    key = str(device)
    if key not in _GPU_NAMES:
        try:
            _GPU_NAMES[key] = torch.cuda.get_device_name(device)
        except Exception:  # no name, no break-even rule
            _GPU_NAMES[key] = ""
    return _GPU_NAMES[key] or None


def _breakeven_table() -> dict | None:
    """nodes/breakeven_h200.json (measured by bench/pieces.py --breakeven), read once; None if unreadable."""
    if not _BREAKEVEN:
        path = os.path.join(os.path.dirname(__file__), "breakeven_h200.json")
        try:
            with open(path) as f:
                _BREAKEVEN.append(json.load(f))
        except (OSError, ValueError) as e:
            log_once("breakeven-missing", "piecewise sparse attention: no break-even table (%s); sparse runs at "
                     "every size above min_tokens", e)
            _BREAKEVEN.append(None)
    return _BREAKEVEN[0]


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

"""When the sparse path would be slower than dense attention on this GPU (the calls then stay dense, with the
reason): inputs no fast kernel takes (the PyTorch reference would run) and sizes below the break-even measured on
that GPU model (`nodes/breakeven_<gpu>.json`, shipped for the H200; `bench/pieces.py --breakeven` measures one on
any GPU, and PSA_BREAKEVEN_DIR names a folder of such tables that comes first). nodes/policy.py decides
everything else; no ComfyUI import.
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
        gpu = _gpu_name(q.device)
        why = policy.breakeven_reason(_breakeven_table(gpu), gpu, q_len, kn.density,
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
_BREAKEVEN: dict[str, dict | None] = {}


def _gpu_name(device) -> str | None:
    key = str(device)
    if key not in _GPU_NAMES:
        try:
            _GPU_NAMES[key] = torch.cuda.get_device_name(device)
        except Exception:  # no name, no break-even rule
            _GPU_NAMES[key] = ""
    return _GPU_NAMES[key] or None


def _breakeven_table(gpu: str | None) -> dict | None:
    """The break-even table measured on `gpu` (bench/pieces.py --breakeven): breakeven_<policy.gpu_slug(gpu)>.json
    in PSA_BREAKEVEN_DIR (when set), else beside this file, whose "gpu" is that name (an unreadable or foreign
    file is said and skipped); read once per GPU name. None (sparse at every size above min_tokens, said once)
    when there is none."""
    if not gpu:
        return None
    if gpu not in _BREAKEVEN:
        name = f"breakeven_{policy.gpu_slug(gpu)}.json"
        dirs = [d for d in (os.environ.get("PSA_BREAKEVEN_DIR"), os.path.dirname(__file__)) if d]
        table, why = None, f"no {name} in {' or '.join(dirs)}"
        for d in dirs:
            path = os.path.join(d, name)
            if not os.path.exists(path):
                continue
            try:
                with open(path) as f:
                    t = json.load(f)
                if not (isinstance(t, dict) and t.get("gpu") == gpu):
                    raise ValueError(f"measured on {t.get('gpu') if isinstance(t, dict) else '?'!r}, not {gpu!r}")
            except (OSError, ValueError) as e:  # said, then the next folder's table
                why = f"{path} skipped ({type(e).__name__}: {e})"
                log_once(f"breakeven-bad:{path}", "piecewise sparse attention: break-even table %s", why,
                         level=logging.WARNING)
                continue
            table = t
            break
        if table is None:
            log_once(f"breakeven-missing:{gpu}", "piecewise sparse attention: no break-even table for the %s (%s); "
                     "sparse runs at every size above min_tokens (bench/pieces.py --breakeven measures one)", gpu, why)
        _BREAKEVEN[gpu] = table
    return _BREAKEVEN[gpu]


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

"""One cached backend chooser. "auto" = cute > triton > torch, the first that can run these inputs.

Backends are modules with `available()`, `unavailable_reason(q, cfg)` and `forward(q, k, v, cfg)`.
An import error is kept and reported as a reason; every reason is logged once; the environment variable
PSA_BACKEND overrides "auto". A requested backend that cannot run falls back to the reference loudly.
Autograd (`grad_reason`): when q, k or v require grad, "auto" (and PSA_BACKEND) only picks a backend that
differentiates, and an explicit backend that does not raises: an output is never silently detached.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading

import torch

from .config import BACKENDS

log = logging.getLogger("piecewise_sparse_attention")

_ORDER = ("cute", "triton", "torch")
_MODULES = {"torch": ".reference", "triton": ".triton", "cute": ".cute"}
_loaded: dict[str, object] = {}
_import_errors: dict[str, str] = {}
_logged: set[str] = set()
_lock = threading.Lock()


def log_once(key: str, msg: str, *args, level=logging.INFO, logger: logging.Logger | None = None) -> bool:
    """Log `msg` (to `logger`, default the pack's) the first time `key` is seen; True when it was logged now."""
    with _lock:
        if key in _logged:
            return False
        _logged.add(key)
    (logger or log).log(level, msg, *args)
    return True


def on_device(x):
    """`torch.cuda.device(x.device)` for a CUDA tensor, else a no-op: Triton and CuTe launch on the current CUDA
    device, not the tensors' (several GPUs in one process: ComfyUI's MultiGPU CFG split, one thread per device)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _module(name: str):
    if name in _loaded:
        return _loaded[name]
    if name in _import_errors:
        return None
    try:
        mod = importlib.import_module(_MODULES[name], __package__)
    except ModuleNotFoundError as e:
        own = f"{__package__}.{name}"
        # our own subpackage missing means this version ships no such backend; anything else is a
        # missing dependency of it
        _import_errors[name] = ("not part of this version" if e.name == own
                                else f"{type(e).__name__}: {e}")
        return None
    except Exception as e:  # keep the reason, report it, never crash the caller
        _import_errors[name] = f"{type(e).__name__}: {e}"
        return None
    _loaded[name] = mod
    return mod


def backend_module(name: str):
    return _module(name)


def unavailable_reason(name: str, q, cfg) -> str | None:
    mod = _module(name)
    if mod is None:
        err = _import_errors[name]
        if err == "not part of this version":
            return f"{name} backend is not part of this version"
        return f"{name} backend failed to import ({err})"
    try:
        if not mod.available():
            return mod.unavailable_reason(None, cfg) or f"{name} backend not available"
        return mod.unavailable_reason(q, cfg)
    except Exception as e:
        return f"{name} backend check raised {type(e).__name__}: {e}"


# backends whose forward is differentiable (routing detached): the reference by autograd, Triton by its own
# backward (kernels/triton/bwd.py); cute is forward-only
DIFFERENTIABLE = ("torch", "triton")


def grad_reason(name: str, *tensors) -> str | None:
    """Why backend `name` cannot run these tensors because autograd must flow through them (grad mode on and
    one of them requires grad), or None. The one place that decides; see DIFFERENTIABLE."""
    if name in DIFFERENTIABLE or not torch.is_grad_enabled():
        return None
    if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        return None
    return (f"the {name} backend has no backward yet and q, k or v requires grad; backend='torch' (or 'triton', "
            f"or 'auto') differentiates, torch.no_grad() needs no backward")


def select_backend(q, cfg, requested: str = "auto", *, k=None, v=None,
                   graphed: bool | None = None) -> tuple[str, str | None]:
    """(backend name, reason why a better or the requested backend was not used, or None). `graphed`: whether the
    call goes through the CUDA-graph cache (kernels.api passes the policy it read; None: read it here).

    Raises ValueError when `requested` is an explicit backend that cannot differentiate inputs that need it."""
    if requested not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {requested!r}")
    from_env = False
    if requested == "auto":
        env = os.environ.get("PSA_BACKEND", "").strip().lower()
        if env and env != "auto":
            if env not in BACKENDS:
                raise ValueError(f"PSA_BACKEND must be one of {BACKENDS}, got {env!r}")
            requested, from_env = env, True
    if requested != "auto":
        why_grad = grad_reason(requested, q, k, v)
        if why_grad is not None:
            if not from_env:
                raise ValueError(f"backend={requested!r} cannot be used here: {why_grad}")
            return "torch", f"PSA_BACKEND={requested!r} not used: {why_grad}"
        reason = unavailable_reason(requested, q, cfg)
        if reason is None:
            return requested, None
        return "torch", f"backend={requested!r} cannot run: {reason}; using the torch reference"
    skipped = []
    for name in _ORDER:
        reason = unavailable_reason(name, q, cfg) or grad_reason(name, q, k, v)
        if reason is None:
            # a backend that can run may still prefer not to under "auto" (e.g. too small to pay its
            # launch cost, which a call replayed from the CUDA-graph cache does not pay); an explicit request
            # runs it anyway
            skip = getattr(_module(name), "auto_skip_reason", None)
            try:
                if skip is not None and q is not None:
                    graphed = _graphed(q, k, v) if graphed is None else graphed
                    reason = skip(q, cfg, graphed=graphed)
                else:
                    reason = None
            except Exception as e:  # a broken heuristic never breaks dispatch
                reason = None
                log_once(f"autoskip:{name}", "piecewise_sparse_attention: %s auto_skip_reason raised %s: %s",
                         name, type(e).__name__, e, level=logging.WARNING)
        if reason is None:
            return name, ("; ".join(skipped) if skipped else None)
        skipped.append(reason)
    return "torch", "; ".join(skipped)


def _graphed(q, k, v) -> bool:
    """Whether kernels.api will run this call through the CUDA-graph cache (kernels/graphs.py's one policy):
    then a backend's per-call host work is paid once at capture, not at every call."""
    if k is None or v is None or not isinstance(q, torch.Tensor) or not q.is_cuda:
        return False
    from . import graphs  # graphs imports this module
    return graphs.graph_reason(q, k, v) is None


def backend_status(q=None, cfg=None) -> dict[str, str | None]:
    """{backend: None if usable for these inputs else the reason}, for logs and the README table."""
    from .config import SparseConfig

    cfg = cfg or SparseConfig(scale=1.0)
    return {name: unavailable_reason(name, q, cfg) for name in _ORDER}

"""The public operator."""
from __future__ import annotations

import logging

import torch

from .config import BACKENDS, REORDERS, VARIANTS, SparseConfig
from .dispatch import backend_module, log_once, select_backend, unavailable_reason
from .reorder import _check_grid, orders_on

log = logging.getLogger("piecewise_sparse_attention")
_DIFFERENTIABLE = ("torch", "triton")  # backends whose output carries a gradient (routing detached)


def _validate(q, k, v, density, variant, band, n_sink_blocks, block_size, reorder, grid, n_prefix, backend):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor [B, H, T, D], got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must have rank 4 [B, H, T, D], got shape {tuple(x.shape)}")
    if q.shape != k.shape or k.shape != v.shape:
        raise ValueError("q, k and v must have the same shape [B, H, T, D] (self-attention), got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[2] < 1 or q.shape[3] < 1:
        raise ValueError(f"q, k, v need T >= 1 and D >= 1, got shape {tuple(q.shape)}")
    if q.dtype != k.dtype or k.dtype != v.dtype or not q.dtype.is_floating_point:
        raise ValueError(f"q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.device != k.device or k.device != v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not isinstance(density, (int, float)) or not (0.0 < float(density) <= 1.0):
        raise ValueError(f"density must be in (0, 1] (the exact fraction of KV blocks), got {density!r}")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if not isinstance(band, int) or band < 0:
        raise ValueError(f"band must be an int >= 0 (exact diagonal blocks |i-j| <= band), got {band!r}")
    if not isinstance(n_sink_blocks, int) or n_sink_blocks < 0:
        raise ValueError(f"n_sink_blocks must be an int >= 0, got {n_sink_blocks!r}")
    if not isinstance(block_size, int) or block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16 (e.g. 64), got {block_size!r}")
    if reorder not in REORDERS:
        raise ValueError(f"reorder must be one of {REORDERS}, got {reorder!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    T = q.shape[2]
    if not isinstance(n_prefix, int) or not (0 <= n_prefix <= T):
        raise ValueError(f"n_prefix must be an int in [0, T={T}], got {n_prefix!r}")
    if reorder == "morton":
        if grid is None:
            raise ValueError("reorder='morton' needs grid=(F, H, W) or (H, W) of the tokens after n_prefix")
        g = _check_grid(grid)  # ValueError for anything but 2 or 3 positive sizes
        count = 1
        for x in g:
            count *= x
        if count != T - n_prefix:
            raise ValueError(f"prod(grid) = {count} must equal T - n_prefix = {T} - {n_prefix} = {T - n_prefix}")


def piecewise_sparse_attention(q, k, v, *, density=0.125, variant="pwt", band=1, n_sink_blocks=0,
                               cov_bias=False, block_size=64, scale=None, reorder="none", grid=None,
                               n_prefix=0, backend="auto", on_failure="reference"):
    """Piecewise sparse attention (PISA, and its second-order refinement PWT).

    Tokens are cut into blocks of `block_size`. For each query block i, the KV blocks S_i (the diagonal
    band |i-j| <= `band`, the first `n_sink_blocks`, and the best-scoring others up to
    ceil(density * N) blocks in all) are attended exactly; every other block j becomes one Taylor
    "virtual token" in the same softmax: logit s q.kbar_j (+ the gated second-order w_ij for PWT), value
    the block's value sum, plus PISA's first-order term s (q H-bar). Nothing is dropped (except with
    variant="drop", the keep-or-drop baseline). density=1 equals dense attention. See ../shared/MATH.md.

    Args:
        q, k, v: [B, H, T, D] tensors of one float dtype on one device.
        density: exact fraction of KV blocks, in (0, 1].
        variant: "pwt" (default), "pisa" or "drop".
        band: query block i keeps KV blocks |i - j| <= band exact.
        n_sink_blocks: the first n KV blocks are always exact (e.g. a text prefix).
        cov_bias: add log ||H_j - H-bar||_F to the routing score (PISA eq. 11).
        block_size: power of two, default 64.
        scale: softmax scale, default D ** -0.5.
        reorder: "none" or "morton" (Z-order over `grid`, prefix untouched, output in the caller's order).
        grid: (F, H, W) or (H, W) of the T - n_prefix tokens after the prefix, for reorder="morton".
        n_prefix: number of leading tokens that are not on the grid (e.g. FLUX text tokens).
        backend: "auto" (fastest that can run; env PSA_BACKEND overrides), "torch", "triton" or "cute".
        on_failure: what a fast backend's run-time failure does: "reference" (log once, compute this call
            with the PyTorch reference) or "raise" (re-raise, for callers with a better fallback, e.g. the
            ComfyUI node, which runs dense attention: on a GPU that is far faster than the reference).

    Returns:
        Tensor of q's shape and dtype.
    """
    _validate(q, k, v, density, variant, band, n_sink_blocks, block_size, reorder, grid, n_prefix, backend)
    if on_failure not in ("reference", "raise"):
        raise ValueError(f"on_failure must be 'reference' or 'raise', got {on_failure!r}")
    D = q.shape[-1]
    cfg = SparseConfig(density=float(density), variant=variant, band=band, n_sink_blocks=n_sink_blocks,
                       cov_bias=bool(cov_bias), block_size=block_size,
                       scale=float(D ** -0.5 if scale is None else scale))
    name, reason = select_backend(q, cfg, backend)
    if reason is not None:
        log_once(f"backend:{backend}:{name}:{reason}", "piecewise_sparse_attention: using the %s backend "
                 "(%s)", name, reason, level=logging.WARNING if backend != "auto" else logging.INFO)
    if name not in _DIFFERENTIABLE and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                                                    or v.requires_grad):
        # e.g. cute is forward-only: a call that needs gradients takes a backend with a backward
        alt = "triton" if unavailable_reason("triton", q, cfg) is None else "torch"
        log_once(f"grad:{name}:{alt}", "piecewise_sparse_attention: the %s backend has no backward; calls that "
                 "need gradients use the %s backend", name, alt)
        name = alt
    mod = backend_module(name)
    if q.is_cuda:
        # Triton launches on the current CUDA device, not the tensors' one (multi-GPU ComfyUI setups)
        with torch.cuda.device(q.device):
            return _run(mod, name, q, k, v, cfg, reorder, grid, n_prefix, on_failure)
    return _run(mod, name, q, k, v, cfg, reorder, grid, n_prefix, on_failure)


def _run(mod, name, q, k, v, cfg, reorder, grid, n_prefix, on_failure):
    if reorder == "morton":
        perm, inv = orders_on(grid, q.device)
        q, k, v = (_permute(mod, name, x, perm, n_prefix) for x in (q, k, v))
    try:
        out = mod.forward(q, k, v, cfg)
    except Exception:
        # inside the backward (a checkpointed recompute, which may stop early by raising) the reference would
        # save other tensors than the forward did: re-raise
        if name == "torch" or on_failure == "raise" or _in_backward():
            raise
        if log_once(f"fail:{name}", "piecewise_sparse_attention: the %s backend failed; this call and later "
                    "failures use the torch reference (traceback below, logged once)", name, level=logging.ERROR):
            log.exception("piecewise_sparse_attention: %s backend traceback", name)
        from . import reference
        out = reference.forward(q, k, v, cfg)
    if reorder == "morton":
        out = _permute(mod, name, out, inv, n_prefix)
    return out


def _in_backward() -> bool:
    fn = getattr(torch._C, "_current_graph_task_id", None)
    return fn is not None and fn() != -1


def _permute(mod, name, x, perm, n_prefix):
    """x's tokens after the prefix in `perm` order: the backend's own gather when it has one, else (or when
    that fails at run time, loudly) kernels.reorder."""
    from .reorder import apply_reorder

    gather = getattr(mod, "gather_tokens", None)
    if gather is not None:
        try:
            return gather(x, perm, n_prefix)
        except Exception:
            if _in_backward():
                raise
            if log_once(f"gather:{name}", "piecewise_sparse_attention: the %s backend's Morton gather failed; "
                        "reordering with torch instead (traceback below, logged once)", name, level=logging.ERROR):
                log.exception("piecewise_sparse_attention: %s gather traceback", name)
    return apply_reorder(x, perm, n_prefix)

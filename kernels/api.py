"""The public operator."""
from __future__ import annotations

import logging
import math
import sys

import torch

from . import graphs
from .config import BACKENDS, ON_FAILURE, REORDERS, ArgumentTypeError, as_choice, as_grid, as_int, make_config
from .dispatch import backend_module, log_once, select_backend
from .layout import in_layout as _in_layout
from .reorder import orders_on

log = logging.getLogger("piecewise_sparse_attention")

OUT_LAYOUTS = ("q", "bthd")


def _check_tensors(q, k, v) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise ArgumentTypeError(f"{name} must be a torch.Tensor [B, H, T, D], got {type(x).__name__}")
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


def _check_layout(T, reorder, grid, n_prefix):
    """(reorder, grid as a tuple of ints or None, n_prefix as an int)."""
    reorder = as_choice("reorder", reorder, REORDERS)
    n_prefix = as_int("n_prefix", n_prefix, f"an integer in [0, T={T}] (leading tokens not on the grid)")
    if not 0 <= n_prefix <= T:
        raise ValueError(f"n_prefix must be an integer in [0, T={T}] (leading tokens not on the grid), got {n_prefix}")
    if reorder != "morton":
        return reorder, None, n_prefix
    if grid is None:
        raise ValueError("reorder='morton' needs grid=(F, H, W) or (H, W) of the tokens after n_prefix")
    g = as_grid(grid)
    if math.prod(g) != T - n_prefix:
        raise ValueError(f"prod(grid) = {math.prod(g)} must equal T - n_prefix = {T} - {n_prefix} = {T - n_prefix}")
    return reorder, g, n_prefix


def piecewise_sparse_attention(q, k, v, *, density=0.125, variant="pwt", band=1, n_sink_blocks=0,
                               cov_bias=False, block_size=64, scale=None, reorder="none", grid=None,
                               n_prefix=0, backend="auto", on_failure="reference", out_layout="q"):
    """Piecewise sparse attention (PISA, and its second-order refinement PWT).

    Tokens are cut into blocks of `block_size`. For each query block i, the KV blocks S_i (the diagonal
    band |i-j| <= `band`, the first `n_sink_blocks`, and the best-scoring others up to
    ceil(density * N) blocks in all) are attended exactly; every other block j becomes one Taylor
    "virtual token" in the same softmax: logit s q.kbar_j (+ the gated second-order w_ij for PWT), value
    the block's value sum, plus PISA's first-order term s (q H-bar). Nothing is dropped (except with
    variant="drop", the keep-or-drop baseline). density=1 equals dense attention. See docs/MATH.md.
    Small no-grad CUDA calls of the fast backends replay a CUDA graph of the whole call from their second call
    on (kernels/graphs.py; env PSA_CUDA_GRAPHS=0 turns that off).

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
        out_layout: "q" (the output's memory laid out like q's) or "bthd" (in [B, T, H, D] order, returned as
            the [B, H, T, D] view: `out.transpose(1, 2).reshape(B, T, H * D)`, the [B, T, H*D] that ComfyUI's
            attention functions return, is then a view, not a copy; the fast backends write it so directly).

    Returns:
        Tensor of q's shape and dtype.
    """
    _check_tensors(q, k, v)
    reorder, grid, n_prefix = _check_layout(q.shape[2], reorder, grid, n_prefix)
    cfg = make_config(density=density, variant=variant, band=band, n_sink_blocks=n_sink_blocks,
                      cov_bias=cov_bias, block_size=block_size, scale=scale, head_dim=q.shape[-1])
    backend = as_choice("backend", backend, BACKENDS)
    on_failure = as_choice("on_failure", on_failure, ON_FAILURE)
    bthd = as_choice("out_layout", out_layout, OUT_LAYOUTS) == "bthd"
    if q.numel() == 0:  # B = 0 or H = 0: nothing to attend (still differentiable: an empty graph)
        return _in_layout((q + k + v) * 0.0, bthd)
    if q.is_cuda:
        # Triton launches on the current CUDA device, not the tensors' one (multi-GPU ComfyUI setups)
        with torch.cuda.device(q.device):
            return _run(backend, q, k, v, cfg, reorder, grid, n_prefix, on_failure, bthd)
    return _run(backend, q, k, v, cfg, reorder, grid, n_prefix, on_failure, bthd)


def _run(backend, q, k, v, cfg, reorder, grid, n_prefix, on_failure, bthd):
    """The call on the backend dispatch picks, through a cached CUDA graph of it where kernels.graphs allows (fast
    backends only; the graph's output keeps its layout through the clone it returns). The graph policy is read
    once: dispatch uses it too (a replayed call pays no per-call host work)."""
    graphed = graphs.graph_reason(q, k, v) is None
    name, reason = select_backend(q, cfg, backend, k=k, v=v, graphed=graphed)
    if reason is not None:
        log_once(f"backend:{backend}:{name}:{reason}", "piecewise_sparse_attention: using the %s backend "
                 "(%s)", name, reason, level=logging.WARNING if backend != "auto" else logging.INFO)
    mod = backend_module(name)
    if name != "torch" and graphed:
        key = graphs.make_key(name, q, k, v, cfg, reorder, grid, n_prefix) + (bthd,)
        # the captured work raises instead of falling back (a fallback would be captured); failures end eager
        return graphs.run(key, lambda a, b, c: _compute(mod, name, a, b, c, cfg, reorder, grid, n_prefix, "raise",
                                                        bthd),
                          lambda: _compute(mod, name, q, k, v, cfg, reorder, grid, n_prefix, on_failure, bthd),
                          q, k, v)
    return _compute(mod, name, q, k, v, cfg, reorder, grid, n_prefix, on_failure, bthd)


def _compute(mod, name, q, k, v, cfg, reorder, grid, n_prefix, on_failure, bthd):
    """The call on one backend; with bthd its output's memory in [B, T, H, D] order: written so by a backend
    with OUT_BTHD (its forward's out_bthd) where it allocates the output itself, copied into it here after
    anything else (the torch reference, autograd, a split batch): the one place that guarantees the layout."""
    return _in_layout(_compute_q(mod, name, q, k, v, cfg, reorder, grid, n_prefix, on_failure, bthd), bthd)


def _compute_q(mod, name, q, k, v, cfg, reorder, grid, n_prefix, on_failure, bthd):
    # a backend with FUSED_REORDER takes the permutation itself (its statistics kernel gathers, one pass
    # scatters back into the caller's layout); the others get reordered copies
    fused = reorder == "morton" and getattr(mod, "FUSED_REORDER", False)
    if reorder == "morton":
        perm, inv = orders_on(grid, q.device)
        if not fused:
            q, k, v = (_permute(mod, name, x, perm, n_prefix) for x in (q, k, v))
    kw = {"out_bthd": True} if (bthd and getattr(mod, "OUT_BTHD", False)) else {}
    try:
        out = mod.forward(q, k, v, cfg, perm=perm, n_prefix=n_prefix, **kw) if fused else mod.forward(q, k, v, cfg,
                                                                                                          **kw)
    except Exception as e:
        # a checkpointed block's recompute stops early by raising inside the op: not a failure
        if name == "torch" or on_failure == "raise" or _is_checkpoint_stop(e):
            raise
        if log_once(f"fail:{name}", "piecewise_sparse_attention: the %s backend failed; this call and later "
                    "failures use the torch reference (traceback below, logged once)", name, level=logging.ERROR):
            log.exception("piecewise_sparse_attention: %s backend traceback", name)
        from . import reference
        from .reorder import apply_reorder
        if fused:
            q, k, v = (apply_reorder(x, perm, n_prefix) for x in (q, k, v))
        out = reference.forward(q, k, v, cfg)
        if fused:
            return apply_reorder(out, inv, n_prefix)
    if reorder == "morton" and not fused:
        out = _permute(mod, name, out, inv, n_prefix)
    return out


def _is_checkpoint_stop(e: BaseException) -> bool:
    """torch.utils.checkpoint stops a recompute once it has every tensor it needs by raising this (private)
    exception from inside whatever op runs then: it must pass through, never trigger a fallback."""
    ckpt = sys.modules.get("torch.utils.checkpoint")  # not imported: no checkpoint is running
    stop = getattr(ckpt, "_StopRecomputationError", None)
    return stop is not None and isinstance(e, stop)


def _permute(mod, name, x, perm, n_prefix):
    """x's tokens after the prefix in `perm` order: the backend's own gather when it has one, else (or when
    that fails at run time, loudly) kernels.reorder."""
    from .reorder import apply_reorder

    gather = getattr(mod, "gather_tokens", None)
    if gather is not None:
        try:
            return gather(x, perm, n_prefix)
        except Exception as e:
            if _is_checkpoint_stop(e):
                raise
            if log_once(f"gather:{name}", "piecewise_sparse_attention: the %s backend's Morton gather failed; "
                        "reordering with torch instead (traceback below, logged once)", name, level=logging.ERROR):
                log.exception("piecewise_sparse_attention: %s gather traceback", name)
    return apply_reorder(x, perm, n_prefix)

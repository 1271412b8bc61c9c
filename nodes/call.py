"""One attention call as the override receives it: arguments read and checked (no ComfyUI import).

ComfyUI calls `override(func, q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False,
skip_output_reshape=False, **kwargs)` with q/k/v `[B, L, H*D]` (or `[B, H, L, D]` with skip_reshape), plain or in
newer ComfyUI's AttentionTensorContainer. `layout_of` describes a call or says why it cannot run sparse (a layout
or keyword the operator does not take); it never raises for a call ComfyUI can make.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.config import as_float, as_grid, as_int

ARG_NAMES = ("q", "k", "v", "heads", "mask", "attn_precision", "skip_reshape", "skip_output_reshape")
# keywords the sparse path honours (scale) or checks (enable_gqa, low_precision_attention); any other keyword
# keeps the call dense, so that no argument is silently ignored. attn_precision asks for float32 softmax
# accumulation, which the operator always does; names starting with "_" are ComfyUI's own markers (wrap_attn's
# `_inside_attn_wrapper`), passed on untouched.
KNOWN_KWARGS = frozenset(ARG_NAMES) | {"transformer_options", "scale", "enable_gqa", "low_precision_attention"}


def unwrap(x):
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


def bind(args, kwargs) -> dict:
    bound = dict(zip(ARG_NAMES, args))
    bound.update(kwargs)
    return bound


def with_plain(args, kwargs, q, k, v):
    """The call's arguments with q/k/v as the plain tensors we took out of any container."""
    args = list(args)
    for i, (name, t) in enumerate((("q", q), ("k", k), ("v", v))):
        if i < len(args):
            args[i] = t
        elif name in kwargs:
            kwargs = {**kwargs, name: t}
    return tuple(args), kwargs


@dataclass(frozen=True)
class Layout:
    q_len: int | None = None
    k_len: int | None = None
    head_dim: int | None = None
    heads: int | None = None
    scale: float | None = None  # ComfyUI's `scale` keyword (None: head_dim ** -0.5)
    reason: str | None = None  # why this call cannot run sparse, None when it can


def layout_of(bound: dict, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Layout:
    unknown = sorted(x for x in set(bound) - KNOWN_KWARGS if not str(x).startswith("_"))
    if unknown:
        return Layout(reason=f"unknown argument(s) {', '.join(unknown)} (not honoured by the sparse path)")
    if bound.get("skip_reshape", False):
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
            return Layout(reason=f"skip_reshape=True with q/k/v of rank {q.dim()}/{k.dim()}/{v.dim()} (expected 4)")
        B, H, L, D = q.shape
        q_len, k_len = L, k.shape[2]
        lay = dict(q_len=q_len, k_len=k_len, head_dim=D, heads=H)
        if k.shape[1] != H or v.shape[1] != H:
            return Layout(**lay, reason=f"grouped-query k/v ({k.shape[1]} key heads for {H} query heads)")
        same = k.shape[0] == B and v.shape[0] == B and k.shape[3] == D and v.shape[3] == D
    else:
        if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
            return Layout(reason=f"q/k/v of rank {q.dim()}/{k.dim()}/{v.dim()} without skip_reshape (expected 3)")
        try:
            heads = as_int("heads", bound.get("heads"), "an integer >= 1")
        except ValueError as e:
            return Layout(reason=str(e))
        B, q_len, C = q.shape
        k_len = k.shape[1]
        if heads < 1 or C % heads:
            return Layout(q_len=q_len, k_len=k_len, reason=f"{C} channels are not divisible by heads={heads}")
        lay = dict(q_len=q_len, k_len=k_len, head_dim=C // heads, heads=heads)
        if k.shape[2] != C or v.shape[2] != C:
            return Layout(**lay, reason=f"k/v have {k.shape[2]}/{v.shape[2]} channels for q's {C} "
                                        f"(grouped-query layout)")
        same = k.shape[0] == B and v.shape[0] == B
    if not same or v.shape[-2] != k_len:
        return Layout(**lay, reason=f"q/k/v shapes {tuple(q.shape)}/{tuple(k.shape)}/{tuple(v.shape)} do not match")
    if bound.get("enable_gqa", False):
        return Layout(**lay, reason="enable_gqa=True (grouped-query attention) is not sparsified")
    if bound.get("low_precision_attention", True) is False:
        return Layout(**lay, reason="the caller asked for full-precision attention (low_precision_attention=False)")
    scale = bound.get("scale")
    if scale is not None:
        try:
            scale = as_float("scale", scale, "a finite number > 0")
        except ValueError as e:
            return Layout(**lay, reason=str(e))
        if not scale > 0.0:
            return Layout(**lay, reason=f"scale={scale} is not > 0")
    return Layout(**lay, scale=scale)


def block_index_of(to: dict):
    """(index or None, reason or None): newer ComfyUI's `block_index`; None (or no key) means "not given"."""
    b = to.get("block_index")
    if b is None:
        return None, None
    try:
        b = as_int("block_index", b, "an integer >= 0")
    except ValueError as e:
        return None, str(e)
    if b < 0:
        return None, f"block_index {b} is negative"
    return b, None


def stg_skipped(to: dict, total_blocks: int) -> tuple[int, ...]:
    """The blocks whose self-attention this forward skips (LTX's spatio-temporal guidance: ComfyUI's LTX models run
    the blocks in `stg_self_attn_blocks` with their self-attention replaced by the values, so the override is not
    called there), ascending; () when none or unreadable."""
    value = to.get("stg_self_attn_blocks")
    if not value:
        return ()
    try:
        return tuple(sorted({int(i) for i in value if 0 <= int(i) < total_blocks}))
    except (TypeError, ValueError):
        return ()


def unskipped(c: int, skipped: tuple[int, ...]) -> int:
    """The index of the c-th block (from 0) that is not in `skipped` (ascending)."""
    for s in skipped:
        if s <= c:
            c += 1
    return c


def grid_of(value) -> tuple[int, ...]:
    """Newer ComfyUI's `grid_sizes` as a tuple: a torch.Size / tuple / list, or a tensor of shape [3] or [B, 3]
    (rows equal). ValueError for anything else."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 2 and value.shape[0] >= 1:
            if not bool((value == value[:1]).all()):
                raise ValueError(f"grid_sizes rows differ: {value.tolist()}")
            value = value[0]
        if value.dim() != 1:
            raise ValueError(f"grid_sizes of shape {tuple(value.shape)}, expected [3] or [B, 3]")
        value = value.tolist()
    elif isinstance(value, (list, tuple)) and value and all(isinstance(x, (list, tuple)) for x in value):
        if any(tuple(x) != tuple(value[0]) for x in value):
            raise ValueError(f"grid_sizes rows differ: {value}")
        value = value[0]
    return as_grid(value)

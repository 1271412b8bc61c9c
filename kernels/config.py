"""Knobs of the operator, frozen so they can key caches and cross process boundaries, and the one place that
checks a caller's scalar arguments (messages name the argument and what to pass).

numpy scalars, 0-d numpy arrays and 0-d tensors are read as the Python number inside (`np.float32(0.25)` is a
density); bools are never numbers here (`band=True` is an error). A wrong type raises `ArgumentTypeError`, a
wrong value `ValueError`; `ArgumentTypeError` is both a TypeError and a ValueError, so `except ValueError`
catches every bad argument.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

VARIANTS = ("pwt", "pisa", "drop")
REORDERS = ("none", "morton")
BACKENDS = ("auto", "torch", "triton", "cute")
ON_FAILURE = ("reference", "raise")
# The reference's per-query-block scratch grows with block_size^2 (gathered logits); the Triton and CuTe
# kernels take 64 only. 1024 keeps one block's scratch at a few MB per head.
MAX_BLOCK_SIZE = 1024


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (e.g. scale="abc"). Also a ValueError: `except ValueError` catches every
    bad argument, as the README promises."""


@dataclass(frozen=True)
class SparseConfig:
    """What `piecewise_sparse_attention` computes (see the docstring there and docs/MATH.md).

    `scale` is resolved (never None) by the time a backend sees the config. Build it from a caller's values
    with `make_config`, which checks them.
    """

    density: float = 0.125
    variant: str = "pwt"
    band: int = 1
    n_sink_blocks: int = 0
    cov_bias: bool = False
    block_size: int = 64
    scale: float | None = None

    def num_blocks(self, T: int) -> int:
        return -(-T // self.block_size)

    def budget(self, n_kv_blocks: int) -> int:
        """k = ceil(density * N), robust to float noise (0.1 * 30 must give 3, not 4)."""
        return max(1, min(n_kv_blocks, math.ceil(round(self.density * n_kv_blocks, 6))))

    @property
    def ln_block(self) -> float:
        return math.log(self.block_size)


def env_switch(name: str, default: bool) -> bool:
    """An on/off environment switch of the kernels (PSA_...): unset or blank -> `default`, "0" -> off, else on."""
    import os
    v = os.environ.get(name, "").strip()
    return default if v == "" else v != "0"


def _show(x) -> str:
    r = repr(x)
    return f"{type(x).__name__} {r[:60] + '...' if len(r) > 63 else r}"


def plain(x):
    """The Python scalar inside a numpy scalar, a 0-d numpy array or a 0-d tensor; anything else unchanged."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    item, shape = getattr(x, "item", None), getattr(x, "shape", None)
    if callable(item) and shape is not None:
        try:
            if tuple(shape) == ():
                return item()
        except TypeError:
            pass
    return x


def as_float(name: str, x, what: str) -> float:
    """A finite real number; `what` says what to pass (e.g. "a number in (0, 1], e.g. 0.125")."""
    v = plain(x)
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ArgumentTypeError(f"{name} must be {what}, got {_show(x)}")
    v = float(v)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be {what}, got {v}")
    return v


def as_int(name: str, x, what: str) -> int:
    """An integer (integer-valued floats such as 16.0 are accepted; 16.9 is not)."""
    v = plain(x)
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ArgumentTypeError(f"{name} must be {what}, got {_show(x)}")
    if not isinstance(v, numbers.Integral):
        f = float(v)
        if not (math.isfinite(f) and f.is_integer()):
            raise ValueError(f"{name} must be {what}, got {v!r} (not an integer)")
        v = f
    return int(v)


def as_bool(name: str, x) -> bool:
    v = plain(x)
    if not isinstance(v, bool):
        raise ArgumentTypeError(f"{name} must be True or False, got {_show(x)}")
    return v


def as_choice(name: str, x, options: tuple[str, ...]) -> str:
    if not isinstance(x, str) or x not in options:
        raise ValueError(f"{name} must be one of {', '.join(repr(o) for o in options)}; got {_show(x)}")
    return x


def as_grid(x) -> tuple[int, ...]:
    """2 or 3 positive integers: (H, W) or (F, H, W). A 1-d tensor or array of them works too."""
    what = "2 or 3 positive integers, (H, W) or (F, H, W), e.g. (21, 30, 52)"
    if isinstance(x, (str, bytes)) or x is None:
        raise ArgumentTypeError(f"grid must be {what}; got {_show(x)}")
    try:
        items = list(x)
    except TypeError:
        raise ArgumentTypeError(f"grid must be {what}; got {_show(x)}") from None
    if len(items) not in (2, 3):
        raise ValueError(f"grid must be {what}; got {len(items)} sizes: {_show(x)}")
    g = tuple(as_int("grid", s, what) for s in items)
    if any(s <= 0 for s in g):
        raise ValueError(f"grid must be {what}; got {g}")
    return g


def make_config(*, density, variant, band, n_sink_blocks, cov_bias, block_size, scale, head_dim: int) -> SparseConfig:
    """Check a caller's knobs and build the config (scale None -> head_dim ** -0.5)."""
    d = as_float("density", density, "a number in (0, 1] (the exact fraction of KV blocks, e.g. 0.125)")
    if not 0.0 < d <= 1.0:
        raise ValueError(f"density must be in (0, 1] (the exact fraction of KV blocks, e.g. 0.125), got {d}")
    variant = as_choice("variant", variant, VARIANTS)
    band = as_int("band", band, "an integer >= 0 (query block i keeps KV blocks |i - j| <= band)")
    if band < 0:
        raise ValueError(f"band must be an integer >= 0 (query block i keeps KV blocks |i - j| <= band), got {band}")
    sinks = as_int("n_sink_blocks", n_sink_blocks, "an integer >= 0 (leading KV blocks always exact)")
    if sinks < 0:
        raise ValueError(f"n_sink_blocks must be an integer >= 0 (leading KV blocks always exact), got {sinks}")
    cov = as_bool("cov_bias", cov_bias)
    bs_what = f"a power of two in [16, {MAX_BLOCK_SIZE}] (e.g. 64; the Triton and CuTe kernels take 64)"
    bs = as_int("block_size", block_size, bs_what)
    if bs < 16 or bs > MAX_BLOCK_SIZE or bs & (bs - 1):
        raise ValueError(f"block_size must be {bs_what}, got {bs}")
    if scale is None:
        s = float(head_dim) ** -0.5
    else:
        s = as_float("scale", scale, "None (head_dim ** -0.5) or a finite number > 0")
        if not s > 0.0:
            raise ValueError(f"scale must be None (head_dim ** -0.5) or a finite number > 0, got {s}")
    return SparseConfig(density=d, variant=variant, band=band, n_sink_blocks=sinks, cov_bias=cov, block_size=bs,
                        scale=s)

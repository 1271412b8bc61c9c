"""Piecewise sparse attention inside sequence-parallel (Ulysses) attention.

DeepSpeed-Ulysses, yunchang and xDiT (xfuser) split the sequence over N ranks; an all-to-all before attention
gives each rank the whole sequence for H/N heads, one after it gives the sequence shards back. Routing, Morton
order and sink blocks are per head over the whole sequence, so the operator runs unchanged on the head shard:
the N ranks together compute exactly what one process computes for all H heads (at density 1: dense attention).
Ring attention (key/value shards passed around, per-chunk (out, lse) merged) is not supported: the operator
returns no log-sum-exp, and its routing needs every key block of a head at once.

The calling conventions supported (none of these packages is imported; only their signatures are matched):

- `head_shard_attention(q, k, v, layout=..., grid=..., n_prefix=..., n_suffix=..., **knobs)`: the operator on
  one rank's head shard, [B, S, h, D] ("bshd": flash-attn, yunchang, xfuser), [S, B, h, D] ("sbhd": DeepSpeed's
  DistributedAttention default) or [B, h, S, D] ("bhsd"). The S tokens are [n_prefix exact tokens (text) |
  prod(grid) latent tokens in raster order | n_suffix exact tokens (pads)]; Morton order is applied to the
  grid and the exact tokens become sink blocks, then the output is put back in the caller's order.
- `flash_attn_style(**layout_and_knobs)`: a callable with flash_attn_func's signature, `fn(q, k, v, dropout_p,
  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)` on bshd, which
  is how yunchang's UlyssesAttention calls its local attention (`ulysses.attn_fn = flash_attn_style(grid=...)`).
- `InnerAttention(**knobs)`: raylight's inner-attention processor protocol, `processor(dense, q, k, v, *,
  transformer_options, **ring_kwargs)`, which raylight calls inside xfuser's xFuserLongContextAttention in place
  of the ring attention function (ring degree 1: `supports_ring = False`). The grid is read from
  transformer_options["grid_sizes"] (Wan); the pad tokens raylight appends to make S divisible by N are exact
  tokens behind the grid.
- `ulysses_attention(q, k, v, group=..., **layout_and_knobs)`: a small Ulysses engine of our own
  (torch.distributed all_to_all_single, NCCL or gloo): sequence shards in, sequence shards out.

Not supported: xfuser's / yunchang's ring functions with a custom `attn_processor` (they merge (out, lse) per
ring step), yunchang's AttnType.SPARSE_SAGE processor slot (it only takes SpargeAttn's class). Inference only
(the all-to-all here is not differentiable).
"""
from __future__ import annotations

import logging
import math

import torch

from .api import piecewise_sparse_attention
from .config import as_grid
from .dispatch import log_once
from .reorder import front_order

log = logging.getLogger("piecewise_sparse_attention")

LAYOUTS = ("bshd", "sbhd", "bhsd")


_TO_BHSD = {"bshd": (0, 2, 1, 3), "sbhd": (1, 2, 0, 3), "bhsd": (0, 1, 2, 3)}  # the permute to [B, H, S, D]


def _to_bhsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x.permute(*_TO_BHSD[layout])


def _from_bhsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    p = _TO_BHSD[layout]
    return x.permute(*(p.index(d) for d in range(4)))


def head_shard_attention(q, k, v, *, layout: str = "bshd", grid=None, n_prefix: int = 0, n_suffix: int = 0,
                         density=0.125, variant="pwt", band=1, n_sink_blocks=None, cov_bias=False, block_size=64,
                         scale=None, reorder="morton", backend="auto", on_failure="reference"):
    """kernels.piecewise_sparse_attention on one Ulysses rank's head shard (the whole sequence, H/N heads).

    Args:
        q, k, v: the head shard in `layout` ("bshd" [B, S, h, D], "sbhd" [S, B, h, D] or "bhsd" [B, h, S, D]).
        grid: (F, H, W) or (H, W) of the latent tokens, or None (no Morton order; `n_sink_blocks` as given).
        n_prefix, n_suffix: exact tokens before / after the prod(grid) latent tokens (text; pads).
        n_sink_blocks: None = every block holding an exact token (the prefix and suffix are moved in front).
        reorder: "morton" (default when a grid is given) or "none" (raster order, exact tokens still in front).
        The other knobs are the operator's (README "Python API").

    Returns:
        Tensor in q's layout, shape and dtype.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        raise ValueError(f"q, k, v must be 4-d tensors in layout {layout!r}")
    qh, kh, vh = (_to_bhsd(t, layout) for t in (q, k, v))
    T = qh.shape[2]
    n_prefix, n_suffix = int(n_prefix), int(n_suffix)
    if grid is None:
        if n_suffix:
            raise ValueError("n_suffix needs grid (the exact tokens behind the latent grid)")
        sinks = 0 if n_sink_blocks is None else n_sink_blocks
        out = piecewise_sparse_attention(qh, kh, vh, density=density, variant=variant, band=band,
                                         n_sink_blocks=sinks, cov_bias=cov_bias, block_size=block_size,
                                         scale=scale, backend=backend, on_failure=on_failure)
        return _from_bhsd(out, layout)
    g = as_grid(grid)
    if n_prefix < 0 or n_suffix < 0 or n_prefix + math.prod(g) + n_suffix != T:
        raise ValueError(f"the sequence of {T} tokens must be n_prefix + prod(grid) + n_suffix = {n_prefix} + "
                         f"{math.prod(g)} + {n_suffix} (grid {g})")
    if reorder not in ("morton", "none"):
        raise ValueError(f"reorder must be 'morton' or 'none', got {reorder!r}")
    n_front = n_prefix + n_suffix
    sinks = -(-n_front // int(block_size)) if n_sink_blocks is None else n_sink_blocks
    common = dict(density=density, variant=variant, band=band, n_sink_blocks=sinks, cov_bias=cov_bias,
                  block_size=block_size, scale=scale, backend=backend, on_failure=on_failure)
    if n_suffix == 0:
        out = piecewise_sparse_attention(qh, kh, vh, reorder=reorder, grid=g if reorder == "morton" else None,
                                         n_prefix=n_prefix, **common)
        return _from_bhsd(out, layout)
    # exact tokens behind the grid: one permutation puts them in front (Morton composed in), undone on the output
    perm, inv = front_order(n_prefix, g, n_suffix, reorder == "morton", qh.device)
    qh, kh, vh = (t.index_select(2, perm) for t in (qh, kh, vh))
    out = piecewise_sparse_attention(qh, kh, vh, **common).index_select(2, inv)
    return _from_bhsd(out, layout)


def _sdpa(q, k, v, layout, *, scale=None, causal=False, dropout_p=0.0):
    qh, kh, vh = (_to_bhsd(t, layout) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, dropout_p=dropout_p, is_causal=causal,
                                                           scale=scale)
    return _from_bhsd(out, layout)


class _FlashAttnStyle:
    def __init__(self, dense_fn, layout, knobs):
        self.dense_fn, self.layout, self.knobs = dense_fn, layout, knobs

    def __repr__(self):
        return f"flash_attn_style(layout={self.layout!r}, {self.knobs})"

    def __call__(self, q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                 alibi_slopes=None, deterministic=False, return_attn_probs=False, *args, **kwargs):
        why = None
        if args or kwargs:
            why = f"arguments this adapter does not know ({len(args)} positional, {sorted(kwargs)})"
        elif q.shape != k.shape or k.shape != v.shape:
            why = "q, k, v shapes differ (not self-attention)"
        elif dropout_p or causal:
            why = "dropout or causal attention"
        elif tuple(window_size) != (-1, -1) or softcap or alibi_slopes is not None or return_attn_probs:
            why = "a sliding window, softcap, ALiBi or the attention probabilities were asked for"
        if why is None:
            return head_shard_attention(q, k, v, layout=self.layout, scale=softmax_scale, **self.knobs)
        log_once(f"ulysses-dense:{why}", "piecewise_sparse_attention (Ulysses): dense attention for this call: %s",
                 why, level=logging.WARNING)
        if self.dense_fn is not None:
            if args:  # every named argument came positionally, and more after them
                return self.dense_fn(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                     deterministic, return_attn_probs, *args, **kwargs)
            return self.dense_fn(q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                                 window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                                 deterministic=deterministic, return_attn_probs=return_attn_probs, **kwargs)
        if args or kwargs or tuple(window_size) != (-1, -1) or softcap or alibi_slopes is not None \
                or return_attn_probs:
            raise ValueError(f"piecewise_sparse_attention (Ulysses): {why}, and no dense_fn was given to run "
                             "such calls (pass dense_fn=flash_attn_func)")
        return _sdpa(q, k, v, self.layout, scale=softmax_scale, causal=causal, dropout_p=dropout_p)


def flash_attn_style(*, dense_fn=None, layout: str = "bshd", **knobs):
    """A local-attention callable with flash_attn_func's signature that runs `head_shard_attention`.

    For yunchang's UlyssesAttention: `ulysses.attn_fn = flash_attn_style(grid=(F, H, W), dense_fn=flash_attn_func)`.
    `knobs` are head_shard_attention's (grid, n_prefix, n_suffix, density, variant, ...). Calls it cannot take
    (dropout, causal, window, softcap, ALiBi, return_attn_probs, q/k of other lengths, unknown arguments) go to
    `dense_fn` with the same arguments (one log line per reason); without `dense_fn`, to PyTorch SDPA where SDPA
    computes the same (dropout, causal, other lengths), else a ValueError."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if "grid" in knobs and knobs["grid"] is not None:
        knobs["grid"] = as_grid(knobs["grid"])
    return _FlashAttnStyle(dense_fn, layout, knobs)


class InnerAttention:
    """raylight's inner-attention processor: `processor(dense, q, k, v, *, transformer_options, **kwargs)`.

    q, k, v: [B, S, h, D] after xfuser's all-to-all; `dense(q, k, v, **kwargs)` is the ring attention it
    replaces. Sparse when the call is a plain self-attention over transformer_options["grid_sizes"] (plus fewer
    than `block_size` pad tokens behind it), S >= min_tokens and the block is not in dense_blocks
    (transformer_options["block_index"], negative = from the end of "total_blocks"); else `dense` (one log line
    per reason). Dense steps are the caller's: apply the processor only on the steps that should be sparse."""

    supports_ring = False

    def __init__(self, *, density=0.125, variant="pwt", band=1, cov_bias=False, block_size=64, reorder="morton",
                 backend="auto", min_tokens=0, dense_blocks=()):
        self.knobs = dict(density=density, variant=variant, band=band, cov_bias=cov_bias, block_size=block_size,
                          reorder=reorder, backend=backend)
        self.min_tokens = int(min_tokens)
        self.dense_blocks = tuple(int(b) for b in dense_blocks)

    def _reason(self, q, k, v, to: dict, kwargs: dict):
        if any(kwargs.get(n) is not None for n in ("joint_tensor_key", "joint_tensor_value", "attn_layer")):
            return None, "joint text tensors or a KV cache (xfuser joint attention / PipeFusion)"
        if kwargs.get("dropout_p") or kwargs.get("causal") or kwargs.get("alibi_slopes") is not None \
                or tuple(kwargs.get("window_size", (-1, -1))) != (-1, -1) or kwargs.get("return_attn_probs"):
            return None, "dropout, causal, ALiBi, a window or the attention probabilities were asked for"
        if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
            return None, "not a self-attention call of one [B, S, h, D] shape"
        grid = to.get("grid_sizes")
        if grid is None:
            return None, "no grid_sizes in transformer_options"
        try:
            grid = as_grid(tuple(int(g) for g in grid))
        except (TypeError, ValueError) as e:
            return None, f"grid_sizes unreadable ({e})"
        extra = q.shape[1] - math.prod(grid)
        if not 0 <= extra < self.knobs["block_size"]:
            return None, f"{q.shape[1]} tokens are not the grid's {math.prod(grid)} plus a few pads"
        if q.shape[1] < self.min_tokens:
            return None, f"{q.shape[1]} tokens < min_tokens {self.min_tokens}"
        b, total = to.get("block_index"), to.get("total_blocks")
        if b is not None and self.dense_blocks:
            dense = {d + int(total) if d < 0 and total is not None else d for d in self.dense_blocks}
            if int(b) in dense:
                return None, "dense block"
        return (grid, extra), None

    def __call__(self, dense, q, k, v, *, transformer_options=None, **kwargs):
        to = transformer_options if isinstance(transformer_options, dict) else {}
        layout, why = self._reason(q, k, v, to, kwargs)
        if why is None:
            grid, pads = layout
            try:
                return head_shard_attention(q, k, v, layout="bshd", grid=grid, n_suffix=pads,
                                            scale=kwargs.get("softmax_scale"), on_failure="raise", **self.knobs)
            except Exception as e:  # never a broken sampling run: dense, with the reason
                why = f"the operator failed ({type(e).__name__}: {e})"
        if why != "dense block":
            log_once(f"inner-dense:{why}", "piecewise_sparse_attention (raylight inner attention): dense because %s",
                     why, level=logging.INFO)
        return dense(q, k, v, **kwargs)


# ---------------------------------------------------------------------------------------------------
# a minimal Ulysses engine (torch.distributed), for programs without yunchang / xfuser, the tests and bench

def _world(group):
    import torch.distributed as dist
    return dist.get_world_size(group)


def seq_to_heads(x: torch.Tensor, group=None) -> torch.Tensor:
    """[B, S/N, H, D] sequence shard (all heads) -> [B, S, H/N, D] head shard (whole sequence), rank r taking
    heads [r H/N, (r+1) H/N) and the ranks' shards in rank order."""
    import torch.distributed as dist
    n = _world(group)
    B, s, H, D = x.shape
    if H % n:
        raise ValueError(f"{H} heads do not split over {n} ranks")
    send = x.reshape(B, s, n, H // n, D).permute(2, 0, 1, 3, 4).contiguous()  # [N, B, s, h, D]
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # recv[r] = rank r's shard of my heads
    return recv.permute(1, 0, 2, 3, 4).reshape(B, n * s, H // n, D)


def heads_to_seq(x: torch.Tensor, group=None) -> torch.Tensor:
    """The inverse of seq_to_heads: [B, S, H/N, D] -> [B, S/N, H, D]."""
    import torch.distributed as dist
    n = _world(group)
    B, S, h, D = x.shape
    if S % n:
        raise ValueError(f"{S} tokens do not split over {n} ranks")
    send = x.reshape(B, n, S // n, h, D).permute(1, 0, 2, 3, 4).contiguous()  # [N, B, s, h, D]
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # recv[r] = my shard of rank r's heads
    return recv.permute(1, 2, 0, 3, 4).reshape(B, S // n, n * h, D)


def ulysses_attention(q, k, v, *, group=None, attention=None, **knobs):
    """Ulysses sequence parallelism: q, k, v are this rank's [B, S/N, H, D] sequence shard; the result is the
    same shard of the attention output. `attention(q, k, v)` on the [B, S, H/N, D] head shard defaults to
    head_shard_attention(**knobs) (grid, n_prefix, n_suffix refer to the whole sequence)."""
    fn = attention or (lambda a, b, c: head_shard_attention(a, b, c, layout="bshd", **knobs))
    qh, kh, vh = (seq_to_heads(t, group) for t in (q, k, v))
    return heads_to_seq(fn(qh, kh, vh), group)

"""The differentiable Triton operator: forward with saved row statistics, backward (bwd.py), autograd wiring.

Layers: `kernels.triton.prepare` (statistics + routing, detached) and `fwd.attention(..., lse=)` ->
`forward_saving` (head chunks) -> torch.library custom ops ``psa::triton_train_fwd`` (output + what the
backward needs) and ``psa::triton_train_bwd`` (dq, dk, dv), both with fake implementations, joined by
`register_autograd` so torch.compile sees one differentiable op -> `forward(q, k, v, cfg)`.

What the forward keeps for the backward besides q, k, v and the output: log2 of each row's softmax
denominator (float32 [B, H, T]), the bias rows (input-precision [B, H, N, N]: -inf = exact block, else the
gated w or 0; the exact sets are rebuilt from them), and the block statistics the attention multiplied with
(k-bar, V-hat / n_j, H-bar in the input dtype; q^2 and sigma^2 in float32 for pwt): O(N x D) each, against
q's O(T x D). Routing is detached; every other statistic is differentiated (bwd.py has the formulas).

Also here: the Morton gather/scatter as one differentiable custom op (``psa::permute_tokens``; the
gradient of a gather is the scatter of the gradient).
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ..config import SparseConfig
from ..dispatch import on_device
from . import bwd as _bwd
from . import fwd as _fwd
from . import reorder as _reorder

def _contig(x):
    return x if x is None or x.is_contiguous() else x.contiguous()


def _heads_per_chunk(B, H, T, D, cfg, elem_bytes) -> int:
    """Heads per chunk so that the backward's per-chunk scratch (pwt: the float32 [N, N] dw rows) and the
    routing scratch stay under the forward's budget (kernels.triton._heads_per_chunk)."""
    from . import _heads_per_chunk as fwd_heads, _scratch_fraction

    n = -(-T // cfg.block_size)
    k_est = min(n, cfg.budget(n) + 2 * cfg.band + 1 + cfg.n_sink_blocks)
    hc = fwd_heads(B, H, T, D, cfg, elem_bytes, k_est, _scratch_fraction())
    if cfg.variant == "pwt":
        budget = max(_scratch_fraction() * B * H * T * D * elem_bytes, 64 * 2**20)
        hc = min(hc, max(1, int(budget // max(1, B * n * n * 4))))
    return hc


def forward_saving(q, k, v, cfg: SparseConfig, *, routing=None):
    """(out, lse, vbias, stats) of the Triton forward on [B, H, T, D] (unit last stride), keeping what the
    backward needs. With `routing` (a kernels.routing.Routing) the exact sets and w are taken from it."""
    with on_device(q):  # the launches go to the current CUDA device: make it q's
        return _forward_saving(q, k, v, cfg, routing=routing)


def _forward_saving(q, k, v, cfg: SparseConfig, *, routing=None):
    from . import _contig_last, prepare
    from .stats import vbias_from_routing

    q, k, v = _contig_last(q), _contig_last(k), _contig_last(v)
    B, H, T, D = q.shape
    approx = cfg.variant in ("pisa", "pwt")
    pwt = cfg.variant == "pwt"
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, H, T, device=q.device, dtype=torch.float32)
    hc = _heads_per_chunk(B, H, T, D, cfg, q.element_size())
    parts = []
    for h0 in range(0, H, hc):
        h1 = min(H, h0 + hc)
        qc, kc, vc = q[:, h0:h1], k[:, h0:h1], v[:, h0:h1]
        st, idx, vbias = prepare(qc, kc, vc, cfg)
        if routing is not None:
            sub = type(routing)(idx=routing.idx[:, h0:h1], exact=routing.exact[:, h0:h1], w=routing.w[:, h0:h1])
            idx = sub.idx.to(device=q.device, dtype=torch.int32).contiguous()
            vbias = vbias_from_routing(sub, q.dtype)
        vbias = vbias.contiguous()
        # the kernel writes the output through its strides; the row statistics need a contiguous chunk
        lse_c = lse[:, h0:h1]
        lse_c = lse_c if lse_c.is_contiguous() else torch.empty(B, h1 - h0, T, device=q.device, dtype=torch.float32)
        _fwd.attention(qc, kc, vc, out[:, h0:h1], st, idx, vbias, cfg, lse=lse_c)
        if lse_c.data_ptr() != lse[:, h0:h1].data_ptr():
            lse[:, h0:h1] = lse_c
        parts.append((vbias, st))
    # one chunk: its tensors as they are, but those that share their storage (the one-pass statistics are views of
    # one buffer) copied, since a custom op's outputs may not alias one another
    own = (lambda x: x if x.untyped_storage().nbytes() == x.numel() * x.element_size() else x.clone())
    cat = (lambda xs: own(xs[0]) if len(xs) == 1 else torch.cat(xs, 1))
    vbias = cat([p[0] for p in parts])
    def gather(name, used):
        # a variant's unused statistics are distinct empty tensors (custom-op outputs may not alias)
        if not used:
            return torch.empty(0, device=q.device, dtype=torch.float32)
        return cat([_contig(getattr(p[1], name)) for p in parts])

    if approx:  # H-bar = hbar_lp * hbar_scale (a per-head power of two for float16's range; 1 otherwise)
        for p in parts:
            if getattr(p[1], "hbar_scale", None) is None:
                p[1].hbar_scale = torch.ones(p[1].hbar_lp.shape[:2], device=q.device, dtype=torch.float32)
    stats = SimpleNamespace(kbar_lp=gather("kbar_lp", approx), vmean_lp=gather("vmean_lp", approx),
                            hbar_lp=gather("hbar_lp", approx), hbar_scale=gather("hbar_scale", approx),
                            q2=gather("q2", pwt), ksig2=gather("ksig2", pwt))
    return out, lse, vbias, stats


def backward(do, q, k, v, out, lse, vbias, stats, cfg: SparseConfig, prof=None):
    """(dq, dk, dv) in the input dtype, head chunk by head chunk (bwd.attention_backward; `prof` collects
    its per-stage CUDA events)."""
    with on_device(q):
        return _backward_heads(do, q, k, v, out, lse, vbias, stats, cfg, prof)


def _backward_heads(do, q, k, v, out, lse, vbias, stats, cfg: SparseConfig, prof=None):
    from . import _contig_last

    q, k, v, out, do = (_contig_last(x) for x in (q, k, v, out, do))
    B, H, T, D = q.shape
    dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    dk = torch.empty(k.shape, device=q.device, dtype=q.dtype)
    dv = torch.empty(v.shape, device=q.device, dtype=q.dtype)
    approx = cfg.variant in ("pisa", "pwt")
    pwt = cfg.variant == "pwt"
    hc = _heads_per_chunk(B, H, T, D, cfg, q.element_size())
    for h0 in range(0, H, hc):
        h1 = min(H, h0 + hc)
        sl = (slice(None), slice(h0, h1))
        st = SimpleNamespace(
            kbar_lp=_contig(stats.kbar_lp[sl]) if approx else None,
            vmean_lp=_contig(stats.vmean_lp[sl]) if approx else None,
            hbar_lp=_contig(stats.hbar_lp[sl]) if approx else None,
            hbar_scale=_contig(stats.hbar_scale[sl]) if approx else None,
            q2=_contig(stats.q2[sl]) if pwt else None, ksig2=_contig(stats.ksig2[sl]) if pwt else None)
        _bwd.attention_backward(do[sl], q[sl], k[sl], v[sl], out[sl], _contig(lse[sl]), _contig(vbias[sl]), st,
                                cfg, dq[sl], dk[sl], dv[sl], prof=prof)
    return dq, dk, dv


def _cfg(density, variant, band, n_sink_blocks, cov_bias, block_size, scale) -> SparseConfig:
    return SparseConfig(density=density, variant=variant, band=band, n_sink_blocks=n_sink_blocks,
                        cov_bias=cov_bias, block_size=block_size, scale=scale)


@torch.library.custom_op("psa::triton_train_fwd", mutates_args=())
def _train_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, density: float, variant: str, band: int,
                  n_sink_blocks: int, cov_bias: bool, block_size: int, scale: float
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                             torch.Tensor, torch.Tensor, torch.Tensor]:
    cfg = _cfg(density, variant, band, n_sink_blocks, cov_bias, block_size, scale)
    out, lse, vbias, st = forward_saving(q, k, v, cfg)
    return out, lse, vbias, st.kbar_lp, st.vmean_lp, st.hbar_lp, st.hbar_scale, st.q2, st.ksig2


@_train_fwd_op.register_fake
def _(q, k, v, density, variant, band, n_sink_blocks, cov_bias, block_size, scale):
    B, H, T, D = q.shape
    n = (T + block_size - 1) // block_size
    approx = variant in ("pisa", "pwt")
    bias_dt = torch.float16 if q.dtype in (torch.float16, torch.bfloat16) else torch.float32
    lp = (lambda *shape: q.new_empty(shape)) if approx else (lambda *shape: q.new_empty((0,), dtype=torch.float32))
    f32 = (lambda *shape: q.new_empty(shape if variant == "pwt" else (0,), dtype=torch.float32))
    hs = q.new_empty((B, H) if approx else (0,), dtype=torch.float32)
    return (q.new_empty(q.shape), q.new_empty((B, H, T), dtype=torch.float32), q.new_empty((B, H, n, n), dtype=bias_dt),
            lp(B, H, n, D), lp(B, H, n, D), lp(B, H, D, D), hs, f32(B, H, n, D), f32(B, H, n, D))


@torch.library.custom_op("psa::triton_train_bwd", mutates_args=())
def _train_bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, vbias: torch.Tensor, kbar_lp: torch.Tensor, vmean_lp: torch.Tensor,
                  hbar_lp: torch.Tensor, hbar_scale: torch.Tensor, q2: torch.Tensor, ksig2: torch.Tensor, variant: str,
                  block_size: int, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    cfg = _cfg(1.0, variant, 0, 0, False, block_size, scale)  # density/band only route: unused here
    st = SimpleNamespace(kbar_lp=kbar_lp, vmean_lp=vmean_lp, hbar_lp=hbar_lp, hbar_scale=hbar_scale, q2=q2,
                         ksig2=ksig2)
    return backward(do, q, k, v, out, lse, vbias, st, cfg)


@_train_bwd_op.register_fake
def _(do, q, k, v, out, lse, vbias, kbar_lp, vmean_lp, hbar_lp, hbar_scale, q2, ksig2, variant, block_size, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, density, variant, band, n_sink_blocks, cov_bias, block_size, scale = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.meta = (variant, block_size, scale)


def _backward(ctx, dout, *unused):
    variant, block_size, scale = ctx.meta
    dq, dk, dv = _train_bwd_op(dout, *ctx.saved_tensors, variant, block_size, scale)
    return dq, dk, dv, None, None, None, None, None, None, None


_train_fwd_op.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("psa::permute_tokens", mutates_args=())
def _permute_op(x: torch.Tensor, perm: torch.Tensor, n_prefix: int, scatter: bool) -> torch.Tensor:
    return _reorder._permute(x, perm, n_prefix, scatter)


@_permute_op.register_fake
def _(x, perm, n_prefix, scatter):
    return x.new_empty(x.shape)


def _permute_setup(ctx, inputs, output):
    _, perm, n_prefix, scatter = inputs
    ctx.save_for_backward(perm)
    ctx.meta = (n_prefix, scatter)


def _permute_backward(ctx, g):
    (perm,) = ctx.saved_tensors
    n_prefix, scatter = ctx.meta
    return _permute_op(g, perm, n_prefix, not scatter), None, None, None


_permute_op.register_autograd(_permute_backward, setup_context=_permute_setup)


def gather_tokens(x: torch.Tensor, perm: torch.Tensor, n_prefix: int = 0) -> torch.Tensor:
    """kernels.triton.reorder.gather_tokens, differentiable (its gradient is the scatter)."""
    return _permute_op(x, perm.to(device=x.device), int(n_prefix), False)


def scatter_tokens(x: torch.Tensor, perm: torch.Tensor, n_prefix: int = 0) -> torch.Tensor:
    """kernels.triton.reorder.scatter_tokens, differentiable (its gradient is the gather)."""
    return _permute_op(x, perm.to(device=x.device), int(n_prefix), True)


def forward(q, k, v, cfg: SparseConfig, *, perm: torch.Tensor | None = None, n_prefix: int = 0):
    """Differentiable piecewise sparse attention on [B, H, T, D] (routing detached). With `perm` the tokens
    after `n_prefix` are gathered in that order first and the output scattered back (both differentiable)."""
    if perm is not None:
        q, k, v = (gather_tokens(x, perm, n_prefix) for x in (q, k, v))
    out = _train_fwd_op(q, k, v, float(cfg.density), cfg.variant, int(cfg.band), int(cfg.n_sink_blocks),
                        bool(cfg.cov_bias), int(cfg.block_size), float(cfg.scale))[0]
    if perm is not None:
        out = scatter_tokens(out, perm, n_prefix)
    return out


def needs_grad(*xs) -> bool:
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in xs)

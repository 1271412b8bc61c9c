"""The readable PyTorch reference of the operator (../shared/MATH.md), same contract as every fast backend.

Runs on any device and dtype; computes in float32 (float64 stays float64, which makes it the oracle).
Memory stays bounded at real sizes: no T x T score matrix; the exact part gathers the routed KV blocks
for a chunk of query blocks at a time.

Non-finite inputs (MATH.md "Non-finite inputs"; every backend implements the same rules, tests/test_nonfinite.py
is the contract): a row of the output is NaN/inf only where dense attention's row is.
- H-bar = (1/N) sum_j H_j over the blocks j whose H_j (computed per block in the compute dtype) is finite;
  a block with an inf/NaN key or value adds nothing to it (with all H_j finite this is MATH.md's H-bar).
- A virtual token whose logit is -inf (an inf key element against a query of the opposite sign, as in dense
  attention) gets weight exp(-inf) = 0; a non-finite PWT bonus w_ij is gated to 0 (kernels.routing.pwt_bonus);
  routing scores are made finite before the top-k (NaN -> -1e30, +-inf -> +-1e30).
- A row's virtual logit s q_t.kbar_j is +inf or NaN only when some key of block j has a +inf or NaN logit
  for q_t, i.e. only where dense attention's row t is NaN too.
- A finite result beyond the output dtype's range (float16: the first-order term s (q H-bar) can leave it
  with huge inputs) saturates at +-max instead of becoming inf (`saturate`).
"""
from __future__ import annotations

import torch

from .config import SparseConfig
from .routing import BlockStats, Routing, block_stats, compute_dtype, route, to_blocks

NAME = "torch"
# bytes of float scratch one chunk of query blocks may use (gathered K/V + logits)
_CHUNK_BYTES = 256 * 2**20


def available() -> bool:
    return True


def unavailable_reason(q, cfg) -> str | None:
    return None


def prepare(q, k, v, cfg: SparseConfig) -> tuple[BlockStats, Routing]:
    stats = block_stats(q, k, v, cfg.block_size, need_hnorm=cfg.cov_bias)
    return stats, route(stats, cfg)


def forward(q, k, v, cfg: SparseConfig, *, routing: Routing | None = None,
            stats: BlockStats | None = None) -> torch.Tensor:
    """o = num / den with exact blocks S_i and Taylor virtual tokens for U_i, one shared softmax."""
    B, H, T, D = q.shape
    bs = cfg.block_size
    cd = compute_dtype(q)
    s = float(cfg.scale)
    if stats is None:
        stats = block_stats(q, k, v, bs, need_hnorm=cfg.cov_bias and routing is None)
    if routing is None:
        routing = route(stats, cfg)
    n = stats.kbar.shape[-2]
    kb = to_blocks(k, bs, cd)  # [B, H, N, Bs, D]
    vb = to_blocks(v, bs, cd)
    qb = to_blocks(q, bs, cd)  # [B, H, Nq, Bs, D]
    nq = qb.shape[2]
    kvalid = torch.arange(bs, device=q.device)[None, :] < stats.counts[:, None]  # [N, Bs]
    approx = cfg.variant in ("pisa", "pwt")
    if approx:
        qh = (q.to(cd) @ stats.hbar) * s  # [B, H, T, D]  first-order direction s * q H-bar
        qh = to_blocks(qh, bs)
    K = routing.idx.shape[-1]
    per_qblock = B * H * K * bs * (2 * D + 2 * bs) * torch.finfo(cd).bits // 8
    chunk = max(1, min(nq, _CHUNK_BYTES // max(1, per_qblock)))
    out = torch.empty(B, H, nq, bs, D, device=q.device, dtype=cd)
    bidx = torch.arange(B, device=q.device)[:, None, None, None]
    hidx = torch.arange(H, device=q.device)[None, :, None, None]
    for c0 in range(0, nq, chunk):
        c1 = min(nq, c0 + chunk)
        qc = qb[:, :, c0:c1]  # [B, H, C, Bs, D]
        idx = routing.idx[:, :, c0:c1].long()  # [B, H, C, K]
        real = idx >= 0
        gi = idx.clamp(min=0)
        kg = kb[bidx, hidx, gi]  # [B, H, C, K, Bs, D]
        vg = vb[bidx, hidx, gi]
        C = c1 - c0
        kg = kg.reshape(B, H, C, K * bs, D)
        vg = vg.reshape(B, H, C, K * bs, D)
        tok_ok = (kvalid[gi] & real[..., None]).reshape(B, H, C, 1, K * bs)
        le = (qc @ kg.transpose(-1, -2)) * s  # [B, H, C, Bs, K*Bs]
        le = le.masked_fill(~tok_ok, float("-inf"))
        m = le.amax(-1, keepdim=True)
        if approx:
            lv = (qc @ stats.kbar[:, :, None].transpose(-1, -2)) * s  # [B, H, C, Bs, N]
            lv = lv + routing.w[:, :, c0:c1, None, :].to(cd)
            lv = lv.masked_fill(routing.exact[:, :, c0:c1, None, :], float("-inf"))
            m = torch.maximum(m, lv.amax(-1, keepdim=True))
        # rows whose every logit is -inf cannot occur (K >= 1 real block), but keep exp() finite anyway
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        pe = torch.exp(le - m)
        num = pe @ vg
        den = pe.sum(-1, keepdim=True)
        if approx:
            pv = torch.exp(lv - m)  # [B, H, C, Bs, N]
            num = num + pv @ stats.vsum[:, :, None] + qh[:, :, c0:c1] * pv.sum(-1, keepdim=True)
            den = den + pv @ stats.counts[:, None]
        out[:, :, c0:c1] = num / den
    return saturate(out.reshape(B, H, nq * bs, D)[:, :, :T], q.dtype)


def saturate(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x cast to `dtype`, a finite value beyond its range held at +-max instead of becoming inf."""
    if x.dtype == dtype or torch.finfo(dtype).max >= torch.finfo(x.dtype).max:
        return x.to(dtype)
    lim = torch.finfo(dtype).max
    return torch.where(torch.isfinite(x), x.clamp(-lim, lim), x).to(dtype)

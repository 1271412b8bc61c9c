"""Block statistics and routing shared by every backend (pure PyTorch, any device).

Everything here follows docs/MATH.md; names: N = number of KV blocks, Nq = number of query blocks,
Bs = block size. Statistics are float32 (float64 when the inputs are float64) and use real token counts:
the zero padding of a short last block never counts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .config import SparseConfig


@dataclass
class BlockStats:
    kbar: torch.Tensor  # [B, H, N, D]   mean of the keys of each block
    vsum: torch.Tensor  # [B, H, N, D]   SUM of the values of each block (V-hat)
    ksig2: torch.Tensor  # [B, H, N, D]  per-dimension key variance (population)
    counts: torch.Tensor  # [N]          real tokens per block
    qbar: torch.Tensor  # [B, H, Nq, D]  mean of the queries of each block
    q2: torch.Tensor  # [B, H, Nq, D]    mean of the squared queries of each block
    hbar: torch.Tensor  # [B, H, D, D]   H-bar = mean over blocks of H_j
    hnorm: torch.Tensor | None  # [B, H, N]  ||H_j - H-bar||_F (cov_bias only)


@dataclass
class Routing:
    idx: torch.Tensor  # [B, H, Nq, K] int32, exact KV blocks ascending, -1 padded at the end
    exact: torch.Tensor  # [B, H, Nq, N] bool
    w: torch.Tensor  # [B, H, Nq, N] float, gated PWT bonus for the virtual-token logits (0 for pisa/drop)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def block_counts(T: int, block_size: int, device, dtype) -> torch.Tensor:
    n = -(-T // block_size)
    counts = torch.full((n,), float(block_size), device=device, dtype=dtype)
    counts[-1] = T - (n - 1) * block_size
    return counts


def to_blocks(x: torch.Tensor, block_size: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """[B, H, T, D] -> [B, H, N, Bs, D], zero-padded at the end."""
    B, H, T, D = x.shape
    n = -(-T // block_size)
    if dtype is not None:
        x = x.to(dtype)
    if n * block_size != T:
        x = torch.nn.functional.pad(x, (0, 0, 0, n * block_size - T))
    return x.view(B, H, n, block_size, D)


def _mean_and_sq(x: torch.Tensor, block_size: int, cd: torch.dtype):
    T = x.shape[-2]
    xb = to_blocks(x, block_size, cd)  # [B, H, N, Bs, D]
    counts = block_counts(T, block_size, x.device, cd)
    mean = xb.sum(-2) / counts[:, None]
    sq = (xb * xb).sum(-2) / counts[:, None]
    return xb, counts, mean, sq


def block_stats(q, k, v, block_size: int = 64, *, need_hnorm: bool = False) -> BlockStats:
    cd = compute_dtype(q)
    T = k.shape[-2]
    kb, counts, kbar, _ = _mean_and_sq(k, block_size, cd)
    valid = (torch.arange(kb.shape[-2], device=k.device)[None, :]
             < counts[:, None]).to(cd)  # [N, Bs]
    kc = (kb - kbar[..., None, :]) * valid[..., None]  # centred keys, padding zeroed
    ksig2 = (kc * kc).sum(-2) / counts[:, None]
    vb = to_blocks(v, block_size, cd)
    vsum = vb.sum(-2)
    _, _, qbar, q2 = _mean_and_sq(q, block_size, cd)
    n = counts.numel()
    # sum_j H_j = K^T V - sum_j kbar_j (x) vsum_j  (exact; no per-block DxD buffer)
    kf = k.to(cd)
    vf = v.to(cd)
    ktv = kf.transpose(-1, -2) @ vf
    hsum = ktv - kbar.transpose(-1, -2) @ vsum
    if not bool(torch.isfinite(hsum).all()):
        # a non-finite key or value (or an overflow) makes some H_j non-finite: H-bar sums the finite H_j only
        hsum = _finite_h_sum(kc, vb)
    hbar = hsum / n
    hnorm = None
    if need_hnorm:
        hnorm = torch.empty(kbar.shape[:-1], device=k.device, dtype=cd)
        chunk = max(1, 2048 // max(1, kbar.shape[-1]))
        for s in range(0, n, chunk):
            hj = kc[:, :, s:s + chunk].transpose(-1, -2) @ vb[:, :, s:s + chunk]  # [B, H, c, D, D]
            hnorm[:, :, s:s + chunk] = torch.linalg.matrix_norm(hj - hbar[:, :, None], ord="fro")
    del T
    return BlockStats(kbar, vsum, ksig2, counts, qbar, q2, hbar, hnorm)


def _finite_h_sum(kc: torch.Tensor, vb: torch.Tensor) -> torch.Tensor:
    """sum over the blocks j whose H_j = kc_j^T v_j is finite, in chunks of blocks (no [N, D, D] buffer)."""
    B, H, n, _, D = kc.shape
    out = torch.zeros(B, H, D, D, device=kc.device, dtype=kc.dtype)
    chunk = max(1, 2048 // max(1, D))
    for s in range(0, n, chunk):
        hj = kc[:, :, s:s + chunk].transpose(-1, -2) @ vb[:, :, s:s + chunk]  # [B, H, c, D, D]
        ok = torch.isfinite(hj).all(-1).all(-1)  # [B, H, c]
        out += torch.where(ok[..., None, None], hj, torch.zeros((), device=hj.device, dtype=hj.dtype)).sum(2)
    return out


def pwt_bonus(stats: BlockStats, scale: float, block_size: int):
    """w_ij = 1/2 s^2 sum_d q2_i[d] sigma2_j[d]; gated to 0 above ln Bs; ranking uses min(w, ln Bs)."""
    w = (0.5 * scale * scale) * (stats.q2 @ stats.ksig2.transpose(-1, -2))  # [B, H, Nq, N]
    ln_b = math.log(block_size)
    # not (w <= ln Bs) also gates a non-finite w (a NaN query token): its block then keeps PISA's logit
    # instead of turning all of its query rows NaN (dense attention poisons only the NaN row)
    w_gated = torch.where(w <= ln_b, w, torch.zeros_like(w))
    w_rank = torch.clamp(w, max=ln_b)
    return w_gated, w_rank


def forced_mask(nq: int, n: int, band: int, n_sink_blocks: int, device) -> torch.Tensor:
    """[Nq, N] bool: |i - j| <= band or j < n_sink_blocks."""
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    return ((i - j).abs() <= band) | (j < n_sink_blocks)


def route(stats: BlockStats, cfg: SparseConfig) -> Routing:
    """Exact set S_i = forced blocks + top-k by score, forced blocks counted inside the budget.

    The index sets are detached (MATH.md, Backward); the gated PWT bonus w is not routing and keeps its
    autograd graph back to q^2 and sigma^2 (where the gate is open; zero gradient where it gated w)."""
    r = _route_detached(stats, cfg)
    if cfg.variant == "pwt" and torch.is_grad_enabled() and (stats.q2.requires_grad or stats.ksig2.requires_grad):
        w_gated, _ = pwt_bonus(stats, float(cfg.scale), cfg.block_size)  # the same arithmetic, with grad
        r = Routing(idx=r.idx, exact=r.exact, w=w_gated.to(stats.kbar.dtype))
    return r


@torch.no_grad()
def _route_detached(stats: BlockStats, cfg: SparseConfig) -> Routing:
    scale = float(cfg.scale)
    nq, n = stats.qbar.shape[-2], stats.kbar.shape[-2]
    score = scale * (stats.qbar @ stats.kbar.transpose(-1, -2))  # [B, H, Nq, N]
    if cfg.cov_bias:
        if stats.hnorm is None:
            raise ValueError("cov_bias routing needs block_stats(..., need_hnorm=True)")
        score = score + torch.log(stats.hnorm + 1e-6)[..., None, :]
    if cfg.variant == "pwt":
        w_gated, w_rank = pwt_bonus(stats, scale, cfg.block_size)
        score = score + w_rank
    else:
        w_gated = torch.zeros_like(score)
    # NaN/inf in the inputs must not break the ranking (the output carries them as dense attention would)
    score = torch.nan_to_num(score, nan=-1e30, posinf=1e30, neginf=-1e30)
    forced = forced_mask(nq, n, cfg.band, cfg.n_sink_blocks, score.device)
    score = score.masked_fill(forced, float("inf"))
    k = cfg.budget(n)
    n_forced = forced.sum(-1)  # [Nq]
    kmax = int(max(k, int(n_forced.max())))
    top = torch.topk(score, kmax, dim=-1, sorted=True).indices  # forced (+inf) come first
    keep = torch.arange(kmax, device=score.device) < torch.clamp(n_forced, min=k)[:, None]  # [Nq, K]
    idx = torch.where(keep, top, torch.full_like(top, n))
    idx = torch.sort(idx, dim=-1).values
    # one spare column absorbs the padding entries so that scatter never writes a real column twice
    exact = torch.zeros((*score.shape[:-1], n + 1), dtype=torch.bool, device=score.device)
    exact.scatter_(-1, idx, True)
    exact = exact[..., :n]
    idx = torch.where(idx < n, idx, torch.full_like(idx, -1)).to(torch.int32)
    return Routing(idx=idx, exact=exact, w=w_gated.to(stats.kbar.dtype))

"""An independent float64 autograd oracle of ../shared/MATH.md for a fixed exact set, written without kernels/ code.

One dense softmax per query row over T exact-token logits and N virtual-token logits, with the exact
tokens of non-routed blocks and the virtual tokens of routed blocks masked to -inf; the virtual tokens carry
the log of their real token count as a logit offset (their mass n_j). Statistics are plain torch ops, so
autograd differentiates through k-bar, V-hat, H-bar, sigma^2, q^2 and the gated w. Tiny inputs only.
"""
from __future__ import annotations

import math

import torch


def oracle(q, k, v, exact, *, variant, block_size, scale=None):
    """q, k, v [B, H, T, D] float64 (requires_grad as needed); exact [B, H, Nq, N] bool (held fixed)."""
    B, H, T, D = q.shape
    s = D ** -0.5 if scale is None else scale
    bs = block_size
    N = -(-T // bs)
    blk = torch.arange(T) // bs  # block of each token
    cnt = torch.bincount(blk, minlength=N).to(q.dtype)  # [N]
    onehot = torch.nn.functional.one_hot(blk, N).to(q.dtype)  # [T, N]
    kbar = torch.einsum("tn,bhtd->bhnd", onehot, k) / cnt[:, None]
    vhat = torch.einsum("tn,bhtd->bhnd", onehot, v)
    kc = k - kbar[:, :, blk]
    sig2 = torch.einsum("tn,bhtd->bhnd", onehot, kc * kc) / cnt[:, None]
    hbar = torch.einsum("bhta,bhtc->bhac", kc, v) / N
    q2 = torch.einsum("tn,bhtd->bhnd", onehot, q * q) / cnt[:, None]  # [B, H, Nq, D]
    ex_tok = exact[:, :, blk][:, :, :, blk]  # [B, H, T(query), T(key)]
    ex_virt = exact[:, :, blk]  # [B, H, T(query), N]
    le = s * q @ k.transpose(-1, -2)
    le = le.masked_fill(~ex_tok, float("-inf"))
    parts, vals = [le], [v]
    if variant in ("pisa", "pwt"):
        lv = s * q @ kbar.transpose(-1, -2)  # [B, H, T, N]
        if variant == "pwt":
            w = 0.5 * s * s * q2 @ sig2.transpose(-1, -2)  # [B, H, Nq, N]
            w = torch.where(w <= math.log(bs), w, torch.zeros_like(w))
            lv = lv + w[:, :, blk]
        lv = lv + torch.log(cnt)  # mass n_j
        lv = lv.masked_fill(ex_virt, float("-inf"))
        parts.append(lv)
    logits = torch.cat(parts, -1)
    p = torch.softmax(logits, -1)
    out = p[..., :T] @ v
    if variant in ("pisa", "pwt"):
        pv = p[..., T:] / cnt  # e(s-hat) / den per virtual token (its mass n_j divided back out)
        out = out + pv @ vhat + s * (q @ hbar) * pv.sum(-1, keepdim=True)
    return out

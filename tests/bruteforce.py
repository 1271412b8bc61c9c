"""A from-scratch float64 implementation of docs/MATH.md, written without kernels/ code.

Deliberately naive: explicit loops over query tokens and KV blocks, its own statistics and its own
routing. Only for tiny inputs (T of a few hundred).
"""
from __future__ import annotations

import math

import torch


def bruteforce(q, k, v, *, density, variant, band=1, n_sink_blocks=0, cov_bias=False, block_size=64,
               scale=None):
    q, k, v = (x.double() for x in (q, k, v))
    B, H, T, D = q.shape
    s = D ** -0.5 if scale is None else scale
    bs = block_size
    N = math.ceil(T / bs)
    spans = [(j * bs, min(T, (j + 1) * bs)) for j in range(N)]
    out = torch.empty_like(q)
    for b in range(B):
        for h in range(H):
            Q, K, V = q[b, h], k[b, h], v[b, h]
            kbar = [K[a:e].mean(0) for a, e in spans]
            vhat = [V[a:e].sum(0) for a, e in spans]
            sig2 = [((K[a:e] - kbar[j]) ** 2).mean(0) for j, (a, e) in enumerate(spans)]
            nj = [e - a for a, e in spans]
            Hj = [(K[a:e] - kbar[j]).T @ V[a:e] for j, (a, e) in enumerate(spans)]
            Hbar = sum(Hj) / N
            for i, (a, e) in enumerate(spans):
                qbar = Q[a:e].mean(0)
                q2 = (Q[a:e] ** 2).mean(0)
                w = [0.5 * s * s * float((q2 * sig2[j]).sum()) for j in range(N)]
                score = []
                for j in range(N):
                    r = s * float(qbar @ kbar[j])
                    if cov_bias:
                        r += math.log(float(torch.linalg.norm(Hj[j] - Hbar)) + 1e-6)
                    if variant == "pwt":
                        r += min(w[j], math.log(bs))
                    score.append(r)
                forced = [j for j in range(N) if abs(i - j) <= band or j < n_sink_blocks]
                kb = max(1, min(N, math.ceil(round(density * N, 6))))
                size = max(kb, len(forced))
                rest = sorted((j for j in range(N) if j not in forced), key=lambda j: -score[j])
                S = set(forced) | set(rest[: size - len(forced)])
                for t in range(a, e):
                    qt = Q[t]
                    logits, vals, masses = [], [], []
                    for j in range(N):
                        ja, je = spans[j]
                        if j in S:
                            for n in range(ja, je):
                                logits.append(s * float(qt @ K[n]))
                                vals.append(V[n])
                                masses.append(1.0)
                        elif variant in ("pisa", "pwt"):
                            wj = w[j] if (variant == "pwt" and w[j] <= math.log(bs)) else 0.0
                            logits.append(s * float(qt @ kbar[j]) + wj)
                            vals.append(vhat[j] + s * (qt @ Hbar))
                            masses.append(float(nj[j]))
                    m = max(logits)
                    num = torch.zeros(D, dtype=torch.float64)
                    den = 0.0
                    for lg, val, mass in zip(logits, vals, masses):
                        ex = math.exp(lg - m)
                        num += ex * val
                        den += ex * mass
                    out[b, h, t] = num / den
    return out

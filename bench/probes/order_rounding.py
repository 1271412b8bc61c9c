"""CPU (session 30): how far the online softmax's output moves when a query block's exact tiles come in another
order (the pair kernel's split-order shared pipeline, fwd_pair.py share=True, no longer visits them ascending). An
emulation of the kernel's arithmetic: float32 scores, running max, P rounded to bfloat16 before P V, float32
accumulators; 64 query rows, 40 tiles of 64 bfloat16 keys, D 128, random N(0, 1) inputs (flat attention: the worst
case for rounding). Prints, per trial, the relative L2 distance between the ascending and a shuffled order and each
one's distance to float64 attention; tests/test_cute_pair_gpu.py's SHARE_TOL is set from it.

    python bench/probes/order_rounding.py      (CPU, seconds)
"""
import json

import torch


def online(q, k, v, order):
    m = torch.full((q.shape[0], 1), -float("inf"))
    s_l = torch.zeros(q.shape[0], 1)
    o = torch.zeros(q.shape[0], v.shape[2])
    for t in order:
        s = (q @ k[t].T) * q.shape[1] ** -0.5
        m_new = torch.maximum(m, s.max(1, keepdim=True).values)
        a, p = torch.exp(m - m_new), torch.exp(s - m_new)
        s_l = s_l * a + p.sum(1, keepdim=True)
        o = o * a + p.bfloat16().float() @ v[t]
        m = m_new
    return o / s_l


def main():
    torch.manual_seed(0)
    rows = []
    for _ in range(5):
        q = torch.randn(64, 128).bfloat16().float()
        k, v = (torch.randn(40, 64, 128).bfloat16().float() for _ in range(2))
        a, b = online(q, k, v, list(range(40))), online(q, k, v, torch.randperm(40).tolist())
        ref = torch.softmax((q.double() @ k.double().reshape(-1, 128).T) * 128 ** -0.5, 1) @ v.double().reshape(-1, 128)
        rel = lambda x, y: float((x.double() - y.double()).norm() / y.double().norm())  # noqa: E731
        rows.append({"orders_apart": rel(b, a), "ascending_vs_f64": rel(a, ref), "shuffled_vs_f64": rel(b, ref)})
        print(json.dumps(rows[-1]))
    print("RESULT " + json.dumps({"trials": rows}))


if __name__ == "__main__":
    main()

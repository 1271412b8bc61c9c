"""CPU (session 30): how many tile loads sharing between adjacent query blocks could save, by group size. For groups of
2 (the pair kernel's two query blocks, PSA_CUTE_PAIR_SHARE), 4 and 8 adjacent query blocks: the union of their routed
lists over the sum of the lists' lengths, on union_pacing.py's lists (kernels.routing on DiT-like Morton-ordered and
on random q, k, v at Wan2.1-14B 480p's grid, 4 heads, pwt d 0.125).

    python bench/probes/union_groups.py       (CPU, ~10 s)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from union_pacing import lists  # noqa: E402


def main():
    for kind, idx in lists().items():
        H, N, _ = idx.shape
        for g in (2, 4, 8):
            union = total = 0
            for h in range(H):
                for i in range(0, N - g + 1, g):
                    u = set()
                    for j in range(g):
                        lst = [int(x) for x in idx[h, i + j] if x >= 0]
                        u |= set(lst)
                        total += len(lst)
                    union += len(u)
            print(kind, "group", g, "union / sum of lists = %.3f" % (union / total))


if __name__ == "__main__":
    main()

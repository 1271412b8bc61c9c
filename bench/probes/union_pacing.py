"""CPU model (session 28): how much of the pair kernel's shared exact pipeline's loss (PSA_CUTE_PAIR_SHARE) the order
of its union can explain. Session 25 measured it on DiT-like Morton inputs at Wan2.1-14B 480p (split_clocks.py, the
exact part alone, 10,240 CTAs on 132 SMs: 77.6 CTAs per SM): a pipeline per list 8.47 M cycles (its tile stream alone
8.69 M: stream-bound), the shared pipeline 10.95 M (its stream alone 6.63 M, ~30% fewer tiles), the owner-kind protocol
11.44 M. Its note left one suspect: a single producer filling one ring in the sorted merge of both lists, so that one
consumer slow to free a slot stalls the other's next tile. This models exactly that and nothing else.

The model, per CTA (one SM): the producer issues each tile's K + V load in ring order once its slot is free; loads
stream through one server (tau cycles per tile, lam cycles of latency); a consumer takes its tiles in ring order,
C cycles of work per own tile (S GEMM, softmax, P V; both consumers at once), p cycles to wait for and release a
tile only the other list holds (today's protocol; the owner-kind protocol skips those); a slot is free once every
consumer that must release it has. Per list: two rings of 2 tiles (4 stages of K or V each), two producers, one
stream; shared: one ring of 4 tiles (8 stages). tau is the per-list stream's 875 cycles per tile (8.69 M / 77.6 /
128); C is not known by itself, so the model runs a range. Not modelled: the sorted-merge build's long-gap path
(removed in session 30), per-tile costs of the shared consumers' bookkeeping, the power cap. Lists: kernels.routing's
on kernels.synthetic's DiT-like q, k, v on the 480p grid (Morton-ordered, 4 heads) and on random ones, pwt d 0.125.

    python bench/probes/union_pacing.py        (CPU, ~1 min; prints a table and one RESULT line)
"""
import heapq
import json
import os
import random
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from kernels.config import SparseConfig  # noqa: E402
from kernels.reorder import apply_reorder, orders_on  # noqa: E402
from kernels.routing import block_stats, route  # noqa: E402
from kernels.synthetic import dit_like_qkv  # noqa: E402

GRID = (21, 30, 52)  # Wan2.1-14B 480p: T = 32760, 512 blocks
HEADS = 4
PAIRS = 120  # sampled pairs of adjacent query blocks per input kind


def simulate(rings, consumers, tau, lam, C, p, issue=20.0, work=None):
    """Finish time of one CTA. rings: [(slots, [set of consumers that release tile i, ...])] or (slots, tiles, gate)
    with gate {i: (ring, tile)}: tile i of this ring also waits until that tile of another ring is released by all
    of its consumers (a slot two rings share: bench/probes/union_coupling.py); consumers: each a list of (ring,
    tile, own) in the order it takes them; work(c, k): cycles of consumer c's k-th own tile (default C). Discrete
    events in time order (one load server, FIFO)."""
    land = [dict() for _ in rings]
    rel = [dict() for _ in rings]
    prod = [0.0] * len(rings)
    nxt = [0] * len(rings)
    pos = [0] * len(consumers)
    own_done = [0] * len(consumers)
    ct = [0.0] * len(consumers)
    last = -1e18
    end = 0.0
    while True:
        ev = []
        for r, ring in enumerate(rings):
            slots, tiles = ring[0], ring[1]
            gate = ring[2] if len(ring) > 2 else {}
            i = nxt[r]
            if i >= len(tiles):
                continue
            t0 = prod[r]
            if i in gate:
                gr, gi = gate[i]
                got = rel[gr].get(gi, {})
                if not rings[gr][1][gi] <= set(got):
                    continue
                t0 = max([t0] + [got[c] for c in rings[gr][1][gi]])
            if i < slots:
                ev.append((t0, 0, r))
                continue
            got = rel[r].get(i - slots, {})
            if tiles[i - slots] <= set(got):
                ev.append((max([t0] + [got[c] for c in tiles[i - slots]]), 0, r))
        for c, seq in enumerate(consumers):
            if pos[c] < len(seq) and seq[pos[c]][1] in land[seq[pos[c]][0]]:
                r, i, _ = seq[pos[c]]
                ev.append((max(ct[c], land[r][i]), 1, c))
        if not ev:
            break
        t, kind, a = min(ev)
        if kind == 0:
            last = max(t + lam, last + tau)
            land[a][nxt[a]] = last
            nxt[a] += 1
            prod[a] = t + issue
        else:
            r, i, own = consumers[a][pos[a]]
            ct[a] = t + ((C if work is None else work(a, own_done[a])) if own else p)
            own_done[a] += bool(own)
            rel[r].setdefault(i, {})[a] = ct[a]
            pos[a] += 1
            end = max(end, ct[a])
    if any(pos[c] < len(s) for c, s in enumerate(consumers)):
        raise RuntimeError("deadlock")
    return end


def per_list(a, b, **kw):
    return simulate([(2, [{0}] * len(a)), (2, [{1}] * len(b))],
                    [[(0, i, True) for i in range(len(a))], [(1, i, True) for i in range(len(b))]], **kw)


def shared(order, kinds=False, **kw):
    """order: the owners of each union tile in ring order; kinds: each consumer waits for and releases only its own."""
    tiles = [set(o) if kinds else {0, 1} for o in order]
    return simulate([(4, tiles)], [[(0, i, c in o) for i, o in enumerate(order) if not kinds or c in o]
                                   for c in (0, 1)], **kw)


def merged(a, b):
    """The sorted merge of two ascending lists (what the shared build walks)."""
    sa, sb = set(a), set(b)
    return [({0} if x in sa else set()) | ({1} if x in sb else set()) for x in sorted(sa | sb)]


def balanced(a, b):
    """The same union with one list's own tiles alternating with the other's and the shared ones spread evenly (each
    consumer's own order then no longer ascends)."""
    sa, sb = set(a), set(b)
    singles = []
    ao, bo = [x for x in a if x not in sb], [x for x in b if x not in sa]
    for i in range(max(len(ao), len(bo))):
        singles += ([{0}] if i < len(ao) else []) + ([{1}] if i < len(bo) else [])
    m = len(a) - len(ao)
    out, j = [], 0
    for i in range(len(singles) + m):
        if j < m and (not singles or (i + 0.5) * m / (len(singles) + m) >= j + 0.5):
            out.append({0, 1})
            j += 1
        else:
            out.append(singles.pop(0))
    return out


def shared_first(a, b):
    """Session 30's order (fwd_pair.py share=True, pair_sched._produce_split; tests/test_pair_share_schedule.py's
    split_order as owner sets): the blocks both lists hold first (ascending), then one list's own tiles alternating
    with the other's, the longer list's rest last. Each consumer's gap before an own tile is then 0 or 1 by a closed
    form (no list walk in the loop)."""
    sa, sb = set(a), set(b)
    m = len(sa & sb)
    ao, bo = [x for x in a if x not in sb], [x for x in b if x not in sa]
    out = [{0, 1}] * m
    for i in range(max(len(ao), len(bo))):
        out += ([{0}] if i < len(ao) else []) + ([{1}] if i < len(bo) else [])
    return out


def lists():
    cfg = SparseConfig(density=0.125, variant="pwt", band=1, n_sink_blocks=0, scale=128 ** -0.5)
    perm, _ = orders_on(GRID, torch.device("cpu"))
    q, k, v = (apply_reorder(x, perm, 0).contiguous() for x in dit_like_qkv(GRID, heads=HEADS, head_dim=128))
    out = {"ditlike": route(block_stats(q, k, v, 64), cfg).idx[0]}
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, q.shape[2], 128) for _ in range(3))
    out["random"] = route(block_stats(q, k, v, 64), cfg).idx[0]
    return out


def main():
    res = {"model": "per CTA, cycles", "tau": 875.0, "lam": 1000.0, "p": 60.0}
    rng = random.Random(0)
    for kind, idx in lists().items():
        pairs = rng.sample([(h, i) for h in range(idx.shape[0]) for i in range(idx.shape[1] // 2)], PAIRS)
        ab = [([int(x) for x in idx[h, 2 * i] if x >= 0], [int(x) for x in idx[h, 2 * i + 1] if x >= 0])
              for h, i in pairs]
        res[kind] = {"union_tiles": sum(len(set(a) | set(b)) for a, b in ab) / PAIRS}
        for C in (1100.0, 1400.0, 1700.0, 2000.0):
            kw = dict(tau=res["tau"], lam=res["lam"], C=C, p=res["p"])
            row = {"per_list": 0.0, "merge": 0.0, "merge_kinds": 0.0, "balanced": 0.0, "shared_first": 0.0}
            for a, b in ab:
                row["per_list"] += per_list(a, b, **kw)
                row["merge"] += shared(merged(a, b), **kw)
                row["merge_kinds"] += shared(merged(a, b), kinds=True, **kw)
                row["balanced"] += shared(balanced(a, b), **kw)
                row["shared_first"] += shared(shared_first(a, b), **kw)
            row = {k2: round(v2 / PAIRS) for k2, v2 in row.items()}
            res[kind][f"C{int(C)}"] = row
            print(kind, f"C={int(C)}", json.dumps(row), flush=True)
    print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    main()

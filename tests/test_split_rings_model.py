"""The split-rings shared exact tiles (designed in session 31, bench/results/pieces_h200.md "Session 31"; built in
session 32: kernels/cute/pair_sched.py _produce_rings, _ring_pos, _ring_take, _ring_arrive)
modelled down to its mbarriers on the CPU, with test_union_barrier_model.py's Barrier (phase and arrival counts,
transaction bytes, `try_wait.parity` as the hardware does it) and TMA loads that land in any order.

The design keeps the pair kernel's two per-list rings of S slots (producer warp r fills ring r; each empty barrier
counts 2 units: a consumer warpgroup's release of its own tile is both units; in the kernel each empty barrier counts
8 arrivals, one per consumer warp and unit: 2 from each of the 4 warps for an own tile, 1 each for a shared one, so
no warp waits for the other three). The m blocks both lists hold go first, shared rank u into ring u % 2, then each ring's own list's other
blocks. A consumer takes the shared tiles u = 0 .. m - 1 from ring u % 2 (their loads 2 (u // 2) and + 1: stage and
parity in closed form), releasing one unit each, then its own tiles from its own ring after the 2 ceil((m - c) / 2)
shared loads there. No consumer ever waits for or releases a tile it does not compute, and none skips a load of a
ring it waits on: each ring's loads are seen in order by every consumer that waits on them, so no wait can read an
older phase as its own. Each consumer holds its last V tile across its next K tile, as the kernel does.

Checked here: no deadlock and no stale read under random interleavings (a lagging consumer included), each consumer
computing exactly its list's blocks, K before V, for the crafted list pairs and random ones of every overlap."""
import random

import pytest

from test_pair_share_schedule import CASES, _lists
from test_union_barrier_model import Barrier, interleave

S = 4  # fwd_pair.KV_STAGES: slots per ring


def _plan(a, b, shared_units=1):
    """(rings, seqs): rings[r] = the blocks ring r loads in order; seqs[c] = consumer c's tiles as (ring, load index
    of its K, the units each release arrives with, block) in the order it computes them. `shared_units` other than 1:
    a broken release for the tests that the model catches one."""
    sa, sb = set(a), set(b)
    shared = sorted(sa & sb)
    m = len(shared)
    own = [[x for x in a if x not in sb], [x for x in b if x not in sa]]
    rings = [[shared[u] for u in range(r, m, 2)] + own[r] for r in (0, 1)]
    seqs = []
    for c in (0, 1):
        m_c = (m + 1 - c) // 2  # shared tiles in ring c
        seq = [(u % 2, 2 * (u // 2), shared_units, shared[u]) for u in range(m)]
        seq += [(c, 2 * (m_c + k), 2, x) for k, x in enumerate(own[c])]
        seqs.append(seq)
    return rings, seqs


def _producer(r, blocks, full, empty):
    for i in range(len(blocks)):
        for half in range(2):  # K then V
            load = 2 * i + half
            s = load % S
            yield ("wait", empty[r][s], ((load // S) & 1) ^ 1)
            yield ("tma", full[r][s], (r, s), (r, load))


def _consumer(seq, full, empty):
    def wait(r, load):
        return ("wait", full[r][load % S], (load // S) & 1)

    held = None  # the V tile of the previous step: released after this step's K (FlashAttention-3's overlap)
    for r, kload, units, _ in seq:
        yield wait(r, kload)
        yield ("use", (r, kload % S), (r, kload))
        yield ("arrive", empty[r][kload % S], units)
        if held is not None:
            yield ("use", (held[0], held[1] % S), (held[0], held[1]))
            yield ("arrive", empty[held[0]][held[1] % S], held[2])
        yield wait(r, kload + 1)
        held = (r, kload + 1, units)
    if held is not None:
        yield ("use", (held[0], held[1] % S), (held[0], held[1]))
        yield ("arrive", empty[held[0]][held[1] % S], held[2])


def simulate(a, b, seed, lag=0.0, shared_units=1):
    """One random interleaving of both producers, both consumers and the TMA completions (`lag`: the probability that
    consumer 0 sits out a step while anything else can move). Returns each consumer's (ring, load) reads in order;
    raises Stale on a read of a slot that does not hold its tile, AssertionError on a deadlock or over-arrival."""
    rings, seqs = _plan(a, b, shared_units)
    full = [[Barrier(1) for _ in range(S)] for _ in range(2)]
    empty = [[Barrier(2) for _ in range(S)] for _ in range(2)]
    agents = [_producer(0, rings[0], full, empty), _producer(1, rings[1], full, empty),
              _consumer(seqs[0], full, empty), _consumer(seqs[1], full, empty)]
    return interleave(agents, 2, seed, lag)


def _check(a, b, seed, lag=0.0):
    rings, seqs = _plan(a, b)
    used = simulate(a, b, seed, lag)
    for c, (lst, seq) in enumerate(zip((a, b), seqs)):
        # every block of the list once (K then V, as the sequence takes them), nothing else
        assert sorted(x for *_, x in seq) == sorted(lst)
        want = [t for r, k, _, _ in seq for t in ((r, k), (r, k + 1))]
        assert sorted(used[c]) == sorted(want) and len(used[c]) == 2 * len(lst)
        for r, k, _, x in seq:  # the load each tile is read from holds that block
            assert rings[r][k // 2] == x


@pytest.mark.parametrize("case", sorted(CASES))
def test_split_rings_on_crafted_lists(case):
    a, b = CASES[case]
    for seed in range(40):
        for x, y in ((a, b), (b, a)):
            _check(x, y, seed)
            _check(x, y, seed, lag=0.9)


@pytest.mark.parametrize("overlap", [0.0, 0.2, 0.6, 1.0])
def test_split_rings_on_random_lists(overlap):
    rng = random.Random(int(overlap * 100) + 31)
    for trial in range(60):
        n = rng.choice([16, 64, 512])
        k = rng.randint(1, min(n // 2, 64))
        a, b = _lists(rng, n, k, overlap)
        _check(a, b, trial, lag=0.9 if trial % 2 else 0.0)


def _fails(runs):
    kinds = set()
    for run in runs:
        try:
            run()
        except AssertionError as e:  # (Stale included)
            kinds.add(type(e).__name__ + (": deadlock" if "deadlock" in str(e) else ""))
    return kinds


def test_the_model_catches_a_shared_tile_released_with_both_units_by_each_consumer():
    # each consumer releasing a shared tile's slot as if it were its own: the slot frees after the first consumer,
    # so the producer can overwrite a tile the other has not read yet (or a phase completes twice)
    a, b = list(range(0, 12)), list(range(0, 12))
    kinds = _fails(lambda s=seed: simulate(a, b, s, lag=0.9, shared_units=2) for seed in range(200))
    assert kinds, "no stale read, deadlock or over-arrival in 200 runs"


def test_the_model_catches_a_ring_of_one_slot():
    # one slot per ring: a consumer holding its V tile across its next K tile of the same ring waits for a slot
    # only its own later release frees
    global S
    keep, S = S, 1
    try:
        assert "AssertionError: deadlock" in _fails(lambda s=seed: simulate([0, 1, 2], [5, 6, 7], s)
                                                    for seed in range(20))
    finally:
        S = keep

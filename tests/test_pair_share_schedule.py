"""The shared exact pipeline of kernels/cute/fwd_pair.py (share=True) as a protocol, on CPU: one producer fills the
union of two routed block lists into 2 S slots (K then V per block), each consumer waits for and releases every
union slot, computes only its own blocks, and holds its last V slot across at most gap_max = S - 1 blocks of the
other list (longer gaps: that P V first). The virtual-token pipeline (k-bar / value-mean tiles, then the two H-bar
tiles) is shared by both consumers too, and a consumer passes over the union's blocks after its last own one right
after its boundary step (before it can block on that pipeline).

The union comes in one of two orders: "split", the kernel's in sessions 30-31 (pair_sched._produce_split: the blocks
both lists hold, then the two lists' own blocks alternating, the longer list's rest), whose gaps the kernel computed
by arithmetic (pair_sched._ugap, _upos, mirrored here and checked against the order itself; measured slower than the
per-list pipelines on an H100 in session 31 and replaced by the split rings in session 32, test_split_rings_model.py;
the code: `git show bb41039:kernels/cute/pair_sched.py`), and "merge", the sorted
merge the kernel used before, kept because its long gaps exercise the hold-over limit. The model runs the kernel's
order of waits and releases under random interleavings: no deadlock, every consumer computes exactly its own blocks
in the order's sequence, every slot is released by both before it is filled again. A rule that breaks the protocol
(a hold-over limit one past gap_max, or the tail pass after the virtual tiles) deadlocks here, so the model can
fail. CPU only; the kernel itself is tested on the GPU in test_cute_pair_gpu.py."""
import random

import pytest

S = 4  # fwd_pair.KV_STAGES: exact slots per consumer, 2 S in the shared pipeline
VT = 3  # fwd.PAIR_VT_STAGES


def split_order(a, b):
    """[(block, {owners})]: pair_sched._produce_split's union order for lists a (consumer 0) and b (consumer 1)."""
    sa, sb = set(a), set(b)
    out = [(x, {0, 1}) for x in a if x in sb]
    ao, bo = [x for x in a if x not in sb], [x for x in b if x not in sa]
    for i in range(max(len(ao), len(bo))):
        out += ([(ao[i], {0})] if i < len(ao) else []) + ([(bo[i], {1})] if i < len(bo) else [])
    return out


def merge_order(a, b):
    sa, sb = set(a), set(b)
    return [(x, ({0} if x in sa else set()) | ({1} if x in sb else set())) for x in sorted(sa | sb)]


ORDERS = {"split": split_order, "merge": merge_order}


def ugap(c, u, m, n_alt):
    """pair_sched._ugap: union tiles consumer c passes before its own tile u in split order."""
    r = u - m
    return 1 if (r >= 1 - c and r <= n_alt - c) else 0


def upos(c, u, m, n_alt):
    """pair_sched._upos: the split-order position of consumer c's own tile u."""
    if u < m:
        return u
    r = u - m
    return m + 2 * r + c if r < n_alt else m + n_alt + r


def _consumer(c, union, n_vt, gap_max, tail_early=True):
    """The kernel's sequence for consumer c over the union (as ORDERS give it): ("w"|"r", pipe, position) and
    ("use", block). Its gaps are the union positions between its own tiles."""
    kv = iter(range(10 ** 6))  # this consumer's next exact position (its pipeline state)
    vp = iter(range(10 ** 6))
    own = [i for i, (_, o) in enumerate(union) if c in o]

    def pass_(g):
        for _ in range(g):
            for _ in range(2):
                p = next(kv)
                yield ("w", "kv", p)
                yield ("r", "kv", p)

    n_end = len(union) - 1 - own[-1] if own else 0
    if not own:
        yield from pass_(len(union))
    if own:
        yield from pass_(own[0])
        k0 = next(kv)
        yield ("w", "kv", k0)
        yield ("use", union[own[0]][0])
        yield ("r", "kv", k0)
        for u in range(1, len(own)):
            vh = next(kv)
            yield ("w", "kv", vh)
            g_now = own[u] - own[u - 1] - 1
            if g_now > gap_max:
                yield ("r", "kv", vh)  # P V of the previous block first
            yield from pass_(g_now)
            kh = next(kv)
            yield ("w", "kv", kh)
            yield ("use", union[own[u]][0])
            yield ("r", "kv", kh)
            if g_now <= gap_max:
                yield ("r", "kv", vh)
    if n_vt > 0:
        if own:  # the boundary step: V of the last exact block, the first k-bar tile
            vh, kh = next(kv), next(vp)
            yield ("w", "kv", vh)
            yield ("w", "vp", kh)
            yield ("r", "vp", kh)
            yield ("r", "kv", vh)
            if tail_early:
                yield from pass_(n_end)
        else:
            kh = next(vp)
            yield ("w", "vp", kh)
            yield ("r", "vp", kh)
        for _ in range(1, n_vt):
            vh, kh = next(vp), next(vp)
            yield ("w", "vp", vh)
            yield ("w", "vp", kh)
            yield ("r", "vp", kh)
            yield ("r", "vp", vh)
        last = next(vp)
        yield ("w", "vp", last)
        yield ("r", "vp", last)
        hs = [next(vp), next(vp)]
        for p in hs:
            yield ("w", "vp", p)
        for p in hs:
            yield ("r", "vp", p)
        if own and not tail_early:
            yield from pass_(n_end)
    elif own:
        vh = next(kv)
        yield ("w", "kv", vh)
        yield ("r", "kv", vh)
        yield from pass_(n_end)


def _simulate(a, b, n_vt, gap_max, seed, tail_early=True, order="split"):
    """Runs the producer and both consumers in a random interleaving; returns the blocks each consumer used, or
    raises AssertionError on a deadlock or a protocol violation."""
    union = ORDERS[order](a, b)
    kv_total, vp_total = 2 * len(union), (2 * n_vt + 2 if n_vt else 0)
    slots = {"kv": 2 * S, "vp": VT}
    filled = {"kv": 0, "vp": 0}  # positions the producer has filled
    released = {p: [set(), set()] for p in ("kv", "vp")}  # per consumer, positions released
    cons = [_consumer(0, union, n_vt, gap_max, tail_early), _consumer(1, union, n_vt, gap_max, tail_early)]
    pending = [next(c, None) for c in cons]
    used = [[], []]
    rng = random.Random(seed)

    def can_fill(pipe):
        p = filled[pipe]
        total = kv_total if pipe == "kv" else vp_total
        if p >= total:
            return False
        old = p - slots[pipe]
        return old < 0 or all(old in released[pipe][c] for c in range(2))

    while True:
        moves = [("prod", pipe) for pipe in ("kv", "vp") if can_fill(pipe)]
        for c in range(2):
            op = pending[c]
            if op is None:
                continue
            if op[0] == "w" and op[2] >= filled[op[1]]:
                continue  # its slot is not filled yet
            moves.append(("cons", c))
        if not moves:
            break
        kind, x = rng.choice(moves)
        if kind == "prod":
            filled[x] += 1
            continue
        op = pending[x]
        if op[0] == "r":
            assert op[2] not in released[op[1]][x], f"consumer {x} released {op} twice"
            released[op[1]][x].add(op[2])
        elif op[0] == "use":
            used[x].append(op[1])
        pending[x] = next(cons[x], None)
    assert pending == [None, None], f"deadlock: consumers waiting at {pending}, filled {filled}"
    for pipe, total in (("kv", kv_total), ("vp", vp_total)):
        assert filled[pipe] == total
        for c in range(2):
            assert released[pipe][c] == set(range(total)), f"consumer {c} left {pipe} slots unreleased"
    return used


def _lists(rng, n, k, overlap):
    a = sorted(rng.sample(range(n), k))
    keep = [x for x in a if rng.random() < overlap]
    rest = [x for x in range(n) if x not in a]
    b = sorted(keep + rng.sample(rest, k - len(keep)))
    return a, b


CASES = {
    "disjoint": (list(range(0, 6)), list(range(10, 16))),
    "identical": ([0, 3, 7, 15], [0, 3, 7, 15]),
    "gap_3_then_4": ([0, 4, 9], [1, 2, 3, 5, 6, 7, 8]),
    "long_gap": ([0, 8, 9], list(range(1, 8))),
    "interleaved": (list(range(0, 16, 2)), list(range(1, 16, 2))),
    "one_list_empty": (list(range(0, 8)), []),
    "both_empty": ([], []),
    "one_block_each": ([5], [9]),
    # (session 32, for the split rings: both rings wrap in the shared phase; an odd shared count; one shared block)
    "all_shared_long": (list(range(16)), list(range(16))),
    "three_shared_unequal_tails": ([0, 1, 2, 4, 6, 8, 10, 12, 14, 15], [0, 1, 2, 3]),
    "one_shared": ([5, 6, 7, 8, 9], [5, 10, 11, 12, 13, 14, 15]),
}


def _want(a, b, order):
    union = ORDERS[order](a, b)
    return [[j for j, o in union if c in o] for c in (0, 1)]


# no virtual tiles only at density 1, where both lists hold every block
@pytest.mark.parametrize("case,n_vt", [(c, n) for c in sorted(CASES) for n in (1, 3)]
                         + [(c, 0) for c in sorted(CASES) if CASES[c][0] == CASES[c][1]])
@pytest.mark.parametrize("order", sorted(ORDERS))
def test_share_protocol_crafted_lists(case, n_vt, order):
    a, b = CASES[case]
    for seed in range(30):
        for x, y in ((a, b), (b, a)):
            used = _simulate(x, y, n_vt, S - 1, seed, order=order)
            assert used == _want(x, y, order)
            assert [sorted(u) for u in used] == [x, y]


@pytest.mark.parametrize("order", sorted(ORDERS))
@pytest.mark.parametrize("overlap", [0.0, 0.12, 0.6, 1.0])
def test_share_protocol_random_lists(overlap, order):
    rng = random.Random(int(overlap * 100))
    for trial in range(40):
        n = rng.choice([16, 64, 512])
        k = rng.randint(1, min(n // 2, 64))
        a, b = _lists(rng, n, k, overlap)
        used = _simulate(a, b, -(-n // 64), S - 1, trial, order=order)
        assert used == _want(a, b, order)


def _split_arithmetic_holds(a, b):
    """The kernel's closed forms (_ugap before each own tile, _upos of the last, n_end) against the split order's
    own positions; consumer c's own tiles in the order: its shared blocks, then its own ones, each ascending."""
    union = split_order(a, b)
    m = len(set(a) & set(b))
    n_alt = min(len(a), len(b)) - m
    for c, lst in ((0, a), (1, b)):
        own = [i for i, (_, o) in enumerate(union) if c in o]
        sh = [x for x in lst if x in (set(b) if c == 0 else set(a))]
        assert [union[i][0] for i in own] == sh + [x for x in lst if x not in sh]
        for u, p in enumerate(own):
            assert upos(c, u, m, n_alt) == p
            assert ugap(c, u, m, n_alt) == p - (own[u - 1] if u else -1) - 1 <= 1
        if own:
            assert len(a) + len(b) - m - 1 - upos(c, len(own) - 1, m, n_alt) == len(union) - 1 - own[-1]
    # the partial last block (the largest id) is the consumer's last shared tile or its last own one
    t = max(a + b) if a + b else None
    for c, lst in ((0, a), (1, b)):
        if t in lst:
            own = [j for j, o in union if c in o]
            assert own.index(t) == (m - 1 if t in a and t in b else len(lst) - 1)


def test_split_order_arithmetic_matches_the_order():
    # the gaps are 0 or 1 (never past gap_max), and the kernel's arithmetic places every tile where the producer does
    for case in CASES.values():
        _split_arithmetic_holds(*case)
        _split_arithmetic_holds(*case[::-1])
    rng = random.Random(30)
    for trial in range(400):
        n = rng.choice([2, 16, 64, 512, 1182])
        k = rng.randint(0, min(n // 2, 150))
        a, b = _lists(rng, n, k, rng.choice([0.0, 0.12, 0.6, 1.0]))
        if rng.random() < 0.3:  # unequal lengths (forced blocks past the budget)
            b = sorted(set(b) | set(rng.sample(range(n), rng.randint(0, min(n, 8)))))
        _split_arithmetic_holds(a, b)


def test_a_hold_over_past_gap_max_deadlocks_in_the_model():
    # holding the last V over S blocks of the other list (2 S + 1 slots) cannot be filled: the model catches it
    # (merge order: the split order never passes more than one tile at a time)
    a, b = [0, S + 1], list(range(1, S + 1))
    _simulate(a, b, 1, S - 1, 0, order="merge")
    with pytest.raises(AssertionError, match="deadlock"):
        for seed in range(50):
            _simulate(a, b, 1, S, seed, order="merge")


def test_the_tail_pass_after_the_virtual_tiles_deadlocks_in_the_model():
    # a consumer whose list ends early must pass over the other list's last blocks before it can block on the
    # shared virtual pipeline (the other consumer has not released its first slots yet)
    a, b = [0], list(range(1, 4 * S + 1))
    _simulate(a, b, 4, S - 1, 0)
    with pytest.raises(AssertionError, match="deadlock"):
        for seed in range(50):
            _simulate(a, b, 4, S - 1, seed, tail_early=False)

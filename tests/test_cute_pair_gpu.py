"""The CuTe pisa / pwt kernel with two query blocks per CTA (kernels/cute/fwd_pair.py) on an SM90 GPU: against the
one-block kernel (fwd.py) under identical routing (same per-tile arithmetic, so the outputs must agree to bf16
rounding), against the float64 reference, on an odd number of query blocks (the last CTA's second warpgroup
computes a block it does not store), routing lists of unequal length (band 0 / sinks, -1 padding), no virtual
tiles (budget >= N), the reciprocal epilogue (PSA_CUTE_RECIP_STORE), one exact pipeline over the union of the two
lists (PSA_CUTE_PAIR_SHARE; crafted lists: disjoint, identical, one empty, unequal lengths) and the node's Morton
call; the peeled virtual loop (PSA_CUTE_VT_PEEL) and the ping-pong consumers (PSA_CUTE_PINGPONG) against the plain
build. Skipped (one line) without CUDA, an SM90 GPU or nvidia-cutlass-dsl. On the H200 (2026-12-01): 19 tests passed
in session 7 (bench/results/gpu_tests_s7_h200.log) and the reciprocal-epilogue and Morton tests in session 8; the
shared-pipeline tests were written after that run. Session 17 (2026-12-03): every test of this file passed on the
H200 but the q_perm test's cache-key check (fixed after that run), the ping-pong tests among them. Session 18: every
test of this file passed (P18), and the tree-reduction tests (T18). Session 19: every test of this file passed with
PV_FENCE, PV_FENCE_VT and S_AHEAD on (A19), and with the defaults (PV_FENCE on); the PV_PIN arm and the pinned
PV_FENCE_VT / S_AHEAD forms were written after that session's last run. The shared exact tiles' split order (session
30) passed every share test on an H100 in session 31 (U30); its successor, the split rings (session 32), passed every
share test on an H100 in session 32 (U32, the crafted ring cases among them); their ring arithmetic was rewritten in
shifts and masks, once per tile, after that run (the same values; bench/gpu_round.sh U33 runs these tests first)."""
import pytest
import torch

from gpu_common import ROUNDING, cfg_of, cute_skip_reason, float64_reference, rel, rnd


_why = cute_skip_reason()
if _why is not None:
    pytest.skip(f"CuTe pair-kernel GPU tests skipped: {_why}", allow_module_level=True)

pytestmark = pytest.mark.gpu

REF_TOL = 3e-3
SAME_TOL = 1e-5  # pair vs one-block kernel: the same operations per query block
# shared exact tiles vs a pipeline per list: the shared tiles first (fwd_pair.py) changes the order of each query block's
# tiles, so the online softmax rounds its bfloat16 P differently (bench/probes/order_rounding.py, a CPU emulation of 40
# random tiles reordered: ~1.8e-3 relative L2 apart, each ~1.5e-3 from float64)
SHARE_TOL = 4e-3


def _run(q, k, v, cfg, routing, monkeypatch, pair, stages=None):
    from kernels import cute as kc
    monkeypatch.setenv("PSA_CUTE_PAIR", "1" if pair else "0")
    if stages is not None:
        monkeypatch.setenv("PSA_CUTE_VT_STAGES", str(stages))
    return kc.forward_with_routing(q, k, v, cfg, routing)


def _switched(q, k, v, cfg, routing, monkeypatch, env):
    """The pair kernel's outputs with the switch `env` at 0 and at 1 (identical routing)."""
    outs = []
    for val in ("0", "1"):
        monkeypatch.setenv(env, val)
        outs.append(_run(q, k, v, cfg, routing, monkeypatch, True))
    return outs


def _check(q, k, v, cfg, monkeypatch, stages=None):
    # the one-block kernel's epilogue divides: the pair build here does too, so the operations are the same
    monkeypatch.setenv("PSA_CUTE_RECIP_STORE", "0")
    r, ref = float64_reference(q, k, v, cfg)
    one = _run(q, k, v, cfg, r, monkeypatch, False)
    two = _run(q, k, v, cfg, r, monkeypatch, True, stages)
    assert torch.isfinite(two).all()
    e_same = rel(two, one)
    assert e_same <= SAME_TOL, f"pair vs one-block kernel, identical routing: rel L2 {e_same:.2e}"
    e_ref = rel(two, ref)
    assert e_ref <= REF_TOL, f"pair kernel vs float64 reference: rel L2 {e_ref:.2e} > {REF_TOL:.0e}"
    return e_same, e_ref


# T 1000: 16 query blocks, a partial last one; T 936: 15 (odd: the last pair's second warpgroup stores nothing);
# T 4033: 64, batch 2; T 64: one block (one CTA, both warpgroups on it); B3 H12 T936 and B1 H8 T4096: more CTAs
# (288, 256) than SMs.
@pytest.mark.parametrize("variant", ["pwt", "pisa"])
@pytest.mark.parametrize("shape", [(1, 2, 1000, 128), (1, 2, 936, 128), (2, 2, 4033, 128), (1, 1, 64, 128),
                                   (3, 12, 936, 128), (1, 8, 4096, 128)],
                         ids=lambda s: "B{}_H{}_T{}_D{}".format(*s))
def test_pair_matches_one_block_kernel_and_reference(variant, shape, monkeypatch):
    q, k, v = (rnd(shape, seed=80 + s) for s in range(3))
    _check(q, k, v, cfg_of(128, 0.125, variant), monkeypatch)


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_pair_shared_stage_counts(stages, monkeypatch):
    q, k, v = (rnd((1, 2, 4096, 128), seed=84 + s) for s in range(3))
    monkeypatch.setenv("PSA_CUTE_S_AHEAD_VT", "0")  # the plain virtual loop: S_AHEAD_VT raises the count to 4
    _check(q, k, v, cfg_of(128, 0.2, "pwt"), monkeypatch, stages)


def test_pair_unequal_lists_band_zero_and_sinks(monkeypatch):
    # band 0 + a sink block: lists of different lengths in adjacent query blocks, so the two warpgroups of a CTA
    # reach the shared virtual tiles at different times
    q, k, v = (rnd((2, 2, 4033, 128), seed=87 + s) for s in range(3))
    _check(q, k, v, cfg_of(128, 0.2, "pwt", band=0, sinks=1), monkeypatch)
    _check(q, k, v, cfg_of(128, 0.05, "pisa", band=0, sinks=1), monkeypatch)


def test_pair_large_logits(monkeypatch):
    monkeypatch.setenv("PSA_CUTE_RECIP_STORE", "0")
    q, k, v = (rnd((1, 2, 1000, 128), seed=90 + s) for s in range(3))
    q = (q.float() * 30).to(torch.bfloat16)
    r, ref = float64_reference(q, k, v, cfg_of(128, 0.125, "pwt"))
    two = _run(q, k, v, cfg_of(128, 0.125, "pwt"), r, monkeypatch, True)
    one = _run(q, k, v, cfg_of(128, 0.125, "pwt"), r, monkeypatch, False)
    assert torch.isfinite(two).all() and rel(two, one) <= SAME_TOL and rel(two, ref) <= 1e-2


def test_pair_density_one_has_no_virtual_tiles(monkeypatch):
    import torch.nn.functional as F
    from kernels import cute as kc
    q, k, v = (rnd((1, 2, 936, 128), seed=93 + s) for s in range(3))
    monkeypatch.setenv("PSA_CUTE_PAIR", "1")
    out = kc.forward(q, k, v, cfg_of(128, 1.0, "pwt"))
    assert rel(out, F.scaled_dot_product_attention(q, k, v)) <= 3e-3


def test_pair_own_routing_and_dit_like(monkeypatch):
    from kernels import triton as kt
    from kernels import cute as kc
    from kernels.synthetic import dit_like_qkv
    q, k, v = dit_like_qkv((4, 32, 32), heads=2, head_dim=128, dtype=torch.bfloat16, device="cuda")
    cfg = cfg_of(128, 0.1, "pwt")
    _check(q, k, v, cfg, monkeypatch)
    monkeypatch.setenv("PSA_CUTE_PAIR", "1")
    assert rel(kc.forward(q, k, v, cfg), kt.forward(q, k, v, cfg)) <= 2e-3



def _share_check(q, k, v, cfg, monkeypatch, routing=None):
    """The pair kernel with the blocks both lists hold loaded once (PSA_CUTE_PAIR_SHARE, the split rings) against the
    same kernel with a pipeline per list: each query block computes the same tiles (shared ones first, so up to the
    rounding order, SHARE_TOL); and against the float64 reference under the same routing, no less accurate than the
    per-list pipelines."""
    from kernels import reference
    from kernels.routing import block_stats
    if routing is None:
        routing, ref = float64_reference(q, k, v, cfg)
    else:
        q64, k64, v64 = q.double(), k.double(), v.double()
        ref = reference.forward(q64, k64, v64, cfg, routing=routing, stats=block_stats(q64, k64, v64, cfg.block_size))
    monkeypatch.setenv("PSA_CUTE_PAIR_SHARE", "0")
    own = _run(q, k, v, cfg, routing, monkeypatch, True)
    monkeypatch.setenv("PSA_CUTE_PAIR_SHARE", "1")
    shared = _run(q, k, v, cfg, routing, monkeypatch, True)
    assert torch.isfinite(shared).all()
    assert rel(shared, own) <= SHARE_TOL, f"shared vs own exact pipelines: rel L2 {rel(shared, own):.2e}"
    e_sh, e_own = rel(shared, ref), rel(own, ref)
    assert e_sh <= REF_TOL, f"shared exact pipeline vs float64 reference: rel L2 {e_sh:.2e}"
    assert e_sh <= 1.25 * e_own + 1e-4, f"shared {e_sh:.2e} vs own {e_own:.2e} from the float64 reference"


@pytest.mark.parametrize("variant", ["pwt", "pisa"])
@pytest.mark.parametrize("shape", [(1, 2, 1000, 128), (1, 2, 936, 128), (2, 2, 4033, 128), (1, 1, 64, 128),
                                   (1, 8, 4096, 128)], ids=lambda s: "B{}_H{}_T{}_D{}".format(*s))
def test_pair_shared_exact_tiles(variant, shape, monkeypatch):
    q, k, v = (rnd(shape, seed=100 + s) for s in range(3))
    _share_check(q, k, v, cfg_of(128, 0.125, variant), monkeypatch)


def test_pair_shared_exact_tiles_dit_like_band_zero_sinks_density_one(monkeypatch):
    from kernels.synthetic import dit_like_qkv
    q, k, v = dit_like_qkv((4, 32, 32), heads=2, head_dim=128, dtype=torch.bfloat16, device="cuda")
    _share_check(q, k, v, cfg_of(128, 0.1, "pwt"), monkeypatch)  # adjacent lists overlap most
    q, k, v = (rnd((2, 2, 4033, 128), seed=105 + s) for s in range(3))
    _share_check(q, k, v, cfg_of(128, 0.2, "pwt", band=0, sinks=1), monkeypatch)
    _share_check(q, k, v, cfg_of(128, 1.0, "pwt"), monkeypatch)  # no virtual tiles, identical full lists


# crafted lists for the 16 query blocks of T 1000 (query block i: even / odd): disjoint, identical, one empty, unequal
# lengths, the partial last block 15 shared or not (written for the sorted merge's gaps, at and above its hold-over
# limit). The split rings (session 32) add: every block shared, wrapping both rings 4 times in the shared phase; an odd
# number shared (3: ring 0 takes 2, ring 1 one) with unequal own tails; one shared block, then own ones
CRAFTED = {
    "disjoint": (lambda i: range(0, 6), lambda i: range(10, 16)),
    "identical": (lambda i: (0, 3, 7, 15), lambda i: (0, 3, 7, 15)),
    "gap_3_then_4": (lambda i: (0, 4, 9), lambda i: (1, 2, 3, 5, 6, 7, 8)),
    "long_gap": (lambda i: (0, 8, 9), lambda i: range(1, 8)),
    "interleaved": (lambda i: range(0, 16, 2), lambda i: range(1, 16, 2)),
    "one_list_empty": (lambda i: range(0, 8), lambda i: ()),
    "shifted": (lambda i: (i, (i + 5) % 16), lambda i: (i, (i + 9) % 16, (i + 11) % 16)),
    "all_shared_long": (lambda i: range(0, 16), lambda i: range(0, 16)),
    "three_shared_unequal_tails": (lambda i: (0, 1, 2, 4, 6, 8, 10, 12, 14, 15), lambda i: (0, 1, 2, 3)),
    "one_shared": (lambda i: (5, 6, 7, 8, 9), lambda i: (5, 10, 11, 12, 13, 14, 15)),
}


def _crafted_routing(case, q, k, v, cfg):
    """The float64 reference's routing with CRAFTED[case]'s lists (even / odd query blocks), -1 padded."""
    from kernels.routing import Routing
    r, _ = float64_reference(q, k, v, cfg)
    B, H, N, _ = r.exact.shape
    even, odd = CRAFTED[case]
    lists = [sorted(set((odd if i % 2 else even)(i))) for i in range(N)]
    idx = torch.full((B, H, N, max(len(x) for x in lists) or 1), -1, dtype=torch.int32)
    exact = torch.zeros(B, H, N, N, dtype=torch.bool)
    for i, x in enumerate(lists):
        idx[:, :, i, :len(x)] = torch.tensor(x, dtype=torch.int32)
        exact[:, :, i, list(x)] = True
    dev = r.exact.device
    return Routing(idx=idx.to(dev), exact=exact.to(dev), w=r.w)


@pytest.mark.parametrize("variant", ["pwt", "pisa"])
@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_pair_shared_exact_tiles_crafted_lists(case, variant, monkeypatch):
    q, k, v = (rnd((1, 2, 1000, 128), seed=108 + s) for s in range(3))
    cfg = cfg_of(128, 0.125, variant)
    _share_check(q, k, v, cfg, monkeypatch, _crafted_routing(case, q, k, v, cfg))


@pytest.mark.parametrize("share", ["0", "1"], ids=["own", "share"])
def test_pair_on_the_morton_path_as_the_node_calls_it(share, monkeypatch):
    # the node's call (Morton, [B, L, H, D] memory, block-order copies, the output over the q copy and scattered
    # back) with the pair kernel forced on, own and shared exact pipelines: the answer of gathering first and
    # scattering after with the one-block kernel
    import math
    from gpu_common import MORTON_BHD, MORTON_GRID, MORTON_PREFIX, node_layout_qkv
    from kernels import cute as kc
    from kernels import piecewise_sparse_attention as psa
    from kernels.reorder import orders_on
    grid, npre, (B, H, D) = MORTON_GRID, MORTON_PREFIX, MORTON_BHD
    q, k, v = node_layout_qkv(B, npre + math.prod(grid), H, D, seed=110)
    perm, _ = orders_on(grid, "cuda")
    monkeypatch.setenv("PSA_CUTE_PAIR", "0")
    sep = kc.scatter_tokens(kc.forward(*(kc.gather_tokens(x, perm, npre) for x in (q, k, v)), cfg_of(D, 0.125, "pwt")),
                            perm, npre)
    monkeypatch.setenv("PSA_CUTE_PAIR", "1")
    monkeypatch.setenv("PSA_CUTE_PAIR_SHARE", share)
    out = psa(q, k, v, density=0.125, variant="pwt", reorder="morton", grid=grid, n_prefix=npre, backend="cute",
              on_failure="raise")
    assert torch.isfinite(out).all()
    # the pair kernel's reciprocal epilogue: a bf16 unit here and there; the shared tiles' order: SHARE_TOL
    assert rel(out, sep) <= (1e-3 if share == "0" else SHARE_TOL)


@pytest.mark.parametrize("shape", [(1, 2, 1000, 128), (2, 2, 4033, 128)], ids=lambda s: "B{}_H{}_T{}_D{}".format(*s))
def test_pair_reciprocal_epilogue(shape, monkeypatch):
    # PSA_CUTE_RECIP_STORE (on by default): the output rows times 1 / row sum; the last bit of a float32 quotient
    # may differ, so a bf16 output element now and then by one unit
    q, k, v = (rnd(shape, seed=115 + s) for s in range(3))
    cfg = cfg_of(128, 0.125, "pwt")
    r, ref = float64_reference(q, k, v, cfg)
    div, mul = _switched(q, k, v, cfg, r, monkeypatch, "PSA_CUTE_RECIP_STORE")
    assert torch.isfinite(mul).all()
    assert rel(mul, div) <= 1e-3 and rel(mul, ref) <= REF_TOL


def test_pair_shared_exact_tiles_fall_back_above_the_shared_list_size(monkeypatch):
    # lists longer than fwd.PAIR_SHARE_MAX_SEL (the kernel's shared-memory copy of both lists) keep the own-list
    # pipelines even when the shared one is asked for: 600 blocks at density 0.5 -> 300 routed blocks per list
    from kernels.cute import fwd as CF
    q, k, v = (rnd((1, 1, 600 * 64, 128), seed=120 + s) for s in range(3))
    cfg = cfg_of(128, 0.5, "pwt")
    from kernels.routing import block_stats, route
    r = route(block_stats(q, k, v, cfg.block_size), cfg)  # (the routing only: no float64 reference at T 38400)
    assert r.idx.shape[-1] > CF.PAIR_SHARE_MAX_SEL
    monkeypatch.setenv("PSA_CUTE_PAIR_SHARE", "0")
    own = _run(q, k, v, cfg, r, monkeypatch, True)
    monkeypatch.setenv("PSA_CUTE_PAIR_SHARE", "1")
    before = set(CF._compiled)  # (the cache is the process's: earlier tests in this worker may hold shared builds)
    asked = _run(q, k, v, cfg, r, monkeypatch, True)
    assert torch.equal(asked, own)
    new = [b for b in (dict(zip(CF.KEY_FIELDS, key)) for key in set(CF._compiled) - before)
           if b["vt_stages"] and b["share"]]
    assert not new, new  # no shared build compiled for this call


def _node_morton_call(seed, monkeypatch):
    """(q, call): the node's Morton call on the pair kernel at a Wan-like odd grid ([B, L, H, D] memory, a prefix, B
    2), CUDA graphs off; call() runs it with the environment as set at that moment."""
    import math
    from gpu_common import MORTON_BHD, MORTON_GRID, MORTON_PREFIX, node_layout_qkv
    from kernels import piecewise_sparse_attention as psa
    grid, npre, (B, H, D) = MORTON_GRID, MORTON_PREFIX, MORTON_BHD
    q, k, v = node_layout_qkv(B, npre + math.prod(grid), H, D, seed=seed)
    monkeypatch.setenv("PSA_CUDA_GRAPHS", "0")
    monkeypatch.setenv("PSA_CUTE_PAIR", "1")
    return q, lambda: psa(q, k, v, density=0.125, variant="pwt", reorder="morton", grid=grid, n_prefix=npre,
                          backend="cute", on_failure="raise")


@pytest.mark.parametrize("share", ["0", "1"], ids=["own", "share"])
def test_pair_reads_the_query_rows_through_the_permutation(share, monkeypatch):
    # PSA_CUTE_PAIR_Q_PERM (fwd_pair.py q_perm): the node's Morton call with the pair kernel reading the caller's
    # query rows through the permutation and writing the output through it (only k and v copied, no scatter):
    # the same tiles in the same order as the block-order copies, so the same output
    from kernels.cute import fwd as CF
    q, call = _node_morton_call(112, monkeypatch)
    monkeypatch.setenv("PSA_CUTE_PAIR_SHARE", share)
    monkeypatch.setenv("PSA_CUTE_PAIR_Q_PERM", "0")
    base = call()
    monkeypatch.setenv("PSA_CUTE_PAIR_Q_PERM", "1")
    assert CF.q_perm_enabled(q.shape[2], "pwt")
    out = call()
    assert torch.isfinite(out).all() and out.stride() == base.stride()
    assert rel(out, base) <= 1e-5, rel(out, base)
    # the pair build with q_perm ran
    assert any(b["vt_stages"] and b["q_perm"] for b in CF.compiled_builds()), CF.compiled_builds()


@pytest.mark.parametrize("share", ["0", "1"], ids=["own", "share"])
def test_pair_writes_the_output_rows_through_the_permutation(share, monkeypatch):
    # PSA_CUTE_PAIR_OUT_PERM (fwd_pair.py out_perm, session 22): the node's Morton call with q, k and
    # v from their block-order copies and the output rows written through the permutation straight into the
    # caller's layout, so no scatter pass runs; the same tiles in the same order as with the scatter, so the same
    # output
    from kernels import triton as kt_mod
    from kernels.cute import fwd as CF
    q, call = _node_morton_call(113, monkeypatch)
    monkeypatch.setenv("PSA_CUTE_PAIR_SHARE", share)
    monkeypatch.setenv("PSA_CUTE_PAIR_Q_PERM", "0")
    monkeypatch.setenv("PSA_CUTE_PAIR_OUT_PERM", "0")
    base = call()
    monkeypatch.setenv("PSA_CUTE_PAIR_OUT_PERM", "1")
    assert CF.out_perm_enabled(q.shape[2], "pwt") and not CF.out_perm_enabled()
    scatters = []
    real_scatter = kt_mod._scatter_into
    monkeypatch.setattr(kt_mod, "_scatter_into", lambda x, *a: scatters.append(x.shape[1]) or real_scatter(x, *a))
    out = call()
    assert scatters == [], scatters
    assert torch.isfinite(out).all() and out.stride() == base.stride()
    assert rel(out, base) <= 1e-5, rel(out, base)
    # the pair build (shared virtual stages) with the output permutation and without q_perm ran
    assert any(b["out_perm"] and b["vt_stages"] and not b["q_perm"] for b in CF.compiled_builds())


# PSA_CUTE_TMA_STORE (fwd_pair.py tma_store, pair_sched._store_tile_tma, session 22): the epilogue through the
# consumer's query stage and one TMA store of whole rows. The same values (the same reciprocal or division and the
# same rounding to bf16), so bitwise the per-element stores' output: an odd last query block (stored by one
# consumer), a partial last block (rows past T clipped by the tensor map), both epilogues, pisa and pwt
@pytest.mark.parametrize("variant", ["pwt", "pisa"])
@pytest.mark.parametrize("T, recip", [(9000, "1"), (8256, "0"), (12288, "1")])
def test_pair_tma_store_epilogue(variant, T, recip, monkeypatch):
    q, k, v = (rnd((1, 2, T, 128), seed=150 + s) for s in range(3))
    cfg = cfg_of(128, 0.125, variant)
    monkeypatch.setenv("PSA_CUTE_RECIP_STORE", recip)
    r, _ = float64_reference(q, k, v, cfg)
    base, tma = _switched(q, k, v, cfg, r, monkeypatch, "PSA_CUTE_TMA_STORE")
    assert torch.isfinite(tma).all()
    assert torch.equal(base, tma), rel(tma, base)


def _node_call_switched(env, pair, T, seed, monkeypatch, **kw):
    """(q, [output with `env` at 0, at 1]) of the node's call without Morton: the output in the caller's [B, L, H, D]
    memory (a row every H * D elements), B = 2, H = 3, CUDA graphs off, the pair kernel forced on or off."""
    from gpu_common import node_layout_qkv
    from kernels import piecewise_sparse_attention as psa
    q, k, v = node_layout_qkv(2, T, 3, 128, seed=seed)
    monkeypatch.setenv("PSA_CUDA_GRAPHS", "0")
    monkeypatch.setenv("PSA_CUTE_PAIR", pair)
    outs = []
    for val in ("0", "1"):
        monkeypatch.setenv(env, val)
        outs.append(psa(q, k, v, backend="cute", on_failure="raise", **kw))
    return q, outs


def test_pair_tma_store_into_the_node_layout(monkeypatch):
    # the node's call without Morton into the caller's layout, an odd block count with a partial last block
    from kernels.cute import fwd as CF
    q, outs = _node_call_switched("PSA_CUTE_TMA_STORE", "1", 64 * 130 + 17, 160, monkeypatch, density=0.125,
                                  variant="pwt")
    assert outs[0].stride() == outs[1].stride() == q.stride()
    assert torch.isfinite(outs[1]).all()
    assert torch.equal(outs[0], outs[1]), rel(outs[1], outs[0])
    assert any(b["tma_store"] for b in CF.compiled_builds()), CF.compiled_builds()  # the tma_store build ran


@pytest.mark.parametrize("variant", ["pwt", "drop"])
def test_one_block_tma_store_epilogue(variant, monkeypatch):
    # PSA_CUTE_TMA_STORE_ONE (fwd.py tma_store, session 22; built after the device time, off until timed): the
    # one-block kernel's epilogue through its query stage and one TMA store, bitwise the per-element stores' output
    # (a partial last block, the node's [B, L, H, D] output, B = 2)
    q, outs = _node_call_switched("PSA_CUTE_TMA_STORE_ONE", "0", 64 * 37 + 17, 170, monkeypatch, density=0.25,
                                  variant=variant)
    assert torch.isfinite(outs[1]).all() and outs[1].stride() == q.stride()
    assert torch.equal(outs[0], outs[1]), rel(outs[1], outs[0])


# PSA_CUTE_VT_PEEL: every virtual tile but the last as whole blocks (log2(64) in the bias, no counts), the last one
# after the loop as before. T 8256: 129 blocks (the last tile holds one whole block), 9000: 141 (the last block 40
# tokens), 12288: 192 (three tiles of whole blocks); density 0.5: most columns of a tile exact (-inf in the bias)
@pytest.mark.parametrize("variant", ["pwt", "pisa"])
@pytest.mark.parametrize("T, density", [(8256, 0.125), (9000, 0.125), (12288, 0.125), (9000, 0.5)])
def test_pair_peeled_virtual_loop(variant, T, density, monkeypatch):
    q, k, v = (rnd((1, 2, T, 128), seed=140 + s) for s in range(3))
    cfg = cfg_of(128, density, variant)
    monkeypatch.setenv("PSA_CUTE_RECIP_STORE", "0")
    monkeypatch.setenv("PSA_CUTE_S_AHEAD_VT", "0")  # (it replaces the peel where on, as by default)
    r, ref = float64_reference(q, k, v, cfg)
    base, peel = _switched(q, k, v, cfg, r, monkeypatch, "PSA_CUTE_VT_PEEL")
    assert torch.isfinite(peel).all()
    # the same terms; only the rounding of log2(64) in the exponent and of the first-order weight differ, which
    # moves some bf16 outputs by one unit (the H200 measured 1.9e-3 rel L2 between the two): within half an ulp's
    # rel L2, and no further from float64 than the plain loop
    assert rel(peel, base) <= ROUNDING[q.dtype], f"peeled vs plain virtual loop: rel L2 {rel(peel, base):.2e}"
    assert rel(peel, ref) <= max(1.05 * rel(base, ref), 1e-4), (rel(peel, ref), rel(base, ref))
    assert rel(peel, ref) <= REF_TOL, f"peeled virtual loop vs float64 reference: rel L2 {rel(peel, ref):.2e}"


# PSA_CUTE_PINGPONG: the two consumers issue their GEMMs in turn (named barriers; fwd_pair.py _turn). Scheduling only:
# every query block's arithmetic is unchanged, so the outputs are equal to the build without it. The cases that could
# hang a wrong protocol: lists of unequal length (crafted: disjoint, a long gap, one list empty, -1 padding), an odd
# last query block (both consumers on one block), one block in all, band 0 + sinks, no virtual tiles (density 1), the
# peeled virtual loop and the Morton path's q_perm build
def _pingpong_equal(q, k, v, cfg, routing, monkeypatch, ref=None):
    # (S_AHEAD_VT, on by default, is left out of the ping-pong build: compare with the plain consumers' plain loop)
    monkeypatch.setenv("PSA_CUTE_S_AHEAD_VT", "0")
    base, pp = _switched(q, k, v, cfg, routing, monkeypatch, "PSA_CUTE_PINGPONG")
    assert torch.isfinite(pp).all()
    assert torch.equal(pp, base), f"ping-pong vs plain consumers: rel L2 {rel(pp, base):.2e}"
    if ref is not None:
        assert rel(pp, ref) <= REF_TOL, f"ping-pong vs float64 reference: rel L2 {rel(pp, ref):.2e}"


def _crafted_case(case, seed):
    """(q, k, v, cfg, routing): pwt d 0.125 at T 1000 under CRAFTED[case]'s lists."""
    q, k, v = (rnd((1, 2, 1000, 128), seed=seed + s) for s in range(3))
    cfg = cfg_of(128, 0.125, "pwt")
    return q, k, v, cfg, _crafted_routing(case, q, k, v, cfg)


@pytest.mark.parametrize("case", ["disjoint", "long_gap", "one_list_empty", "shifted"])
def test_pair_pingpong_crafted_unequal_lists(case, monkeypatch):
    _pingpong_equal(*_crafted_case(case, 180), monkeypatch)


@pytest.mark.parametrize("shape, density, band, sinks", [
    ((1, 2, 936, 128), 0.125, 1, 0), ((2, 2, 4033, 128), 0.2, 0, 1), ((1, 1, 64, 128), 0.125, 1, 0),
    ((1, 2, 936, 128), 1.0, 1, 0), ((1, 8, 9000, 128), 0.125, 1, 0)], ids=["odd", "band0_sinks", "one_block",
                                                                           "no_virtual", "T9000"])
def test_pair_pingpong_equals_the_plain_consumers(shape, density, band, sinks, monkeypatch):
    q, k, v = (rnd(shape, seed=184 + s) for s in range(3))
    cfg = cfg_of(128, density, "pwt", band=band, sinks=sinks)
    r, ref = float64_reference(q, k, v, cfg)
    _pingpong_equal(q, k, v, cfg, r, monkeypatch, ref)
    monkeypatch.setenv("PSA_CUTE_VT_PEEL", "1")  # with the peeled virtual loop: the same against the peel alone
    _pingpong_equal(q, k, v, cfg, r, monkeypatch, ref)


def test_pair_pingpong_on_the_morton_path_as_the_node_calls_it(monkeypatch):
    _, call = _node_morton_call(188, monkeypatch)
    outs = {}
    for qp in ("0", "1"):  # the block-order q copy, then the query rows read through the permutation
        monkeypatch.setenv("PSA_CUTE_PAIR_Q_PERM", qp)
        for val in ("0", "1"):
            monkeypatch.setenv("PSA_CUTE_PINGPONG", val)
            outs[qp, val] = call()
        assert torch.equal(outs[qp, "1"], outs[qp, "0"]), qp


# PSA_CUTE_TREE_MAX / PSA_CUTE_TREE_SUM (tile_ops._tree, both CuTe kernels): the row max and row sum of each tile in
# pairs instead of dependent chains. The max is exact in any order, so the outputs are equal to the chain's; the sum
# rounds in another order, so it stays within half a bfloat16 ulp of the chain's output and within the reference's
# tolerance. The pair build (pwt, pisa), the one-block build (PSA_CUTE_PAIR=0) and drop, an odd last block, band 0 +
# sinks, no virtual tiles, and large logits (the running max moves on most tiles)
@pytest.mark.parametrize("variant, shape, density, band, sinks, pair", [
    ("pwt", (1, 2, 936, 128), 0.125, 1, 0, True), ("pisa", (2, 2, 4033, 128), 0.2, 0, 1, True),
    ("pwt", (1, 2, 936, 128), 1.0, 1, 0, True), ("pwt", (1, 8, 9000, 128), 0.125, 1, 0, True),
    ("pwt", (1, 2, 1000, 128), 0.125, 1, 0, False), ("drop", (1, 2, 1000, 128), 0.125, 1, 0, False),
    ("drop", (2, 2, 4033, 128), 0.2, 0, 1, False)],
    ids=["pwt_odd", "pisa_band0_sinks", "no_virtual", "T9000", "one_block_pwt", "drop", "drop_band0_sinks"])
@pytest.mark.parametrize("scale", [1.0, 8.0])
def test_tree_reductions_match_the_chains(variant, shape, density, band, sinks, pair, scale, monkeypatch):
    q, k, v = (rnd(shape, seed=190 + s) for s in range(3))
    q = (q.float() * scale).to(q.dtype)
    cfg = cfg_of(128, density, variant, band=band, sinks=sinks)
    r, ref = float64_reference(q, k, v, cfg)
    monkeypatch.setenv("PSA_CUTE_TREE_SUM", "0")
    base, tmax = (_run_switch(q, k, v, cfg, r, monkeypatch, pair, "PSA_CUTE_TREE_MAX", val) for val in ("0", "1"))
    assert torch.isfinite(tmax).all()
    assert torch.equal(tmax, base), f"tree max vs chained max: rel L2 {rel(tmax, base):.2e}"
    tsum = _run_switch(q, k, v, cfg, r, monkeypatch, pair, "PSA_CUTE_TREE_SUM", "1")  # on top of the tree max
    assert torch.isfinite(tsum).all()
    d = float((tsum.float() - base.float()).abs().max() / base.float().abs().max().clamp_min(1e-30))
    assert d <= ROUNDING[torch.bfloat16] * 2, f"tree sum vs chained sum: max diff {d:.2e} of the largest output"
    assert rel(tsum, ref) <= REF_TOL, f"tree sum vs float64 reference: rel L2 {rel(tsum, ref):.2e}"


def _run_switch(q, k, v, cfg, routing, monkeypatch, pair, env, val):
    monkeypatch.setenv(env, val)
    return _run(q, k, v, cfg, routing, monkeypatch, pair)


# PSA_CUTE_PV_FENCE / PSA_CUTE_PV_FENCE_VT (tile_ops._pv_wait: a CTA fence keeps ptxas from hoisting the P V wait
# above the softmax; PV_FENCE shipped since session 19), PSA_CUTE_PV_PIN (those fences under a row-sum test that
# never holds, session 19; with PV_FENCE, as it only changes fenced waits) and PSA_CUTE_S_AHEAD (pair_sched.
# _ahead_exact: S of tile u issued before the softmax of u - 1, its waits always pinned; PSA_CUTE_S_AHEAD_VT the same
# for the virtual tiles, session 20, left out where S_AHEAD is on): scheduling only, the same
# operations per tile, so the outputs equal the build without any of them. Lists of 0, 1, 2 and many exact tiles
# (crafted, one block, two blocks, band 0 + sinks), an odd last block, no virtual tiles, the one-block kernel and
# drop (PV_FENCE, PV_PIN), and the node's Morton call
_SCHED = ["PSA_CUTE_PV_FENCE", "PSA_CUTE_PV_FENCE_VT", "PSA_CUTE_S_AHEAD", "PSA_CUTE_PV_PIN", "PSA_CUTE_S_AHEAD_VT"]
_ARMS = [("PSA_CUTE_PV_FENCE",), ("PSA_CUTE_PV_FENCE", "PSA_CUTE_PV_PIN"), ("PSA_CUTE_PV_FENCE_VT",),
         ("PSA_CUTE_S_AHEAD",), ("PSA_CUTE_S_AHEAD_VT",)]


def _sched_equal(q, k, v, cfg, routing, monkeypatch, pair=True, ref=None):
    for env in _SCHED:
        monkeypatch.setenv(env, "0")
    base = _run(q, k, v, cfg, routing, monkeypatch, pair)
    for arm in _ARMS if pair else _ARMS[:2]:  # each arm alone
        for env in _SCHED:
            monkeypatch.setenv(env, "1" if env in arm else "0")
        out = _run(q, k, v, cfg, routing, monkeypatch, pair)
        assert torch.isfinite(out).all(), arm
        assert torch.equal(out, base), f"{arm} vs the build without them: rel L2 {rel(out, base):.2e}"
    if pair:  # all at once
        for env in _SCHED:
            monkeypatch.setenv(env, "1")
        out = _run(q, k, v, cfg, routing, monkeypatch, pair)
        assert torch.equal(out, base), f"all of {_SCHED} vs the build without them: rel L2 {rel(out, base):.2e}"
    if ref is not None:
        assert rel(base, ref) <= REF_TOL


@pytest.mark.parametrize("case", ["disjoint", "long_gap", "one_list_empty", "shifted"])
def test_sched_switches_crafted_lists(case, monkeypatch):
    _sched_equal(*_crafted_case(case, 200), monkeypatch)


@pytest.mark.parametrize("variant, shape, density, band, sinks, pair", [
    ("pwt", (1, 2, 936, 128), 0.125, 1, 0, True), ("pisa", (2, 2, 4033, 128), 0.2, 0, 1, True),
    ("pwt", (1, 1, 64, 128), 0.125, 1, 0, True), ("pwt", (1, 2, 128, 128), 0.5, 0, 0, True),
    ("pwt", (1, 2, 936, 128), 1.0, 1, 0, True), ("pwt", (1, 8, 9000, 128), 0.125, 1, 0, True),
    ("pwt", (1, 2, 1000, 128), 0.125, 1, 0, False), ("drop", (2, 2, 4033, 128), 0.2, 0, 1, False)],
    ids=["odd", "pisa_band0_sinks", "one_block", "two_blocks", "no_virtual", "T9000", "one_block_kernel", "drop"])
def test_sched_switches_equal_the_default_build(variant, shape, density, band, sinks, pair, monkeypatch):
    q, k, v = (rnd(shape, seed=204 + s) for s in range(3))
    cfg = cfg_of(128, density, variant, band=band, sinks=sinks)
    r, ref = float64_reference(q, k, v, cfg)
    _sched_equal(q, k, v, cfg, r, monkeypatch, pair, ref)


def test_sched_switches_on_the_morton_path_as_the_node_calls_it(monkeypatch):
    _, call = _node_morton_call(208, monkeypatch)
    for env in _SCHED:
        monkeypatch.setenv(env, "0")
    base = call()
    for env in _SCHED:
        monkeypatch.setenv(env, "1")
    assert torch.equal(call(), base)


# PSA_CUTE_S_AHEAD_VT (pair_sched._ahead_virtual, session 20): the virtual loop with S of tile t issued before the
# softmax of t - 1 and four shared stages: scheduling only (also in _SCHED above), bitwise the plain loop's output.
# Virtual tiles: 1 (936: not entered), 2 (5000: no loop step), 3 (9000: one step, the last block 40 tokens), 5
# (20000: three steps); band 0 + sinks; dense lists; no virtual tiles; with the pins on it; and against float64
@pytest.mark.parametrize("variant, shape, density, band, sinks", [
    ("pwt", (1, 2, 936, 128), 0.125, 1, 0), ("pwt", (1, 2, 5000, 128), 0.125, 1, 0),
    ("pwt", (1, 2, 9000, 128), 0.125, 1, 0), ("pwt", (1, 2, 20000, 128), 0.125, 1, 0),
    ("pisa", (2, 2, 9000, 128), 0.2, 0, 1), ("pwt", (1, 2, 9000, 128), 0.5, 1, 0),
    ("pwt", (1, 2, 936, 128), 1.0, 1, 0)],
    ids=["one_tile", "two_tiles", "three_tiles", "five_tiles", "pisa_band0_sinks", "dense_lists", "no_virtual"])
def test_s_ahead_vt_equals_the_plain_loop(variant, shape, density, band, sinks, monkeypatch):
    q, k, v = (rnd(shape, seed=212 + s) for s in range(3))
    cfg = cfg_of(128, density, variant, band=band, sinks=sinks)
    r, ref = float64_reference(q, k, v, cfg)
    for env in _SCHED + ["PSA_CUTE_VT_PEEL"]:
        monkeypatch.setenv(env, "0")
    base = _run(q, k, v, cfg, r, monkeypatch, True)
    monkeypatch.setenv("PSA_CUTE_S_AHEAD_VT", "1")
    out = _run(q, k, v, cfg, r, monkeypatch, True)
    assert torch.isfinite(out).all()
    assert torch.equal(out, base), f"S_AHEAD_VT vs the plain virtual loop: rel L2 {rel(out, base):.2e}"
    for env in ("PSA_CUTE_PV_FENCE", "PSA_CUTE_PV_PIN", "PSA_CUTE_PV_FENCE_VT"):  # stacked
        monkeypatch.setenv(env, "1")
    assert torch.equal(_run(q, k, v, cfg, r, monkeypatch, True), base)
    assert rel(out, ref) <= REF_TOL, f"S_AHEAD_VT vs float64 reference: rel L2 {rel(out, ref):.2e}"


# PSA_CUTE_PAIR_DROP (session 20): drop through the pair build with no virtual tiles (the "novt" kernel the probes
# time), so that its schedules (S_AHEAD) reach the exact part. With the epilogue dividing (RECIP_STORE=0) it performs
# the one-block kernel's operations: its output within SAME_TOL of that kernel's, and S_AHEAD on top of it bitwise the
# same (scheduling only). Odd last block, band 0 + sinks, one block, many CTAs, density 1 (every block exact), crafted
# unequal lists
def _pair_drop_check(q, k, v, cfg, routing, monkeypatch, ref=None):
    for env in _SCHED:
        monkeypatch.setenv(env, "0")
    monkeypatch.setenv("PSA_CUTE_RECIP_STORE", "0")
    monkeypatch.setenv("PSA_CUTE_PAIR_DROP", "0")
    one = _run(q, k, v, cfg, routing, monkeypatch, False)
    monkeypatch.setenv("PSA_CUTE_PAIR_DROP", "1")
    two = _run(q, k, v, cfg, routing, monkeypatch, True)
    from kernels.cute import fwd as CF
    # the pair build ran drop
    assert any(b["vt_stages"] and not b["approx"] for b in CF.compiled_builds()), CF.compiled_builds()
    assert torch.isfinite(two).all()
    assert rel(two, one) <= SAME_TOL, f"pair drop vs one-block drop: rel L2 {rel(two, one):.2e}"
    monkeypatch.setenv("PSA_CUTE_S_AHEAD", "1")
    assert torch.equal(_run(q, k, v, cfg, routing, monkeypatch, True), two)
    if ref is not None:
        assert rel(two, ref) <= REF_TOL, f"pair drop vs float64 reference: rel L2 {rel(two, ref):.2e}"


@pytest.mark.parametrize("shape, density, band, sinks", [
    ((1, 2, 936, 128), 0.125, 1, 0), ((2, 2, 4033, 128), 0.2, 0, 1), ((1, 1, 64, 128), 0.125, 1, 0),
    ((1, 8, 9000, 128), 0.125, 1, 0), ((1, 2, 936, 128), 1.0, 1, 0)],
    ids=["odd", "band0_sinks", "one_block", "T9000", "dense"])
def test_pair_drop_matches_the_one_block_drop(shape, density, band, sinks, monkeypatch):
    q, k, v = (rnd(shape, seed=220 + s) for s in range(3))
    cfg = cfg_of(128, density, "drop", band=band, sinks=sinks)
    r, ref = float64_reference(q, k, v, cfg)
    _pair_drop_check(q, k, v, cfg, r, monkeypatch, ref)


@pytest.mark.parametrize("case", ["disjoint", "long_gap", "shifted"])  # (an empty list has no drop output)
def test_pair_drop_crafted_lists(case, monkeypatch):
    q, k, v, cfg, routing = _crafted_case(case, 224)
    _pair_drop_check(q, k, v, cfg_of(128, 0.125, "drop"), routing, monkeypatch)


# PSA_CUTE_BIAS_SLACK (fwd_pair.py bias_slack, session 26): the virtual tiles' bias loaded without clamping the column
# to the row, where route()'s bias has BS elements of storage past its end; the columns past a row's end are -inf'd
# as before, so the output is bitwise the clamped build's. The node's own routing (route(): the bias with its slack),
# partial last tiles (the very last row of the last head reads into the slack), odd block counts, batch 2, pisa / pwt
@pytest.mark.parametrize("variant", ["pwt", "pisa"])
@pytest.mark.parametrize("T", [9000, 4609, 33000])
def test_pair_bias_loads_unclamped(variant, T, monkeypatch):
    from kernels.cute import fwd as CF
    q, outs = _node_call_switched("PSA_CUTE_BIAS_SLACK", "1", T, 170, monkeypatch, density=0.125, variant=variant)
    assert any(b["bias_slack"] for b in CF.compiled_builds()), "the unclamped build never ran"
    assert torch.isfinite(outs[1]).all()
    assert torch.equal(outs[0], outs[1]), rel(outs[1], outs[0])

"""The CuTe-DSL kernel traces and compiles for sm_90a without a GPU (CI): a DSL error in kernels/cute/fwd.py is
caught here rather than on the first H200 run, and, where ptxas is installed, the consumer warpgroup fits the
launch bound (2 CTAs x 256 threads -> 128 registers; the pair build, kernels/cute/fwd_pair.py, one CTA x 384 threads ->
168) without spilling or any local memory. Runs in a subprocess
(tests/cute_compile_case.py). Skipped, with one line, when nvidia-cutlass-dsl is not installed."""
import importlib.util

import pytest
from driver import run_driver

FAMILIES = ["drop", "pisa/pwt", "drop q_rs", "pisa/pwt q_rs", "pisa/pwt q_rs bias_l2", "pisa/pwt q_rs bias_pf",
            "pisa/pwt q_rs bias_l2 bias_pf", "pisa/pwt q_rs out_perm", "drop q_rs out_perm", "pisa/pwt pair",
            "pisa/pwt pair recip", "pisa/pwt pair recip share", "pisa/pwt q_rs out_perm q_perm",
            "drop q_rs out_perm q_perm", "pisa/pwt pair recip q_perm", "pisa/pwt pair recip share q_perm",
            "pisa/pwt pair recip vt_peel", "pisa/pwt pair recip q_perm vt_peel", "pisa/pwt pair recip pingpong",
            "pisa/pwt pair recip q_perm pingpong", "pisa/pwt pair recip vt_peel pingpong",
            "drop q_rs tree", "pisa/pwt q_rs tree", "pisa/pwt pair recip tree",
            "pisa/pwt pair recip pv_fence s_ahead", "pisa/pwt pair recip q_perm s_ahead", "drop q_rs pv_fence",
            "pisa/pwt pair recip pv_fence", "pisa/pwt q_rs pv_fence", "pisa/pwt pair recip pv_pin", "drop q_rs pv_pin",
            "pisa/pwt pair recip pv_fence s_ahead_vt", "pisa/pwt pair recip q_perm pv_fence s_ahead_vt",
            "pisa/pwt pair recip pv_pin s_ahead_vt", "pisa/pwt pair recip out_perm pv_fence s_ahead_vt",
            "pisa/pwt pair recip tma_store pv_fence s_ahead_vt", "pisa/pwt q_rs pv_fence tma_store",
            "drop q_rs pv_fence tma_store", "pisa/pwt pair recip tma_store pv_fence s_ahead_vt bias_slack",
            "pisa/pwt pair recip share tma_store pv_fence s_ahead_vt",
            "pisa/pwt pair recip tma_store pv_fence s_ahead_vt cube",
            "pisa/pwt pair recip tma_store pv_fence s_ahead_vt cube qo"]
# builds with tile_ops._pv_wait's fence (PV_FENCE, shipped since session 19; PV_PIN; S_AHEAD's loop always pins it)
FENCED = [f for f in FAMILIES if "pv_fence" in f or "pv_pin" in f]

if importlib.util.find_spec("cutlass") is None:
    pytest.skip("CuTe compile test skipped: nvidia-cutlass-dsl is not installed (pip install .[cute])",
                allow_module_level=True)



@pytest.fixture(scope="module")
def res():
    return run_driver("cute_compile_case.py", env=dict(CUTE_DSL_ARCH="sm_90a"))


@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_compiles_for_sm90(res, family):
    assert res[family]["compiled"]


@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_fits_the_register_budget_without_spills(res, family):
    rec = res[family]
    if "registers" not in rec:
        pytest.skip("no ptxas (PATH or triton's bundled one): register/spill check skipped")
    assert rec["ptxas_rc"] == 0
    assert rec["registers"] is not None and rec["registers"] <= rec["register_bound"], rec
    assert rec["spill_bytes"] == 0, rec


@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_uses_no_local_memory(res, family):
    """Every per-row value is indexed by a compile-time slot: a runtime row index once put the row sums on the
    stack (48-80 bytes of local memory) and ncu measured the kernel 9% faster without it."""
    rec = res[family]
    if "stack_bytes" not in rec:
        pytest.skip("no ptxas (PATH or triton's bundled one): local-memory check skipped")
    assert rec["stack_bytes"] == 0, rec


@pytest.mark.parametrize("family", FAMILIES)
def test_wgmma_stays_asynchronous(res, family):
    """ptxas serialises every wgmma of a kernel when it cannot prove an accumulator untouched while a GEMM is in
    flight (it says so in a warning): the overlap of softmax and P V that the loop is built around would be gone."""
    rec = res[family]
    if "wgmma_serialized" not in rec:
        pytest.skip("no ptxas (PATH or triton's bundled one): wgmma check skipped")
    assert not rec["wgmma_serialized"], rec


@pytest.mark.parametrize("family", FAMILIES)
def test_shared_memory_fits_the_ctas_per_sm(res, family):
    """A CTA may have 227 KiB of shared memory on SM90, and an SM 228 KiB for all its CTAs with 1 KiB reserved per
    CTA: the one-block kernel runs 2 CTAs per SM (its 128-register bound), the pair kernel 1 (168). The pair build
    with S_AHEAD_VT's four shared stages takes 225 KiB (230400 bytes), the default pair build 209 KiB."""
    rec = res[family]
    if "smem_bytes" not in rec:
        pytest.skip("this cutlass-dsl exposes no traced shared-memory struct: check skipped")
    ctas = 2 if rec["register_bound"] == 128 else 1
    assert rec["smem_bytes"] <= 227 * 1024 and ctas * (rec["smem_bytes"] + 1024) <= 228 * 1024, (family, rec)


@pytest.mark.parametrize("family", FENCED)
def test_fenced_p_v_wait_stays_below_the_whole_softmax(res, family):
    """tile_ops._pv_wait: ptxas hoists the wait for the P V GEMM above the softmax's exponentials unless a fence
    stops it (session 18: P V then never overlaps the softmax; session 19 on the H200: with the fence the kernels
    are 3% faster at bitwise the same output). In the SASS of the DSL's own cubin every fenced wait must have a
    whole tile's exponentials (34 per thread) between the wait before it and itself."""
    rec = res[family]
    if "fenced_waits" not in rec:
        pytest.skip("no nvdisasm >= 12.9 (CUDA_HOME, PATH or triton's bundled one): SASS order check skipped")
    waits = rec["fenced_waits"]
    assert waits and min(w[0] for w in waits) >= 34, (family, waits)


@pytest.mark.parametrize("family", [f for f in FENCED if "s_ahead" in f])
def test_s_ahead_gemm_is_issued_above_the_softmax(res, family):
    """pair_sched._ahead_exact / _ahead_virtual: the S GEMM of tile u is issued before the softmax of tile u - 1 so
    that the two overlap. Session 20's first virtual build had ptxas run that softmax in the S accumulator's own
    registers and issue the GEMM after it (the loop then as serial as the plain one); its schedule since then
    spreads the GEMM's instructions through the softmax, the first ahead of every exponential. Every S-ahead loop's
    fenced wait must have a GEMM issued in its span with no exponential before the first instruction (one loop per
    switch: at least one such wait for s_ahead, one for s_ahead_vt)."""
    rec = res[family]
    if "fenced_waits" not in rec:
        pytest.skip("no nvdisasm >= 12.9: SASS order check skipped")
    ahead = [w for w in rec["fenced_waits"] if w[1] >= 0]
    assert len(ahead) >= family.split().count("s_ahead") + family.split().count("s_ahead_vt"), rec["fenced_waits"]
    assert all(w[1] == 0 for w in ahead), (family, rec["fenced_waits"])


def test_unfenced_build_has_no_fenced_wait(res):
    """The SASS reading above finds no fence where the build has none (the pair build without PV_FENCE)."""
    rec = res["pisa/pwt pair recip"]
    if "fenced_waits" not in rec:
        pytest.skip("no nvdisasm >= 12.9: SASS order check skipped")
    assert rec["fenced_waits"] == [], rec["fenced_waits"]


def test_s_ahead_vt_is_not_built_with_s_ahead():
    """Both S-ahead loops in one pair build spilled 232 bytes in its virtual loop (session 20, sm_90a): the pair
    kernel (and fwd.attention's key) leaves S_AHEAD_VT out when S_AHEAD is on."""
    from kernels.cute import fwd_pair as FP
    assert FP.PairFwdSm90(4, 4, s_ahead=True, s_ahead_vt=True).s_ahead_vt is False
    assert FP.PairFwdSm90(4, 4, s_ahead_vt=True).s_ahead_vt is True


def test_query_fragment_holds_column_pairs_of_one_row(res):
    """kernels/cute/tile_ops._load_q_rows (PSA_CUTE_Q_PERM) fills each register of the S GEMM's A fragment with one
    32-bit load: that needs elements 2e, 2e + 1 of every thread's fragment to be adjacent columns of one row."""
    r = res["q_fragment_pairs"]
    assert r["checked"] == 128 and r["bad"] == [], r


def test_shared_exact_tiles_wait_on_run_time_phases(res):
    """The shared exact tiles (fwd_pair share=True) are waited for on run-time barriers: the split rings
    (session 32, pair_sched._ring_pos) compute each tile's ring, stage and phase from the tile's rank, so even the
    first exact wait is on a run-time slot and parity, where the one-list build waits on slot 0, phase 0. The
    shared build therefore has exactly one constant-parity wait fewer; more would mean a wait whose phase stopped
    following the ring (session 9's first shared build kept a pipeline's state from before a dynamic loop, waited
    on slot 0, phase 0, a constant, and hung on the H200)."""
    for suffix in ("", " q_perm"):
        own, share = res["pisa/pwt pair recip" + suffix], res["pisa/pwt pair recip share" + suffix]
        assert "const_parity_waits" in own and "const_parity_waits" in share, (own, share)
        assert share["const_parity_waits"] == own["const_parity_waits"] - 1, (suffix, own, share)


def test_bias_slack_needs_contiguous_rows_with_bs_elements_after_them():
    """fwd._has_slack decides whether the pair kernel may load its bias unclamped (fwd.BIAS_SLACK): route()'s bias
    has BS elements of storage past its end, a plain tensor of the same shape does not, nor a strided view."""
    import torch
    from kernels.cute import fwd as F
    from kernels.triton.route import BIAS_SLACK
    n = 70
    routed = torch.empty(2 * 3 * n * n + BIAS_SLACK, dtype=torch.float16)[:2 * 3 * n * n].view(2, 3, n, n)
    assert BIAS_SLACK >= F.BS and F._has_slack(routed)
    assert not F._has_slack(torch.empty(2, 3, n, n, dtype=torch.float16))
    assert not F._has_slack(routed[:, :, :, : n - 1])  # strided
    assert F._has_slack(routed[:1])  # a leading batch slice: the rest of the storage follows it

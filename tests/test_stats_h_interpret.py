"""The one-pass statistics and H partials (kernels/triton/stats_h.py) on CPU under TRITON_INTERPRET=1 (tiny sizes):
equal to the two-pass kernels and to the float64 reference, for every dtype, variant, layout and program split,
with non-finite inputs poisoning only their own blocks. Cases: tests/stats_h_interp_cases.py (a subprocess).
The programs-per-head choice is plain Python and is checked here directly."""

import pytest
from driver import run_driver

pytest.importorskip("triton")

from kernels.triton import stats_h  # noqa: E402
from kernels.triton.stats_h import parts_per_head  # noqa: E402

TOL32 = 1e-5  # float32 arithmetic (the interpreter runs every dot in float32)
# the input-dtype outputs (k-bar and the value means rounded to bf16 / fp16) may differ by one rounding step when
# the two builds' float32 sums differ in the last bit
TOL_LP = {"float32": 1e-5, "bfloat16": 2 ** -7, "float16": 2 ** -10}


@pytest.fixture(scope="module")
def res():
    return run_driver("stats_h_interp_cases.py", env=dict(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES=""))


def get(res, name):
    r = res[name]
    assert "error" not in r, r.get("error")
    return r


def test_one_pass_statistics_equal_the_two_pass_kernels(res):
    r = get(res, "one_pass_equals_two_passes")
    assert len(r) == 17, sorted(r)
    for key, d in r.items():
        dt = key.split("_")[0]
        for f in ("kbar", "qbar", "q2", "ksig2", "hbar", "hnorm"):
            if f in d:
                assert d[f] <= TOL32, (key, f, d[f])
        for f in ("kbar_lp", "vmean_lp"):
            assert d[f] <= TOL_LP[dt], (key, f, d[f])
        if "gather" in key:
            assert d["copies_equal"] and d["copies_are_the_permuted_inputs"], key


def test_gather_from_copies_only_the_tail(res):
    # the statistics must not depend on which rows are copied: equal up to float32 summation order at most
    r = get(res, "gather_from_copies_only_the_tail")
    assert len(r) == 8, sorted(r)
    for key, d in r.items():
        assert d.pop("tails_are_the_permuted_rows"), key
        assert max(d.values()) <= TOL32, (key, d)


def test_programs_per_head_split_the_same_sum(res):
    r = get(res, "programs_per_head_split_the_same_sum")
    assert [r[f"P{p}"]["parts"] for p in (2, 3, 4)] == [2, 3, 3]
    for p in (2, 3, 4):
        assert max(v for k, v in r[f"P{p}"].items() if k != "parts") <= TOL32, r


def test_offset_keys_keep_hbar_and_sigma2_accurate(res):
    # H-bar comes from the raw sum of k v minus sum_j kbar_j (x) vsum_j: with |kbar| ~ 8 sigma_k both terms are
    # ~8x H-bar, so float32 rounding is ~8x TOL32 there (observed 1.4e-5); sigma^2 is centred and stays at TOL32
    r = get(res, "offset_keys_keep_hbar_and_sigma2_accurate")
    assert r["hbar_rel"] <= 8 * TOL32, r
    assert max(v for k, v in r.items() if k != "hbar_rel") <= TOL32, r


def test_non_finite_blocks_poison_only_themselves(res):
    r = get(res, "non_finite_blocks_drop_only_their_h")
    for p in ("P1", "P2"):
        d = r[p]
        assert d["hbar_finite"] and d["hbar_rel"] <= TOL32, d
        assert d["kbar_finite_per_block"] == [True, False, True, True, True], d
        assert d["vmean_finite_per_block"] == [True, True, True, False, True], d
        assert d["clean_head_ksig2_finite"], d


@pytest.mark.parametrize("n, bh, n_sm, expect", [
    (512, 40, 132, 13),  # Wan2.1-14B 480p: 520 programs of 40 blocks in 4 waves of 132 (98% full)
    (72, 24, 132, 5),    # FLUX.1 1024^2: 120 programs of 15 blocks, one wave
    (1, 1, 132, 1),
])
def test_parts_per_head_fill_the_last_wave(n, bh, n_sm, expect):
    p = parts_per_head(n, bh, n_sm, cps=1)
    assert p == expect
    g = -(-n // p)
    assert -(-n // g) == p  # every program holds at least one block


def test_parts_per_head_never_leaves_a_program_empty():
    for n in (1, 2, 7, 64, 100, 513, 1182, 4096, 16384):
        for bh in (1, 3, 24, 40, 80):
            p = parts_per_head(n, bh, 132, cps=1)
            g = -(-n // p)
            assert 1 <= p <= max(min(n, 32), -(-n // 128)) and -(-n // g) == p and (p - 1) * g < n, (n, bh, p)
            assert g <= 128, (n, bh, p)  # a program's value sums fit its [D, D] partial


@pytest.mark.parametrize("cap, deep", [((9, 0), True), ((8, 9), False), ((8, 0), False), ((10, 0), False)])
def test_the_permuted_loop_runs_deeper_on_sm90_only(cap, deep, monkeypatch):
    """PSA_STATS_PERM_DEEP: two more stages for the permuted statistics loop where it was timed (SM90); before Hopper
    that build needs 147 KB of shared memory (an RTX 4090 has 99 KB), elsewhere it is untimed; =0 turns it off; the
    raster loop and the CPU never change."""
    import torch
    monkeypatch.setattr(stats_h, "_INTERPRET", False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
    gpu, base, extra = torch.device("cuda", 0), stats_h.STATS_H_STAGES, stats_h.STATS_H_PERM_EXTRA
    monkeypatch.delenv("PSA_STATS_PERM_DEEP", raising=False)
    assert stats_h.loop_stages(True, gpu) == base + extra * deep
    assert stats_h.loop_stages(False, gpu) == base
    assert stats_h.loop_stages(True, torch.device("cpu")) == base
    monkeypatch.setenv("PSA_STATS_PERM_DEEP", "0")
    assert stats_h.loop_stages(True, gpu) == base


def test_redo_flagged_writes_only_the_flagged_programs(res):
    """stats_h.redo_flagged, the Gluon statistics kernels' fix-up for programs whose sums came out non-finite (run on
    the GPU only; here its Triton launch): the flagged program's statistics, partial and copies equal the normal
    launch's, every other program's outputs stay as they were."""
    r = get(res, "redo_flagged_programs_only")
    assert set(r) == {"raster", "gather"}
    for mode, d in r.items():
        assert all(d.values()), (mode, d)

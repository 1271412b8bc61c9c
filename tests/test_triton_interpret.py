"""The Triton kernels on CPU under TRITON_INTERPRET=1 (tiny sizes), against the float64 reference.

All cases run once, in a subprocess (tests/triton_interp_cases.py, the Morton ones in
tests/triton_interp_morton_cases.py): TRITON_INTERPRET must be set before
Triton is imported, and must not leak into the other test files of this session. float32 inputs: the
interpreter computes in numpy float32, so the kernels must match the float64 oracle to float32 rounding.
"""

import pytest
from driver import run_driver

pytest.importorskip("triton")

TOL32 = 1e-5  # float32 arithmetic against the float64 oracle (observed ~3e-7)


@pytest.fixture(scope="module")
def res():
    return run_driver("triton_interp_cases.py", env=dict(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES=""))


@pytest.fixture(scope="module")
def res_morton():
    return run_driver("triton_interp_morton_cases.py", env=dict(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES=""))


def get(res, name):
    r = res[name]
    assert "error" not in r, r.get("error")
    return r


@pytest.mark.parametrize("name", [
    "fp32_T200_D64_pwt", "fp32_T200_D64_pisa", "fp32_T200_D64_drop", "fp32_B2_T130_D128_pwt_sinks_band",
    "fp32_T200_D64_pisa_cov_bias", "fp32_T40_shorter_than_a_block"])
def test_kernel_equals_float64_reference_under_identical_routing(res, name):
    r = get(res, name)
    assert r["finite"] and r["shape_ok"] and r["dtype_ok"]
    assert r["rel"] <= TOL32


def test_other_tile_paths_blockn128_and_tma_equal_reference(res):
    r = get(res, "fp32_tiles_blockn128_and_tma")
    assert r["rel_blockn128"] <= TOL32 and r["rel_tma"] <= TOL32


def test_fp16_inputs_within_twice_torchs_own_fp16_error(res):
    r = get(res, "fp16_T200_D64_pwt")
    assert r["finite"] and r["dtype_ok"]
    assert r["rel"] <= 2 * r["torch_fp16_rel"] + 1e-4


def test_pwt_pisa_drop_equal_dense_attention_at_density_one(res):
    for variant, err in get(res, "density_one_equals_sdpa").items():
        assert err <= TOL32, variant


def test_own_statistics_and_routing_equal_kernels_routing(res):
    for variant, d in get(res, "own_routing_and_stats_equal_kernels_routing").items():
        assert d["idx_equal_lead"] and d["idx_equal_torch"] and d["exact_equal_lead"], variant
        assert d["drop_skips_values"], variant  # drop reads no values and builds no H-bar
        assert d["w_maxdiff"] <= 1e-5, variant
        for key in ("kbar", "qbar", "vmean", "ksig2", "q2"):
            if key in d:
                assert d[key] <= 1e-5, (variant, key, d[key])
        assert d["hbar_rel"] <= 1e-5, variant
        if "hnorm_rel" in d:
            assert d["hnorm_rel"] <= 1e-5, variant


def test_routing_ties_keep_the_lowest_block_ids(res):
    r = get(res, "routing_ties_keep_the_lowest_block_ids")
    assert r["size"] and r["forced"] and r["lowest"] and r["bias_marks_exact"], r


def test_morton_gather_scatter_and_fused_reorder(res_morton):
    r = get(res_morton, "morton_gather_scatter_and_fused_reorder")
    assert r["gather_equals_apply_reorder"] and r["scatter_undoes_gather"]
    assert r["fused_vs_separate_maxdiff"] <= 1e-5
    for var in ("pwt", "pisa", "drop"):
        assert r[f"{var}_stats_vs_separate"] <= 1e-5 and r[f"{var}_attention_vs_separate"] <= 1e-5, var
        assert r[f"{var}_stats_keeps_layout"], var


def test_morton_copies_only_k_v_in_head_chunks_under_their_budget(res_morton):
    """The Triton attention reads q and writes the output through the permutation: only k and v are copied
    (2 x q's bytes in one chunk, 1x with PSA_MORTON_SCRATCH=1 over 2 chunks, 0.5x over 4 with 0.25), the output
    lands in the caller's layout (its own 1x q, no block-order output, no scatter); an attention without a
    permutation (CuTe's) gets 3 copies and writes its block-order output over the q copy, scattered back once
    (one chunk: 3x q, the output allocated after) or per chunk (the copies budgeted at 1.5x the limits: 1.5x q
    over 2 chunks at PSA_MORTON_SCRATCH=1), or (PSA_CUTE_OUT_PERM) its output rows through the permutation into
    the caller's layout, no scatter; one that reads the caller's query rows through the permutation too
    (PSA_CUTE_Q_PERM) gets only the k, v copies, as the Triton attention; one without a permutation that can be
    asked to read q through it (PSA_MORTON_ROLL) gets only the k, v copies in head chunks too (its q copies in the
    output ahead of their chunk). Every one equals the separate passes."""
    r = get(res_morton, "morton_copies_chunked_under_their_budget")
    for var in ("pwt", "drop"):
        for frac, hc, allocs in (("0", 4, [1.0, 2.0]), ("1", 2, [1.0, 1.0]), ("0.25", 1, [0.5, 1.0])):
            d = r[f"{var}_frac{frac}"]
            assert d["maxdiff_vs_separate"] <= 1e-5 and d["keeps_layout"], (var, frac, d)
            assert d["allocs_in_q"] == allocs and (frac == "0" or d["hc"] == hc), (var, frac, d)
        for name in ("no_perm", "out_perm"):
            for frac, allocs in (("1", [1.0, 1.5]), ("0", [1.0, 3.0])):
                d = r[f"{var}_{name}_attention_frac{frac}"]
                assert d["maxdiff_vs_separate"] <= 1e-5 and d["allocs_in_q"] == allocs, (var, name, frac, d)
                assert d["keeps_layout"] or name == "no_perm", (var, name, frac, d)
        for frac, allocs in (("1", [1.0, 1.0]), ("0", [1.0, 2.0])):
            d = r[f"{var}_q_perm_attention_frac{frac}"]
            assert d["maxdiff_vs_separate"] <= 1e-5 and d["allocs_in_q"] == allocs and d["keeps_layout"], (var, d)
        # PSA_MORTON_ROLL: in head chunks the q copies go into the output (only the k, v copies: 2 x 2 / 4 heads,
        # 2 x 1 / 4), in one chunk the 3 copies as before; uneven chunks in either layout, either output layout
        for frac, allocs in (("1", [1.0, 1.0]), ("0.5", [0.5, 1.0]), ("0", [1.0, 3.0])):
            d = r[f"{var}_roll_attention_frac{frac}"]
            assert d["maxdiff_vs_separate"] <= 1e-5 and d["allocs_in_q"] == allocs, (var, frac, d)
            assert d["keeps_layout"] or frac == "0", (var, frac, d)
        for lay in ("node", "raster"):
            for bthd in (0, 1):
                assert r[f"{var}_rolled_3_1_{lay}_bthd{bthd}"] <= 1e-5, (var, lay, bthd)
    real = {"wan14_480p": 20, "wan14_720p": 20, "wan13_480p": 12, "flux_1024": 24}
    assert r["real_hc"] == real and r["real_hc_3copies"] == real, (r["real_hc"], r["real_hc_3copies"])
    # the default budget halves from 512 MiB of q on (kernels.triton.MORTON_LARGE_BYTES): 720p in 4 chunks
    assert r["default_hc"] == {**real, "wan14_720p": 10}, r["default_hc"]
    assert r["roll_hc"] == {**real, "wan14_480p": 14, "wan14_720p": 10}, r["roll_hc"]


def test_peeled_virtual_loop_equals_the_plain_one(res):
    """PSA_TRITON_VT_PEEL: the same terms (only the rounding of log2(64) in the exponent and of the first-order weight
    differ), with whole tiles before the last one, a short last block, the last block alone in its tile, and no
    whole tile at all (then nothing changes)."""
    r = get(res, "vt_peel_equals_the_plain_virtual_loop")
    for key, d in r.items():
        assert d["finite"] and d["rel_ref"] <= 1e-5 and d["rel_plain"] <= 1e-6, (key, d)
    assert r["T1024_pwt"]["rel_plain"] == 0.0 and r["T1100_pwt"]["rel_plain"] > 0.0, r


def test_custom_op_schema_and_fake_tensor(res):
    r = get(res, "custom_op_opcheck")
    assert all(v == "SUCCESS" for v in r.values()), r


def test_out_layout_bthd_writes_the_same_values_in_token_major_memory(res):
    r = get(res, "out_layout_bthd")
    for name in ("plain", "morton"):
        assert r[name] == {"equal": True, "bthd": True, "base_bthd": False, "flat_is_view": True}, (name, r[name])
    assert r["caller_view_default"]["bthd"]  # a [B, L, H, D] caller's view keeps its layout by default
    assert r["torch_backend"] == {"bthd": True, "equal": True}


def test_unavailable_reasons_are_data(res):
    r = get(res, "unavailable_reasons")
    assert r["available"] and r["fwd_interpret"]
    assert r["head_dim_80"] == "head_dim 80 unsupported by triton (64 or 128)"
    assert "float64" in r["float64"]
    assert "block_size 32" in r["block_size_32"]
    assert r["ok"] is None


def test_one_nan_query_token_poisons_only_its_row(res):
    for name, d in get(res, "nan_query_token_stays_in_its_row").items():
        assert d["bad_rows"] == 1 and d["row5_bad"], (name, d)


def test_api_morton_with_prefix_batch2_transposed_views_on_triton(res):
    r = get(res, "api_morton_prefix_batch2_transposed_views")
    assert r["backend"] == "triton" and r["fell_back"] == [] and r["shape_ok"]
    assert r["rel"] <= TOL32


def test_bfloat16_declined_under_the_interpreter(res):
    r = get(res, "bfloat16_under_interpreter")
    assert r["reason"] and "bfloat16" in r["reason"] and r["float16_ok"]


def test_head_chunks_equal_one_pass_and_the_scratch_estimate_is_what_is_allocated(res):
    """Head chunking (to bound scratch) changes the output only by float16 rounding (the split-K sum of H-bar
    splits differently with fewer heads; drop, without H-bar, is bit-exact), and the per-head estimate the
    chunk size comes from is exactly the bytes statistics + routing allocate (plus the bias' 64-element slack, once
    per call)."""
    r = get(res, "head_chunks_equal_one_pass_and_scratch_is_counted")
    assert r["drop"]["max_abs_diff"] == 0.0, r["drop"]
    for var in ("pwt", "pisa", "drop"):
        assert r[var]["rel"] < 1e-3, (var, r[var])
        assert r[var]["scratch_estimate"] + r[var]["scratch_slack"] == r[var]["scratch_actual"], (var, r[var])
    assert r["default_fraction"] == 0.5, r
    assert r["wan14b_pwt_hc"] == 40 and r["wan14b_drop_hc"] == 40 and r["wan14b_720p_pwt_hc"] == 40, r
    hc = r["hc_41_heads_tight"]
    assert hc < 41 and -(-41 // hc) * hc - 41 < -(-41 // hc), r  # even chunks: no small last chunk


def test_statistics_programs_over_several_blocks_equal_one_block_per_program(res):
    r = get(res, "stats_grouped_blocks_equal_one_block_per_program")
    assert r["groups"] and all(g["G"] > 1 for g in r["groups"].values())
    for name, g in r["groups"].items():
        assert g["maxdiff"] == 0.0, (name, g)
    assert r["kbar_vs_ref"] <= 1e-5 and r["ksig2_vs_ref"] <= 1e-5


def test_drop_statistics_on_tensor_cores_equal_the_split_kernel(res):
    r = get(res, "stats_tc_equals_split_kernels")
    drop = r.pop("D64_T257_drop")
    assert drop["kbar"] <= 1e-6 and drop["qbar"] <= 1e-6 and drop["nonfinite_equal"], drop


def test_select_kernel_keeps_the_best_by_score_then_lowest_id(res):
    r = get(res, "select_kernel_equals_a_sorted_topk_on_crafted_scores")
    assert len(r) == 4 and any(name.endswith("rows1") for name in r)
    assert all(r.values()), r


def test_select_pieces_kernel_equals_bits_and_a_sorted_topk(res):
    r = get(res, "select_pieces_equals_bits_and_a_sorted_topk")
    assert len(r) == 59, sorted(r)
    # two pieces (NB > 0) and several rows per program were exercised, by both searches
    assert any("_pieces_" in name and "x0x" not in name for name in r), sorted(r)
    assert sum("_interp_" in name for name in r) == 20, sorted(r)
    assert all(r.values()), {name: ok for name, ok in r.items() if not ok}


def test_bf16x3_score_dots_rank_like_float32_dots(res):
    for var, d in get(res, "scores_bf16x3_split_ranks_like_float32").items():
        assert d["counts_equal"], var
        assert d["rows_differ"] <= 0.02 * d["rows"], (var, d)
        assert d["max_gap_in_spread"] <= 1e-4, (var, d)  # only near-ties may swap
        assert d["bias_maxdiff"] <= 1e-3, (var, d)  # float16 bias: one unit at most


def test_route_with_either_select_kernel_equals_route_torch(res):
    r = get(res, "route_select_impls_agree_with_torch")
    assert r.pop("bias_pieces_equals_bits") is True
    assert set(r) == {"pieces", "bits"}
    for impl, d in r.items():
        assert d["idx_equal_torch"] and d["exact_marks_equal_torch"], (impl, d)


def test_routing_score_slices_are_clamped_to_the_head_dim(res):
    r = get(res, "score_slices_wider_than_the_head_dim")
    for dk, d in r.items():
        assert d["idx_equal_torch"] and d["bias_maxdiff"] <= 1e-5, (dk, d)


def test_route_with_the_gluon_scores_taken_or_failing(res):
    r = get(res, "route_gluon_dispatch_falls_back")
    assert r["fails_equal"] and r["runs_equal"]
    # (fails: one attempt, then Triton for every sub-chunk; runs: every sub-chunk, heads 0-1 and 2)
    assert r["gluon_calls"] == [["fail", 0], ["ok", 0], ["ok", 2]] and r["usable_off"] is False

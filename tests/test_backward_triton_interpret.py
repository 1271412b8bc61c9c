"""The Triton backward on CPU under TRITON_INTERPRET=1 (tiny sizes) against autograd through the float64
reference under identical routing, and the autograd wiring (custom ops, differentiable Morton gather).

All cases run once, in a subprocess (tests/triton_bwd_interp_cases.py): TRITON_INTERPRET must be set before
Triton is imported and must not leak into the other test files of this session.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

HERE = Path(__file__).resolve().parent
TOL32 = 1e-5  # float32 kernels against the float64 oracle, relative L2 per gradient (observed ~1e-6)


@pytest.fixture(scope="module")
def res():
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([sys.executable, str(HERE / "triton_bwd_interp_cases.py")], capture_output=True, text=True,
                       env=env, timeout=1200, cwd=str(HERE.parent))
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULTS_JSON ")]
    assert p.returncode == 0 and line, f"driver failed (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return json.loads(line[0][len("RESULTS_JSON "):])


def get(res, name):
    r = res[name]
    assert "error" not in r, r.get("error")
    return r


def assert_grads(r, tol=TOL32):
    assert r["dtype_ok"] and r["dq_finite"] and r["dk_finite"] and r["dv_finite"]
    for g in ("out", "dq", "dk", "dv"):
        assert r[g] <= tol, (g, r[g])


@pytest.mark.parametrize("name", [
    "fp32_T200_D64_pwt", "fp32_T200_D64_pisa", "fp32_T200_D64_drop", "fp32_B2_T130_D128_pwt_sinks_band",
    "fp32_T300_D64_pisa_cov_bias_many_virtual_tiles", "fp32_T40_shorter_than_a_block"])
def test_triton_gradients_equal_float64_reference_under_identical_routing(res, name):
    assert_grads(get(res, name))


def test_pwt_gate_is_open_and_closed_in_the_gradient_cases(res):
    r = get(res, "fp32_T200_D64_pwt")
    assert r["gated"] and r["open"]


def test_dit_like_pwt_gradients_match_and_every_statistic_path_is_exercised(res):
    r = get(res, "dit_like_pwt_every_statistic_path_is_exercised")
    assert r["gated"] and r["open"]
    assert_grads(r)
    for cut, moved in r["cut"].items():
        # cutting one statistic's path moves the oracle's gradient by far more than the kernels' error
        assert moved > 100 * TOL32, (cut, moved)


def test_head_chunks_give_the_gradients_of_one_pass(res):
    for variant, err in get(res, "head_chunks_equal_one_pass_B2").items():
        assert err <= 1e-6, variant  # float32 summation order of the statistics only


def test_density_one_gradients_equal_sdpa(res):
    for variant, err in get(res, "density_one_equals_sdpa_gradients").items():
        assert err <= TOL32, variant


def test_api_morton_prefix_batch2_views_backward_through_triton(res):
    r = get(res, "api_morton_prefix_batch2_transposed_views_autograd")
    assert r["backend"] == "triton" and r["has_grad_fn"] and r["fell_back"] == []
    for g in ("out", "dq", "dk", "dv"):
        assert r[g] <= TOL32, (g, r[g])


def test_fp16_gradients_within_twice_torchs_own_fp16_error(res):
    r = get(res, "fp16_T200_D64_pwt_within_twice_torch_fp16_error")
    assert r["dtype_ok"] and r["dq_finite"] and r["dk_finite"] and r["dv_finite"]
    for g in ("dq", "dk", "dv"):
        assert r[g] <= 2 * r["torch_fp16"][g] + 1e-4, (g, r[g], r["torch_fp16"][g])


def test_custom_ops_schema_autograd_registration_and_fake_tensors(res):
    r = get(res, "custom_ops_opcheck")
    assert r and all(v == "SUCCESS" for v in r.values()), r


def test_compiled_training_step_has_no_graph_break_and_eager_gradients_at_two_lengths(res):
    r = get(res, "compiled_training_step_aot_eager_and_dynamic_length")
    assert r["graph_breaks"] == 0
    assert r["T200"] <= 1e-6 and r["T300"] <= 1e-6, r


def test_morton_gather_gradient_is_the_scatter(res):
    r = get(res, "permute_tokens_gradient_is_the_inverse_permutation")
    assert r["gather_equal"] and r["grad_is_scatter"] and r["no_grad_path_plain"]


def test_inference_path_unchanged_without_grad(res):
    r = get(res, "inference_path_unchanged_without_grad")
    assert r["plain_no_grad_fn"] and r["train_has_grad_fn"] and r["no_grad_mode_no_grad_fn"]
    assert r["train_equals_inference"] <= 1e-6

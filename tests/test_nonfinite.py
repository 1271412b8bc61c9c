"""Non-finite inputs (issue 12, class 1): a row is NaN/inf only where dense attention's row is, for every
variant, backend and density (1.0 included), and finite inputs never give NaN/inf, also near float16's maximum.

The cases are data (tests/nonfinite_contract.py); each backend runs the same ones: the torch reference here, the
Triton kernels under TRITON_INTERPRET=1 in one subprocess (the interpreter must be set before Triton is imported),
Triton and CuTe on CUDA (marked gpu).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import nonfinite_contract as nc

HERE = Path(__file__).resolve().parent
POISONED, FINITE = nc.case_ids()
# each backend's own float16 rounding of H-bar (the Triton kernels multiply float16 k - k-bar on tensor cores)
HBAR_TOL = {"torch": 1e-5, "triton": 1e-3, "cute": 1e-2}
CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def interp():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([sys.executable, str(HERE / "nonfinite_contract.py"), "triton"], capture_output=True,
                       text=True, env=env, timeout=1200, cwd=str(HERE.parent))
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULTS_JSON ")]
    assert p.returncode == 0 and line, f"driver failed (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return json.loads(line[0][len("RESULTS_JSON "):])


def _parse(case):
    variant, dens, dtype = case.split("-")
    return variant, float(dens[1:]), dtype


# density 1: max |ours - dense| / max |dense| over the finite rows, from the output dtype's rounding
D1_TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def _poisoned(backend, case, interp_results=None):
    if interp_results is not None:
        r = interp_results[case]
    else:
        variant, density, dtype = _parse(case)
        r = nc.poisoned_case(backend, variant, density, dtype)
    assert "error" not in r, r.get("error")
    return r


def check_poisoned(r, case):
    variant, density, dtype = _parse(case)
    assert r["shape_ok"] and r["oracles_agree"]
    assert r["spurious"] == 0, f"rows NaN/inf where dense attention is finite, heads {r['spurious_heads']}"
    if variant != "drop":
        # nothing is dropped: a row dense attention poisons is poisoned here too
        assert r["missing"] == 0
    if density == 0.5:
        assert r["block3_virtual"]  # the poisoned block really was a virtual token for some query block
    if density == 1.0:
        # density 1 is dense attention: the finite rows agree with it
        assert r["missing"] == 0 and r["d1_err"] <= D1_TOL[dtype], r["d1_err"]


def check_finite(r, backend):
    assert r["inputs_finite"] and r["dense_finite"]
    assert r["nonfinite"] == 0
    if "hbar_rel" in r:
        assert r["hbar_rel"] <= HBAR_TOL[backend], r["hbar_rel"]
    if "rel_vs_ref64" in r:
        assert r["rel_vs_ref64"] <= 2 * r["torch_fp16_rel"] + 1e-4, r


def _finite(backend, case, interp_results=None):
    if interp_results is not None:
        r = interp_results[case]
    else:
        kind, variant, dens = case.split("-")
        r = nc.finite_inputs_case(backend, variant, float(dens[1:]), kind, sinks=nc.FINITE_KINDS[kind][1])
    assert "error" not in r, r.get("error")
    return r


@pytest.mark.parametrize("case", POISONED)
def test_rows_are_non_finite_only_where_dense_attention_is__torch(case):
    check_poisoned(_poisoned("torch", case), case)


@pytest.mark.parametrize("case", POISONED)
def test_rows_are_non_finite_only_where_dense_attention_is__triton_interpreter(interp, case):
    check_poisoned(_poisoned("triton", case, interp), case)


@pytest.mark.parametrize("case", FINITE)
def test_finite_inputs_never_give_nan_or_inf__torch(case):
    check_finite(_finite("torch", case), "torch")


@pytest.mark.parametrize("case", FINITE)
def test_finite_inputs_never_give_nan_or_inf__triton_interpreter(interp, case):
    check_finite(_finite("triton", case, interp), "triton")


def test_inputs_that_require_grad_never_get_a_detached_output__triton_interpreter(interp):
    # issue 12 class 4 on the real Triton backend: auto differentiates (Triton's own backward, kernels/triton/
    # bwd.py, once DIFFERENTIABLE names it), an explicit backend without a backward raises naming the alternative
    r = interp["autograd"]
    assert "error" not in r, r.get("error")
    assert r["auto_grad_fn"] and r["grads_finite"] and r["no_grad_backend"] == "triton"
    if r["differentiable"]:
        assert r["explicit_grad_fn"]
    else:
        assert "backend='triton'" in r["explicit_error"] and "backend='torch'" in r["explicit_error"]


def test_one_inf_key_element_through_the_override_keeps_dense_attentions_finite_rows():
    # the example, as ComfyUI calls it: Wan layout [B, L, H*D], density 1 and 0.25
    import comfy_inproc
    comfy_inproc.load_pack()
    from psa_pack.nodes import patch, policy

    grid, heads, d = (3, 8, 16), 2, 64
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 384, heads * d, generator=g) for _ in range(3))
    k[0, 100, 3] = float("inf")  # head 0, one key element
    dense = nc.dense_float64(*(t.view(1, 384, heads, d).transpose(1, 2) for t in (q, k, v)))
    ok_dense = nc.row_finite(dense)
    assert 0 < int(ok_dense[0, 0].sum()) < 384 and bool(ok_dense[0, 1].all())
    for density in (1.0, 0.25):
        ov = patch.SparseAttentionOverride(policy.Knobs(density=density, dense_steps=0, dense_blocks=(), min_tokens=0,
                                                        backend="torch"), family="wan", total_blocks=4)
        out = ov(lambda *a, **kw: None, q, k, v, heads=heads, transformer_options={
            "block_index": 1, "grid_sizes": grid, "sigmas": torch.tensor([0.5]),
            "sample_sigmas": torch.tensor([1.0, 0.5, 0.0])})
        ok = nc.row_finite(out.view(1, 384, heads, d).transpose(1, 2))
        assert not (~ok & ok_dense).any(), density
        if density == 1.0:
            assert torch.equal(ok, ok_dense)


def test_the_poisoned_block_is_exact_for_some_query_blocks_and_virtual_for_others():
    # the placements the contract claims: block 3 is the band of query block 3 and a virtual token elsewhere
    from kernels.config import SparseConfig
    from kernels.routing import block_stats, route

    q, k, v = nc.poisoned_inputs(dtype=torch.float64)
    cfg = SparseConfig(density=0.5, variant="pisa", band=0, n_sink_blocks=1, scale=64 ** -0.5)
    exact = route(block_stats(q, k, v, nc.BS), cfg).exact[0]
    assert exact[:, :, 0].all()  # the sink block (head 4's -inf key) is exact for every query block
    assert exact[3, 3, 3] and (~exact[3, :, 3]).any()  # head 3: its own band, virtual for someone else
    assert (~exact[5, :, 5]).any() and (~exact[6, :, 2]).any()  # the short last block and block 2 virtual too


# the same contract on a GPU (bf16 and fp16 for Triton, bf16 head_dim 128 for CuTe)
GPU_POISONED = nc.case_ids(dtypes=("bfloat16", "float16"))[0]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", GPU_POISONED)
@pytest.mark.parametrize("backend", ["triton", "cute"])
def test_rows_are_non_finite_only_where_dense_attention_is__cuda(backend, case):
    from kernels import dispatch
    variant, density, dtype = _parse(case)
    probe = torch.zeros(1, 1, 64, 128, device="cuda", dtype=getattr(torch, dtype))
    why = dispatch.unavailable_reason(backend, probe, nc_cfg(variant, density))
    if why is not None:
        pytest.skip(why)
    r = nc.poisoned_case(backend, variant, density, dtype, D=128, device="cuda")
    assert "error" not in r, r.get("error")
    check_poisoned(r, case)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", [c for c in FINITE if not c.startswith("fp32")])
@pytest.mark.parametrize("backend", ["triton"])
def test_finite_inputs_never_give_nan_or_inf__cuda(backend, case):
    kind, variant, dens = case.split("-")
    r = nc.finite_inputs_case(backend, variant, float(dens[1:]), kind, D=128, device="cuda",
                              sinks=nc.FINITE_KINDS[kind][1])
    assert "error" not in r, r.get("error")
    check_finite(r, backend)


def nc_cfg(variant, density):
    from kernels.config import SparseConfig
    return SparseConfig(density=density, variant=variant, band=0, n_sink_blocks=1, scale=128 ** -0.5)

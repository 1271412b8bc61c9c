"""Wan forwards that carry latent tokens beside the video grid, through ComfyUI's own WanModel at a tiny config,
in-process, on every ComfyUI version that has the feature:

- Wan Fun with `ref_conv` (Wan2.1 Fun 1.1, Wan2.2 Fun Control with a reference image; 0.3.64 and 0.33): the
  conditioning's `reference_latents` (as Wan22FunControlToVideo sets them: the VAE latent of one image,
  [1, C, 1, H, W]) reach WanModel.forward as kwargs `reference_latent` [B, C, H, W] (model_base WAN21.extra_conds
  drops the frame axis); forward_orig puts ref_conv(reference) tokens (a Conv2d of kernel = stride = the spatial
  patch, not padded: floor(H / ph) * floor(W / pw)) in front of the grid: exact prefix (sink blocks), the video in
  Morton order.
- Bernini in-context latents (0.33 only; 0.3.64's Wan has none): the conditioning's `context_latents` (a list of
  [B, C, T, H, W] latents, BerniniConditioning) are padded to the patch by WanModel._forward, patch-embedded and
  appended behind the grid: exact suffix, moved in front by one permutation.

The joint self-attention calls of the sparse steps and blocks run sparse with those tokens exact, density 1
reproduces dense sampling, and HuMo's reference (its own forward appends patch-embedded reference frames, not read
here) keeps its calls dense, bit-identical to sampling without the node."""
from __future__ import annotations

import dataclasses
import math

import pytest

from comfy_server import skip_without_comfyui

pytestmark = pytest.mark.comfy
COMFY_VERSIONED = True  # every test runs against each ComfyUI version (tests/conftest.py)
COMFY_INPROC = True

skip_without_comfyui()

import torch  # noqa: E402

from comfy_inproc import WAN_TINY, tiny_wan  # noqa: E402
from test_comfy_models import (CPU, KNOBS, TXT, Case, _patcher, _sample, check_density_one,  # noqa: E402,F401
                               decisions, kernel_calls)

from comfy.ldm.wan.model import WanModel  # noqa: E402
from psa_pack.nodes import patch  # noqa: E402
from psa_pack.nodes.models import forward_info  # noqa: E402

HAS_BERNINI = "context_latents" in WanModel.forward_orig.__code__.co_consts


def _lat(*shape, seed: int = 5):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# Wan2.1 Fun-style: 16-channel latent, a 16-channel reference through ref_conv; video (1, 16, 3, 16, 16) -> (3, 8, 8)
# = 192 tokens, the reference image's latent [1, 16, 1, 16, 16] -> 8 x 8 = 64 tokens in front
REF = _lat(1, 16, 1, 16, 16)
# Bernini: a 2-frame source video (2 x 4 x 4 = 32 tokens) and a reference image at its own aspect, 10 x 7 latent
# pixels (padded to 10 x 8: 5 x 4 = 20 tokens), behind the grid
CONTEXT = [_lat(1, 16, 2, 8, 8, seed=6), _lat(1, 16, 1, 10, 7, seed=7)]
N_REF, N_CTX, N_GRID = 64, 32 + 20, 192
KN = dict(KNOBS, min_tokens=128)  # small calls (a few seconds per test on 2 shared CPU cores)


def _case(ref: bool, ctx: bool, supported: str = "WAN21_T2V", model_type: str = "t2v") -> Case:
    cfg = dict(WAN_TINY, image_model="wan2.1", model_type=model_type)
    extra = {}
    if ref:
        cfg["in_dim_ref_conv"] = 16
        extra["reference_latents"] = [REF]
    if ctx:
        extra["context_latents"] = list(CONTEXT)
    n_front, n_back = N_REF * ref, N_CTX * ctx
    return Case(supported, "comfy.ldm.wan.model:WanModel", cfg, (1, 16, 3, 16, 16), 4096, extra, "wan",
                n_front + n_back, bool(ctx), (3, 8, 8), n_front + N_GRID + n_back)


CASES = {"fun_ref": (True, False), "bernini": (False, True), "fun_ref_bernini": (True, True)}


def _get(name: str) -> Case:
    ref, ctx = CASES[name]
    if ctx and not HAS_BERNINI:
        pytest.skip("this ComfyUI's WanModel has no Bernini context_latents (ComfyUI 0.33 added them)")
    return _case(ref, ctx)


@pytest.mark.parametrize("name", list(CASES))
def test_wan_extra_tokens_exact_and_joint_calls_sparse(name, decisions, kernel_calls):
    case = _get(name)
    mp = _patcher(case)
    assert patch.model_layout(mp)[0] == "wan"
    assert (mp.model.diffusion_model.ref_conv is not None) == CASES[name][0]
    out = _sample(patch.apply_piecewise_sparse_attention(mp, **KN), case)
    assert torch.isfinite(out).all()
    rows = decisions()
    joint = [r for r in rows if r["q_len"] == r["k_len"]]
    # 4 blocks x 3 steps, all over the grid and its extra tokens; step 0 and blocks 0 and 3 dense
    assert len(joint) == 12 and {r["q_len"] for r in joint} == {case.joint}
    assert sorted((r["step"], r["block"]) for r in joint) == [(s, b) for s in range(3) for b in range(4)]
    assert sorted((r["step"], r["block"]) for r in rows if r["sparse"]) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert {r["reason"] for r in joint if not r["sparse"]} == {"dense step", "dense block"}
    assert all(r["reason"] == "cross-attention" for r in rows if r not in joint)
    assert len(kernel_calls) == 4
    n_ref = N_REF if CASES[name][0] else 0
    for c in kernel_calls:
        assert c["shape"][2] == case.joint and c["n_sink_blocks"] == -(-case.n_text // 64)
        if case.text_behind:  # in-context tokens (and the reference) in front by one permutation, grid Morton behind
            assert c["reorder"] == "none" and c["grid"] is None and c["n_prefix"] == 0
        else:  # the reference's tokens are the exact prefix
            assert c["reorder"] == "morton" and tuple(c["grid"]) == case.grid and c["n_prefix"] == n_ref


@pytest.mark.parametrize("name", list(CASES))
def test_wan_extra_tokens_density_one_reproduces_dense_sampling(name):
    case = _get(name)  # the prefix, the suffix's permutation and Morton order are exact at density 1
    check_density_one(_patcher(case), lambda m: _sample(m, case, steps=2), KN)


def test_humo_reference_frames_stay_dense_bit_identical(decisions, kernel_calls):
    # HuMo (its own forward_orig) appends patch-embedded reference frames behind the grid: not read here, so every
    # joint call carries more tokens than the grid gives and stays dense, computed exactly as without the node
    case = dataclasses.replace(_case(False, False, "WAN21_HuMo", "humo"), params="comfy.ldm.wan.model:HumoWanModel",
                               cond_extra={"reference_latents": [REF]})
    mp = _patcher(case)
    assert type(mp.model.diffusion_model).__name__ == "HumoWanModel"
    out = _sample(patch.apply_piecewise_sparse_attention(mp, **KN), case, steps=2)
    joint = [r for r in decisions() if r["q_len"] == r["k_len"]]
    assert len(joint) == 8 and {r["q_len"] for r in joint} == {N_GRID + N_REF} and not kernel_calls
    # the calls of sparse steps and blocks name the token count (0.3.64 gives no block index: none is counted)
    why = [r["reason"] for r in joint if r["reason"] not in ("dense step", "dense block")]
    assert len(why) >= 2 and set(why) == {"256 tokens but the latent grid gives 192 (reference latents, VACE or "
                                          "another extension adds tokens); attention stays dense"}
    assert torch.equal(out, _sample(patch.apply_piecewise_sparse_attention(mp, variant="off"), case, steps=2))


def test_wan_forward_info_reads_the_reference_and_context_latents_exactly():
    fun, plain = tiny_wan(in_dim_ref_conv=16, num_layers=1), tiny_wan(num_layers=1)
    x, ctx = torch.zeros(1, 16, 3, 31, 33), torch.zeros(1, TXT, 4096)
    # the reference is not padded: floor over the patch (the video grid is padded: ceil)
    info = forward_info("wan", fun, (x, None, ctx), {"reference_latent": torch.zeros(2, 16, 31, 33)})
    assert info.grid == (3, 16, 17) and info.n_prefix == 15 * 16 and info.n_suffix == 0 and info.reason is None
    with torch.no_grad():
        assert fun.ref_conv(torch.zeros(1, 16, 31, 33)).flatten(2).shape[-1] == info.n_prefix
    # no ref_conv: WanModel ignores a reference latent
    assert forward_info("wan", plain, (x, None, ctx), {"reference_latent": torch.zeros(1, 16, 31, 33)}).n_prefix == 0
    bad = forward_info("wan", fun, (x, None, ctx), {"reference_latent": torch.zeros(1, 16, 1, 31, 33)})
    assert bad.reason.startswith("Wan Fun reference latent (1, 16, 1, 31, 33) or its ref_conv unreadable")
    lats = {"context_latents": [torch.zeros(1, 16, 3, 17, 9), torch.zeros(1, 16, 1, 4, 4)]}
    info = forward_info("wan", plain, (x, None, ctx), lats)
    if HAS_BERNINI:  # padded to the patch by _forward: ceil
        assert info.n_suffix == 3 * 9 * 5 + 4 and info.reason is None
        assert forward_info("wan", plain, (x, None, ctx), {"context_latents": torch.zeros(1, 16, 1, 4, 4)}).reason
    else:  # 0.3.64's forward never reads them
        assert info.n_suffix == 0 and info.reason is None
    assert info.n_tokens == info.n_prefix + math.prod(info.grid) + info.n_suffix

"""MiniMax-H3 (ComfyUI 0.33; video + audio) through ComfyUI's own classes at a tiny config, in-process, on CPU.

One packed sequence per forward, batch 1: [text | keyframe cond rows | reference blocks | target audio | target video],
the target video last in (t, h, w) raster order at patch (1, 2, 2). The joint self-attention calls run sparse with
everything in front of the target video as exact prefix (sink blocks) and the video's grid for Morton order; ComfyUI
0.33 gives H3 no block index, so the blocks are counted. The prefix is read per forward from the packed layout
model_base prebuilds into the payload (a keyframe on the positive prompt only: each CFG branch its own prefix); a
forward whose layout cannot be read stays dense with its reason; the token refiner (text alone) stays dense as a side
stream. The sampling runs use the [video, audio] NestedTensor latent the H3 nodes make (a tiny audio track). On
ComfyUI 0.3.64, which lacks the model, every test skips."""
from __future__ import annotations

import math

import pytest

from comfy_server import skip_without_comfyui

pytestmark = pytest.mark.comfy
COMFY_VERSIONED = True  # every test runs against each ComfyUI version (tests/conftest.py)
COMFY_INPROC = True

skip_without_comfyui()

import torch  # noqa: E402

from test_comfy_models import (CPU, KNOBS, TXT, Case, _patcher, check_density_one,  # noqa: E402,F401
                               decisions, kernel_calls)

import comfy.sample  # noqa: E402
from psa_pack.nodes import patch  # noqa: E402

# 2 heads of 64 (rope over 3 axes x 8 frequencies: 48 of the 64 dims), 4 blocks, a 2-layer token refiner over a
# 64-dim prompt; video [1, 24, 3, 32, 32] -> (3, 16, 16) = 768 tokens, audio [1, 32, 2, 6] -> 12 stereo rows
H3 = Case("MiniMaxH3", "comfy.ldm.minimax.model:MiniMaxH3Model",
          dict(image_model="minimax_h3", hidden_size=128, num_layers=4, token_refiner_num_layers=2,
               num_attention_heads=2, attention_head_dim=64, ffn_hidden_size=256, text_dim=64,
               time_embed_hidden_size=128, time_embed_dim=64, rope_inv_freq_len=8),
          (1, 24, 3, 32, 32), 64, {}, "minimax_h3", TXT + 12, False, (3, 16, 16), TXT + 12 + 768)
AUDIO = (1, 32, 2, 6)
# fl2va: a one-frame video keyframe (256 cond rows, the target's spatial grid) with 2 frames of audio (4 rows)
KEYFRAME = dict(resolved_frame_index=0)


def _keyframe():
    g = torch.Generator().manual_seed(3)
    return dict(KEYFRAME, latent=torch.randn(1, 24, 1, 32, 32, generator=g),
                audio_latent=torch.randn(1, 32, 2, 2, generator=g))


def _h3(seed: int = 0):
    mp = _patcher(H3, seed=seed)
    dm = mp.model.diffusion_model
    with torch.no_grad():  # a buffer (the weights loader fills it; init_weights sets parameters only)
        dm.rope.inv_freq.copy_(1.0 / 256.0 ** (torch.arange(dm.rope.inv_freq.numel(), dtype=torch.float32) / 8))
    return mp


def _sample(model, steps: int = 3, cfg: float = 1.0, keyframe: bool = False, seed: int = 0, **kw):
    from comfy.nested_tensor import NestedTensor

    g = torch.Generator().manual_seed(1)
    text = torch.randn(1, TXT, H3.context_dim, generator=g) * 0.5
    pos = {"minimax_keyframes": [_keyframe()]} if keyframe else {}
    cond, neg = [[text, pos]], [[torch.zeros_like(text), {}]]
    g = torch.Generator().manual_seed(seed)
    noise = NestedTensor((torch.randn(H3.latent, generator=g), torch.randn(AUDIO, generator=g)))
    latent = NestedTensor((torch.zeros(H3.latent), torch.zeros(AUDIO)))
    out = comfy.sample.sample(model, noise, steps, cfg, "euler", "simple", cond, neg, latent, denoise=1.0, seed=seed,
                              disable_pbar=True, **kw)
    return torch.cat([t.flatten() for t in out.unbind()])


@pytest.mark.parametrize("keyframe", [False, True], ids=["t2va", "fl2va_cfg"])
def test_h3_sparse_exactly_on_joint_self_attention_with_the_packed_prefix_exact(keyframe, decisions, kernel_calls):
    mp = _h3()
    assert patch.model_layout(mp) == ("minimax_h3", None, 4, 0)
    # the keyframe run: CFG, the positive prompt alone carries the keyframe (its cond rows in the prefix)
    prefixes = {H3.n_text + 256 + 4: [0], H3.n_text: [1]} if keyframe else {H3.n_text: [0]}
    out = _sample(patch.apply_piecewise_sparse_attention(mp, **KNOBS), cfg=2.0 if keyframe else 1.0,
                  keyframe=keyframe)
    assert torch.isfinite(out).all()
    rows = decisions()
    for n_prefix, branch in prefixes.items():
        joint = [r for r in rows if r["q_len"] == r["k_len"] == n_prefix + 768]
        # 4 blocks x 3 steps, counted; step 0 and blocks 0 and 3 dense
        assert len(joint) == 12 and {tuple(r["branch"]) for r in joint} == {tuple(branch)}
        assert [(r["step"], r["block"]) for r in joint] == [(s, b) for s in range(3) for b in range(4)]
        assert sorted((r["step"], r["block"]) for r in joint if r["sparse"]) == [(1, 1), (1, 2), (2, 1), (2, 2)]
        assert {r["reason"] for r in joint if not r["sparse"]} == {"dense step", "dense block"}
        calls = [c for c in kernel_calls if c["shape"][2] == n_prefix + 768]
        assert len(calls) == 4
        for c in calls:  # everything in front of the target video exact (sink blocks), the video in Morton order
            assert c["n_prefix"] == n_prefix and c["n_sink_blocks"] == -(-n_prefix // 64)
            assert c["reorder"] == "morton" and tuple(c["grid"]) == H3.grid
    assert len(rows) == 12 * len(prefixes) and len(kernel_calls) == 4 * len(prefixes)


@pytest.mark.parametrize("keyframe", [False, True], ids=["t2va", "fl2va"])
def test_h3_density_one_reproduces_dense_sampling(keyframe):
    # the packed prefix, the grid and Morton order are exact at density 1
    check_density_one(_h3(), lambda m: _sample(m, steps=2, keyframe=keyframe))


def _forward(model, payload: dict):
    """One direct forward (sigma 0.5) of the patched model with an unrefined 64-dim prompt: the token refiner then
    runs inside the forward (model_base otherwise refines the prompt once per sampling run, outside any forward)."""
    dm = model.model.diffusion_model
    to = dict(model.model_options["transformer_options"], wrappers=model.wrappers)
    g = torch.Generator().manual_seed(2)
    x = [torch.randn(H3.latent, generator=g), torch.randn(AUDIO, generator=g)]
    text = torch.randn(1, TXT, H3.context_dim, generator=g)
    with torch.no_grad():
        return dm(x, torch.tensor([500.0]), text, transformer_options=to, minimax_payload=payload)


def test_h3_token_refiner_dense_and_an_unreadable_layout_dense_with_its_reason(decisions, kernel_calls):
    mp = _h3()
    knobs = dict(KNOBS, dense_steps=0)  # a direct forward has no schedule
    m = patch.apply_piecewise_sparse_attention(mp, **knobs)
    # no payload layout, no keyframes: the prefix is the prompt and the audio's stereo rows
    _forward(m, {})
    rows = decisions()
    refiner = [r for r in rows if r["q_len"] == TXT]
    assert len(refiner) == 2 and all(r["reason"] == "text-only self-attention (a text refiner layer)"
                                     for r in refiner)
    joint = [r for r in rows if r["q_len"] == H3.joint]
    assert [(r["block"], r["sparse"]) for r in joint] == [(0, False), (1, True), (2, True), (3, False)]
    assert len(rows) == 6 and [c["n_prefix"] for c in kernel_calls] == [H3.n_text] * 2
    # a keyframe with no prebuilt layout: the forward builds its own; its token count is not read here, so dense
    kf = _keyframe()
    _forward(m, {"keyframes": [kf], "cond_video_latents": [kf["latent"]], "cond_audio_latents": [kf["audio_latent"]]})
    joint = [r for r in decisions()[6:] if r["q_len"] == r["k_len"] != TXT]
    assert len(joint) == 4 and {r["q_len"] for r in joint} == {H3.n_text + 260 + 768}
    assert not any(r["sparse"] for r in joint) and len(kernel_calls) == 2
    assert {r["reason"] for r in joint} == {"MiniMax-H3 keyframes/references without a prebuilt packed layout: their "
                                            "token count is not read here"}


def test_h3_batch_and_patch_outside_the_layout_stay_dense():
    from psa_pack.nodes.models import forward_info

    dm = _h3().model.diffusion_model
    x = [torch.zeros(2, 24, 3, 32, 32), torch.zeros(AUDIO)]
    ctx = torch.zeros(1, TXT, 128)
    assert "batch of 2" in forward_info("minimax_h3", dm, (x, None, ctx), {}).reason
    info = forward_info("minimax_h3", dm, ([torch.zeros(1, 24, 3, 31, 31), torch.zeros(AUDIO)], None, ctx), {})
    assert info.grid == (3, 16, 16) and info.n_prefix == TXT + 12 and info.reason is None  # padded to the patch
    assert forward_info("minimax_h3", dm, (torch.zeros(1, 24, 3, 32, 32), None, ctx), {}).reason is not None
    assert info.n_tokens == TXT + 12 + 768 == info.n_prefix + math.prod(info.grid)

"""The models of 2026 through ComfyUI's own classes at tiny configs, in-process, on every ComfyUI version that
has them: Wan2.2 TI2V 5B (WAN22, 48-channel latent), FLUX.2 (Flux2, 512 padded text tokens, patch 1),
Qwen-Image, Z-Image (caption and image each padded to 32 tokens: pads behind the image), HunyuanVideo 1.5
(0.33: text in front) and HunyuanVideo 1.0 (0.3.64: text behind the video), LTX-Video, Chroma (FLUX's layout in
a class of its own), Kandinsky 5 video and image (0.33), Cosmos Predict2, CogVideoX (0.33: no block index,
counted), and on 0.33: Mage-Flow (Qwen-Image's blocks), Lens and JoyImage (text behind the image; Lens masks every
call, all zeros for an unpadded prompt), Krea 2 and Ideogram 4 (single stream, text in front; Ideogram 4 counted).
Each is detected by
class hierarchy, sparse exactly on the joint self-attention calls of the sparse steps and blocks, keeps its
text (and pad) tokens as exact sink blocks wherever they sit, and at density 1 reproduces dense sampling.
Wan2.2 A14B's two experts (two models, two KSamplerAdvanced passes) count dense steps over the whole schedule."""
from __future__ import annotations

import dataclasses
import inspect
import json
import math

import pytest

from comfy_server import skip_without_comfyui

pytestmark = pytest.mark.comfy
COMFY_VERSIONED = True  # every test runs against each ComfyUI version (tests/conftest.py)
COMFY_INPROC = True

skip_without_comfyui()

import torch  # noqa: E402

from comfy_inproc import WAN_TINY, import_comfy, init_weights, load_pack  # noqa: E402

import_comfy()
load_pack()
import comfy.model_patcher  # noqa: E402
import comfy.sample  # noqa: E402
import comfy.supported_models  # noqa: E402
from psa_pack.nodes import patch  # noqa: E402

CPU = torch.device("cpu")
TXT = 40  # prompt tokens of the test conditioning


def _fit(cfg: dict, params) -> dict:
    """`cfg` less the keys this ComfyUI's params dataclass / constructor does not take (0.3.64 has fewer)."""
    if dataclasses.is_dataclass(params):
        names = {f.name for f in dataclasses.fields(params)}
    else:
        names = set(inspect.signature(params).parameters)
    return {k: v for k, v in cfg.items() if k in names or k == "image_model"}


@dataclasses.dataclass(frozen=True)
class Case:
    supported: str  # comfy.supported_models class
    params: str  # "module:Class" whose fields/constructor bound the config
    cfg: dict
    latent: tuple
    context_dim: int
    cond_extra: dict
    family: str
    n_text: int  # exact tokens (text, pads) of a joint call, in front + behind
    text_behind: bool
    grid: tuple
    joint: int  # tokens of a joint self-attention call
    unet_extra: dict | None = None  # replaces the supported model's unet_extra_config (full-size dimensions there)


CASES = {
    "wan22_ti2v_5b": Case("WAN22_T2V", "comfy.ldm.wan.model:WanModel",
                          dict(WAN_TINY, image_model="wan2.1", in_dim=48, out_dim=48), (1, 48, 3, 32, 32), 4096, {},
                          "wan", 0, False, (3, 16, 16), 768),
    "flux2": Case("Flux2", "comfy.ldm.flux.model:FluxParams",
                  dict(image_model="flux2", in_channels=128, out_channels=128, vec_in_dim=None, context_in_dim=64,
                       hidden_size=256, mlp_ratio=3.0, num_heads=2, depth=2, depth_single_blocks=2,
                       axes_dim=[32, 32, 32, 32], theta=2000, patch_size=1, qkv_bias=False, guidance_embed=True,
                       txt_ids_dims=[3], global_modulation=True, mlp_silu_act=True, ops_bias=False,
                       default_ref_method="index", ref_index_scale=10.0),
                  (1, 128, 32, 32), 64, {"guidance": 3.5}, "flux", 512, False, (32, 32), 512 + 1024),
    "qwen_image": Case("QwenImage", "comfy.ldm.qwen_image.model:QwenImageTransformer2DModel",
                       dict(image_model="qwen_image", patch_size=2, in_channels=64, out_channels=16, num_layers=4,
                            attention_head_dim=64, num_attention_heads=2, joint_attention_dim=64,
                            axes_dims_rope=(16, 24, 24)),
                       (1, 16, 1, 64, 64), 64, {}, "qwen_image", TXT, False, (32, 32), TXT + 1024),
    # 60 x 60 latent: 30 x 30 = 900 image tokens + 28 pads to 928; the caption's 40 tokens padded to 64
    "z_image": Case("ZImage", "comfy.ldm.lumina.model:NextDiT",
                    dict(image_model="lumina2", patch_size=2, in_channels=16, dim=256, n_layers=4, n_refiner_layers=1,
                         n_heads=2, n_kv_heads=2, multiple_of=64, ffn_dim_multiplier=2.0, qk_norm=True,
                         cap_feat_dim=64, axes_dims=[32, 48, 48], axes_lens=[1536, 512, 512], rope_theta=256.0,
                         z_image_modulation=True, time_scale=1000.0, pad_tokens_multiple=32),
                    (1, 16, 60, 60), 64, {}, "lumina2", 64 + 28, True, (30, 30), 64 + 900 + 28),
    "hunyuan_video_1_5": Case("HunyuanVideo15", "comfy.ldm.hunyuan_video.model:HunyuanVideoParams",
                              dict(image_model="hunyuan_video", in_channels=65, out_channels=32, vec_in_dim=None,
                                   context_in_dim=64, hidden_size=256, mlp_ratio=2.0, num_heads=2, depth=2,
                                   depth_single_blocks=2, axes_dim=[16, 56, 56], theta=256, patch_size=[1, 1, 1],
                                   qkv_bias=True, guidance_embed=False, byt5=False, meanflow=False,
                                   use_cond_type_embedding=False, vision_in_dim=None, meanflow_sum=False),
                              (1, 32, 3, 16, 16), 64, {"pooled_output": torch.zeros(1, 768)}, "hunyuan_video",
                              TXT, False, (3, 16, 16), TXT + 768),
    # ComfyUI 0.3.x: HunyuanVideo 1.0 puts the text behind the video tokens (flipped_img_txt)
    "hunyuan_video_1_0": Case("HunyuanVideo", "comfy.ldm.hunyuan_video.model:HunyuanVideoParams",
                              dict(image_model="hunyuan_video", in_channels=16, out_channels=16, vec_in_dim=768,
                                   context_in_dim=64, hidden_size=256, mlp_ratio=2.0, num_heads=2, depth=2,
                                   depth_single_blocks=2, axes_dim=[16, 56, 56], theta=256, patch_size=[1, 2, 2],
                                   qkv_bias=True, guidance_embed=True, byt5=False, meanflow=False,
                                   use_cond_type_embedding=False, vision_in_dim=None, meanflow_sum=False),
                              (1, 16, 3, 32, 32), 64, {"pooled_output": torch.zeros(1, 768), "guidance": 6.0},
                              "hunyuan_video", TXT, None, (3, 16, 16), TXT + 768),
    "ltxv": Case("LTXV", "comfy.ldm.lightricks.model:LTXVModel",
                 dict(image_model="ltxv", in_channels=128, cross_attention_dim=128, attention_head_dim=64,
                      num_attention_heads=2, caption_channels=64, num_layers=4),
                 (1, 128, 3, 16, 16), 64, {"attention_mask": torch.ones(1, TXT, dtype=torch.long)}, "ltxv", 0, False,
                 (3, 16, 16), 768),
    # (0.33) video: the latent plus the image and mask channels ComfyUI concatenates (33 x patch 4 = 132 features);
    # self-attention over the grid alone (text by cross-attention, the text encoder blocks over the prompt alone)
    "kandinsky5": Case("Kandinsky5", "comfy.ldm.kandinsky5.model:Kandinsky5",
                       dict(image_model="kandinsky5", in_text_dim=64, in_text_dim2=768, time_dim=64, model_dim=128,
                            ff_dim=256, visual_embed_dim=132, num_text_blocks=1, num_visual_blocks=4,
                            axes_dims=(16, 24, 24)),
                       (1, 16, 3, 32, 32), 64, {"pooled_output": torch.zeros(1, 768)}, "kandinsky5", 0, False,
                       (3, 16, 16), 768),
    # the image model: a 4D latent, no concatenated channels (16 x patch 4 = 64 features)
    "kandinsky5_image": Case("Kandinsky5Image", "comfy.ldm.kandinsky5.model:Kandinsky5",
                             dict(image_model="kandinsky5", in_text_dim=64, in_text_dim2=768, time_dim=64,
                                  model_dim=128, ff_dim=256, visual_embed_dim=64, num_text_blocks=1,
                                  num_visual_blocks=4, axes_dims=(16, 24, 24), rope_scale_factor=(1.0, 1.0, 1.0)),
                             (1, 16, 32, 32), 64, {"pooled_output": torch.zeros(1, 768)}, "kandinsky5", 0, False,
                             (16, 16), 256),
    # Chroma (FLUX's layout in its own class; Chroma Radiance subclasses it): text in front of the image tokens
    "chroma": Case("Chroma", "comfy.ldm.chroma.model:ChromaParams",
                   dict(image_model="chroma", in_channels=64, out_channels=64, context_in_dim=64, hidden_size=256,
                        mlp_ratio=4.0, num_heads=2, depth=2, depth_single_blocks=2, axes_dim=[16, 56, 56],
                        theta=10000, patch_size=2, qkv_bias=True, in_dim=64, out_dim=256, hidden_dim=128,
                        n_layers=2, txt_ids_dims=[], vec_in_dim=None),
                   (1, 16, 32, 32), 64, {"pooled_output": torch.zeros(1, 768)}, "flux", TXT, False, (16, 16),
                   TXT + 256),
    # (0.33) Cosmos Predict2 (MiniTrainDIT; Anima subclasses it): self-attention over the (T, H, W) grid, text by
    # cross-attention; three frames here (the text-to-image model takes one)
    "cosmos_predict2": Case("CosmosT2IPredict2", "comfy.ldm.cosmos.predict2:MiniTrainDIT",
                            dict(image_model="cosmos_predict2", max_img_h=240, max_img_w=240, max_frames=128,
                                 in_channels=16, out_channels=16, patch_spatial=2, patch_temporal=1,
                                 concat_padding_mask=True, model_channels=128, num_blocks=4, num_heads=2,
                                 crossattn_emb_channels=64, pos_emb_cls="rope3d", use_adaln_lora=True,
                                 adaln_lora_dim=32),
                            (1, 16, 3, 32, 32), 64, {}, "cosmos_predict2", 0, False, (3, 16, 16), 768),
    # (0.33) CogVideoX: joint text + video attention, text in front; ComfyUI gives no block index (counted)
    "cogvideox": Case("CogVideoX_T2V", "comfy.ldm.cogvideo.model:CogVideoXTransformer3DModel",
                      dict(image_model="cogvideox", num_attention_heads=2, attention_head_dim=64, in_channels=16,
                           out_channels=16, time_embed_dim=64, text_embed_dim=64, num_layers=4, sample_width=32,
                           sample_height=32, sample_frames=9, patch_size=2, use_rotary_positional_embeddings=True),
                      (1, 16, 3, 32, 32), 64, {}, "cogvideox", TXT, False, (3, 16, 16), TXT + 768),
    # (0.33) Mage-Flow: Qwen-Image's blocks (text in front) at patch 1 over the 128-channel FLUX.2 latent
    "mage_flow": Case("MageFlow", "comfy.ldm.mage_flow.model:MageFlowTransformer2DModel",
                      dict(image_model="mage_flow", in_channels=128, out_channels=128, num_layers=4,
                           attention_head_dim=64, num_attention_heads=2, joint_attention_dim=64,
                           axes_dims_rope=(16, 24, 24)),
                      (1, 128, 32, 32), 64, {}, "qwen_image", TXT, False, (32, 32), TXT + 1024),
    # (0.33) Lens: image tokens (the packed latent's pixels) then the text; every joint call gets an additive mask built
    # from the text mask, which its text encoder always returns (all ones for one unpadded prompt): all zeros
    "lens": Case("Lens", "comfy.ldm.lens.model:LensTransformer2DModel",
                 dict(image_model="lens", patch_size=2, in_channels=128, out_channels=32, num_layers=4,
                      attention_head_dim=64, num_attention_heads=2, enc_hidden_dim=32, axes_dims_rope=(16, 24, 24),
                      multi_layer_encoder_feature=True, selected_layer_index=(0, 1)),
                 (1, 128, 32, 32), 64, {"attention_mask": torch.ones(1, TXT, dtype=torch.long)}, "lens", TXT, True,
                 (32, 32), 1024 + TXT),
    # (0.33) JoyImage: [image | text], [B, L, H*D] calls; head_dim 128 (its supported model fixes rope_dim_list)
    "joyimage": Case("JoyImage", "comfy.ldm.joyimage.model:JoyImageTransformer3DModel",
                     dict(image_model="joyimage", patch_size=[1, 2, 2], in_channels=16, hidden_size=256,
                          num_attention_heads=2, text_dim=64, mlp_width_ratio=2.0, num_layers=4),
                     (1, 16, 1, 64, 64), 64, {}, "joyimage", TXT, True, (32, 32), 1024 + TXT),
    # (0.33) Krea 2: single stream [text | image], grouped-query k/v repeated before the call; the text fusion
    # adapter's self-attention (over each token's layer features, then over the prompt) stays dense
    "krea2": Case("Krea2", "comfy.ldm.krea2.model:SingleStreamDiT",
                  dict(image_model="krea2", features=128, tdim=64, txtdim=32, heads=2, kvheads=1, multiplier=2,
                       layers=4, patch=2, channels=16, theta=1e3, txtlayers=2, txtheads=2, txtkvheads=2),
                  (1, 16, 1, 64, 64), 64, {}, "krea2", TXT, False, (32, 32), TXT + 1024),
    # (0.33) Ideogram 4: single stream [text | image], no block index (counted); no mask for an unpadded prompt
    "ideogram4": Case("Ideogram4", "comfy.ldm.ideogram4.model:Ideogram4Transformer2DModel",
                      dict(image_model="ideogram4", in_channels=128, num_layers=4, num_attention_heads=2,
                           attention_head_dim=64, intermediate_size=256, adaln_dim=64, llm_features_dim=64,
                           rope_theta=10000, mrope_section=[12, 10, 10], norm_eps=1e-5),
                      (1, 128, 32, 32), 64, {}, "ideogram4", TXT, False, (32, 32), TXT + 1024, unet_extra={}),
}


def _patcher(case: Case, seed: int = 0):
    cls = getattr(comfy.supported_models, case.supported, None)
    if cls is None:
        pytest.skip(f"this ComfyUI has no {case.supported}")
    if case.unet_extra is not None:  # ComfyUI's class with the tiny dimensions instead of its full-size ones
        cls = type(cls.__name__, (cls,), {"unet_extra_config": case.unet_extra})
    mod, name = case.params.split(":")
    params = getattr(__import__(mod, fromlist=[name]), name)
    mb = cls(_fit(case.cfg, params)).get_model({}, device=CPU)
    init_weights(mb.diffusion_model, seed=seed)
    mb.diffusion_model.float()
    return comfy.model_patcher.ModelPatcher(mb, load_device=CPU, offload_device=CPU)


def _conds(case: Case):
    cond = [[torch.randn(1, TXT, case.context_dim, generator=torch.Generator().manual_seed(1)) * 0.5,
             dict(case.cond_extra)]]
    return cond, [[torch.zeros_like(cond[0][0]), dict(case.cond_extra)]]


def _sample(model, case: Case, steps: int = 3, seed: int = 0, **kw):
    cond, neg = _conds(case)
    noise = torch.randn(case.latent, generator=torch.Generator().manual_seed(seed))
    return comfy.sample.sample(model, noise, steps, 1.0, "euler", "simple", cond, neg, torch.zeros(case.latent),
                               denoise=1.0, seed=seed, disable_pbar=True, **kw)


KNOBS = dict(variant="pwt", density=0.25, band=1, dense_steps=1, dense_blocks=(0, -1), min_tokens=256, backend="torch")


@pytest.fixture
def decisions(tmp_path, monkeypatch):
    path = tmp_path / "decisions.jsonl"
    monkeypatch.setenv(patch.DECISION_LOG_ENV, str(path))
    return lambda: [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def kernel_calls(monkeypatch):
    calls = []
    real = patch.piecewise_sparse_attention

    def spy(q, k, v, **kw):
        calls.append(dict(kw, shape=tuple(q.shape)))
        return real(q, k, v, **kw)
    monkeypatch.setattr(patch, "piecewise_sparse_attention", spy)
    return calls


@pytest.mark.parametrize("name", list(CASES))
def test_sparse_exactly_on_joint_self_attention_with_text_tokens_exact(name, decisions, kernel_calls):
    case = CASES[name]
    mp = _patcher(case)
    assert patch.model_layout(mp)[0] == case.family
    text_behind = case.text_behind
    if text_behind is None:  # HunyuanVideo: where this ComfyUI puts the text
        text_behind = bool(getattr(mp.model.diffusion_model.double_blocks[0], "flipped_img_txt", False))
    out = _sample(patch.apply_piecewise_sparse_attention(mp, **KNOBS), case)
    assert torch.isfinite(out).all()
    rows = decisions()
    joint = [r for r in rows if r["q_len"] == r["k_len"] == case.joint]
    # 4 blocks (FLUX.2, HunyuanVideo: 2 double + 2 single) x 3 steps; step 0 and blocks 0 and 3 dense
    assert len(joint) == 12
    assert sorted((r["step"], r["block"]) for r in rows if r["sparse"]) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    for r in rows:  # everything else: cross-attention, or a refiner / audio stream, dense as routine
        if r not in joint:
            assert not r["sparse"] and (r["reason"] == "cross-attention" or "self-attention (" in r["reason"]), r
    assert len(kernel_calls) == 4
    n_front = -(-case.n_text // 64)
    for c in kernel_calls:
        assert c["shape"][2] == case.joint and c["n_sink_blocks"] == n_front
        if text_behind:  # one permutation put pads/text in front and the image in Morton order behind them
            assert c["reorder"] == "none" and c["grid"] is None and c["n_prefix"] == 0
        else:
            assert c["reorder"] == "morton" and tuple(c["grid"]) == case.grid and c["n_prefix"] == case.n_text


def check_density_one(mp, sample, knobs=KNOBS):
    """At density 1 every block is exact: sampling equals dense sampling (layout, permutation and Morton handling are
    exact), while density 0.1 does change it. `sample(model)` runs one short sampling."""
    dense = sample(patch.apply_piecewise_sparse_attention(mp, variant="off"))
    every = dict(knobs, dense_steps=0, dense_blocks=())
    full = sample(patch.apply_piecewise_sparse_attention(mp, **dict(every, density=1.0)))
    sparse = sample(patch.apply_piecewise_sparse_attention(mp, **dict(every, density=0.1)))
    scale = dense.norm()
    assert float((full - dense).norm() / scale) < 1e-4
    assert float((sparse - dense).norm() / scale) > 1e-4


@pytest.mark.parametrize("name", list(CASES))
def test_density_one_reproduces_dense_sampling(name):
    case = CASES[name]
    check_density_one(_patcher(case), lambda m: _sample(m, case, steps=2))


PADDED = torch.cat([torch.ones(1, TXT - 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long)], dim=1)


@pytest.mark.parametrize("name,mask,n_sparse", [("lens", None, 4), ("lens", "padded", 0), ("ideogram4", "padded", 0),
                                                ("mage_flow", "padded", 0)])
def test_the_text_mask_decides_whether_joint_calls_may_run_sparse(name, mask, n_sparse, decisions, kernel_calls):
    # Lens masks every joint call: with no text mask (here) or an all-true one (CASES) that mask is all zeros and
    # the calls run sparse; a padded prompt's mask (Lens, Ideogram 4's segments, Mage-Flow's Qwen-Image blocks)
    # keeps every joint call dense, computed exactly as without the node
    case = CASES[name]
    extra = {k: v for k, v in case.cond_extra.items() if k != "attention_mask"}
    if mask == "padded":
        extra["attention_mask"] = PADDED
    case = dataclasses.replace(case, cond_extra=extra)
    mp = _patcher(case)
    out = _sample(patch.apply_piecewise_sparse_attention(mp, **KNOBS), case)
    joint = [r for r in decisions() if r["q_len"] == r["k_len"] == case.joint]
    assert len(joint) == 12 and len(kernel_calls) == n_sparse == sum(r["sparse"] for r in joint)
    if not n_sparse:
        assert {r["reason"] for r in joint} == {"attention mask present"}
        assert torch.equal(out, _sample(patch.apply_piecewise_sparse_attention(mp, variant="off"), case))


def test_wan22_a14b_two_experts_count_dense_steps_over_the_whole_schedule(decisions):
    # Wan2.2 A14B: a high-noise and a low-noise expert (two loaders, two nodes), KSamplerAdvanced steps 0-3 of
    # 8 with leftover noise, then 3-8 on the other expert: dense_steps 2 means steps 0 and 1 of all 8
    case = dataclasses.replace(CASES["wan22_ti2v_5b"], supported="WAN21_T2V", cfg=dict(WAN_TINY, image_model="wan2.1"),
                               latent=(1, 16, 3, 32, 32))
    knobs = dict(KNOBS, dense_steps=2, dense_blocks=())
    high = patch.apply_piecewise_sparse_attention(_patcher(case, seed=0), **knobs)
    low = patch.apply_piecewise_sparse_attention(_patcher(case, seed=1), **knobs)
    cond, neg = _conds(case)
    noise = torch.randn(case.latent, generator=torch.Generator().manual_seed(0))
    half = comfy.sample.sample(high, noise, 8, 1.0, "euler", "simple", cond, neg, torch.zeros(case.latent),
                               last_step=3, seed=0, disable_pbar=True)
    n_high = len(decisions())
    out = comfy.sample.sample(low, noise, 8, 1.0, "euler", "simple", cond, neg, half, disable_noise=True,
                              start_step=3, seed=0, disable_pbar=True)
    assert torch.isfinite(out).all()
    rows = [r for r in decisions() if r["q_len"] == r["k_len"]]
    first = {(r["step"], r["sparse"]) for r in decisions()[:n_high] if r["q_len"] == r["k_len"]}
    assert sorted(first) == [(0, False), (1, False), (2, True)]
    assert sorted({(r["step"], r["sparse"]) for r in rows}) == [(0, False), (1, False)] + [(s, True) for s in range(2, 8)]
    assert {r["n_steps"] for r in decisions()[n_high:]} == {8}  # the second pass knows the whole schedule


def test_text_behind_the_grid_runs_as_text_in_front():
    # the node's permutation for text last equals running the operator with that text moved to the front
    from psa_pack.kernels import piecewise_sparse_attention
    from psa_pack.nodes.models import token_order

    grid, n_txt = (2, 8, 8), 40
    q, k, v = (torch.randn(1, 2, 128 + n_txt, 64, generator=torch.Generator().manual_seed(i)) for i in range(3))
    ov = patch.SparseAttentionOverride(patch.policy.Knobs(density=0.25, min_tokens=0, dense_steps=0, dense_blocks=(),
                                                          backend="torch"), family="hunyuan_video", total_blocks=4)
    info = patch.ForwardInfo("hunyuan_video", grid, 0, n_suffix=n_txt)
    out = ov(lambda *a, **k: None, q, k, v, 2, skip_reshape=True, skip_output_reshape=True,
             transformer_options={"block_index": 1, "psa_forward": info})
    front = torch.cat([q[..., 128:, :], q[..., :128, :]], dim=-2), torch.cat([k[..., 128:, :], k[..., :128, :]], -2), \
        torch.cat([v[..., 128:, :], v[..., :128, :]], -2)
    ref = piecewise_sparse_attention(*front, density=0.25, band=1, n_sink_blocks=1, reorder="morton", grid=grid,
                                     n_prefix=n_txt, backend="torch")
    torch.testing.assert_close(out, torch.cat([ref[..., n_txt:, :], ref[..., :n_txt, :]], dim=-2))
    perm, inv = token_order(0, grid, n_txt, True, CPU)
    assert torch.equal(perm[inv], torch.arange(128 + n_txt)) and perm[:n_txt].tolist() == list(range(128, 168))

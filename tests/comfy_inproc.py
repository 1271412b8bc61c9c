"""In-process ComfyUI for tests: import its modules from the checkout, load this pack by path, and build
tiny Wan2.1 / FLUX models with deterministic weights (ComfyUI's layers skip weight init)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

from comfy_server import ROOT, comfyui_path

PACK = "psa_pack"  # the repo root imported as a package under this name (its folder name is arbitrary)


def load_pack():
    """The repo root as package `psa_pack` (so nodes/ resolve `..kernels` like inside ComfyUI)."""
    if PACK in sys.modules:
        return sys.modules[PACK]
    spec = importlib.util.spec_from_file_location(PACK, ROOT / "__init__.py", submodule_search_locations=[str(ROOT)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[PACK] = mod
    spec.loader.exec_module(mod)
    return mod


def import_comfy():
    """Put the ComfyUI checkout on sys.path (CPU) and return it."""
    path = comfyui_path()
    if path is None:
        return None
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    import comfy.options

    comfy.options.args_parsing = False
    import comfy.cli_args

    comfy.cli_args.args.cpu = True
    import comfy.model_management  # noqa: F401
    return path


def init_weights(module: torch.nn.Module, seed: int = 0, std: float = 0.05) -> torch.nn.Module:
    """Deterministic small weights: norms 1, biases 0, matrices N(0, std)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() <= 1:
                p.copy_(torch.ones_like(p) if "norm" in name or name.endswith("scale") else torch.zeros_like(p))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)
            if "modulation" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return module


WAN_TINY = dict(model_type="t2v", dim=256, ffn_dim=512, num_heads=2, num_layers=4, freq_dim=256, text_dim=4096,
                in_dim=16, out_dim=16)


def tiny_wan(**overrides):
    import comfy.ops
    from comfy.ldm.wan.model import WanModel

    cfg = dict(WAN_TINY, **overrides)
    return init_weights(WanModel(operations=comfy.ops.disable_weight_init, **cfg).float())


FLUX_TINY = dict(in_channels=16, out_channels=16, vec_in_dim=768, context_in_dim=4096, hidden_size=128, mlp_ratio=2.0,
                 num_heads=2, depth=2, depth_single_blocks=2, axes_dim=[16, 24, 24], theta=10000, patch_size=2,
                 qkv_bias=True, guidance_embed=True)


def flux_config(**overrides) -> dict:
    """FLUX_TINY for this ComfyUI: 0.33's FluxParams requires txt_ids_dims (model detection sets [] for FLUX.1)."""
    import dataclasses

    from comfy.ldm.flux.model import FluxParams

    cfg = dict(FLUX_TINY, **overrides)
    if "txt_ids_dims" in {f.name for f in dataclasses.fields(FluxParams)}:
        cfg.setdefault("txt_ids_dims", [])
    return cfg


def tiny_flux(**overrides):
    import comfy.ops
    from comfy.ldm.flux.model import Flux

    cfg = flux_config(**overrides)
    return init_weights(Flux(operations=comfy.ops.disable_weight_init, **cfg).float())


def tiny_patcher(family: str):
    """A CPU ModelPatcher around ComfyUI's own model class of `family` ("flux", "wan_i2v", else Wan2.1 T2V) at the
    tiny configs above, float32, deterministic weights."""
    import comfy.model_patcher
    import comfy.supported_models

    if family == "flux":
        mc = comfy.supported_models.Flux(dict(flux_config(), image_model="flux"))
    elif family == "wan_i2v":
        mc = comfy.supported_models.WAN21_I2V(dict(WAN_TINY, image_model="wan2.1", model_type="i2v", in_dim=36))
    else:
        mc = comfy.supported_models.WAN21_T2V(dict(WAN_TINY, image_model="wan2.1"))
    cpu = torch.device("cpu")
    mb = mc.get_model({}, device=cpu)
    init_weights(mb.diffusion_model)
    mb.diffusion_model.float()
    return comfy.model_patcher.ModelPatcher(mb, load_device=cpu, offload_device=cpu)

"""Per model family: which blocks there are, and the token layout of one forward.

`model_spec(model)` finds the family from the diffusion model's class hierarchy (policy.model_family) and
reads the block counts from the model itself. `forward_info(family, diffusion_model, args, kwargs)` reads,
from the arguments of one forward (the DIFFUSION_MODEL wrapper's), how the tokens of a joint self-attention
call are laid out:

    [ n_prefix exact tokens | prod(grid) latent tokens in raster order | n_suffix exact tokens ]

Prefix/suffix are text (FLUX, FLUX.2, Qwen-Image, MageFlow, Z-Image, HunyuanVideo 1.5, Krea 2, Ideogram 4: in front;
HunyuanVideo on ComfyUI <= 0.3.x, Lens, JoyImage: text last), pad tokens (Z-Image pads the image to a multiple of
32 tokens at the end), for MiniMax-H3 the whole packed sequence in front of the target video (text, keyframe
and reference rows, the target audio), or Wan's extra latent tokens: a Fun model's reference image in front (ref_conv)
and Bernini's in-context latents behind (ComfyUI 0.33).
Other self-attention calls of the forward whose length is known (a text refiner, Kandinsky 5's text encoder
blocks, Z-Image's image refiner, LTX-2's audio stream) are named in `side` so the policy keeps them dense
without a warning.

`token_order(...)` gives the one permutation the node applies when text sits behind the latent tokens: the
exact tokens first, then the latent tokens (Morton or raster), inverted on the output; the operator then sees
an ordinary prefix of sink blocks. No ComfyUI import here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..kernels.reorder import front_order
from . import policy


@dataclass(frozen=True)
class ModelSpec:
    family: str | None
    reason: str | None  # why the model passes through dense (family None)
    total_blocks: int = 0
    n_double: int = 0  # blocks numbered per type: single-stream block i is global block n_double + i


def _hierarchy(obj) -> list[tuple[str, str]]:
    return [(c.__module__, c.__name__) for c in type(obj).__mro__]


# each family's transformer block lists in global block order (two lists: double-stream blocks, then single-stream)
_BLOCK_LISTS = {"wan": ("blocks",), "flux": ("double_blocks", "single_blocks"),
                "hunyuan_video": ("double_blocks", "single_blocks"), "qwen_image": ("transformer_blocks",),
                "lumina2": ("layers",), "ltxv": ("transformer_blocks",), "kandinsky5": ("visual_transformer_blocks",),
                "cosmos_predict2": ("blocks",), "cogvideox": ("blocks",), "lens": ("transformer_blocks",),
                "joyimage": ("double_blocks",), "krea2": ("blocks",), "ideogram4": ("layers",),
                "minimax_h3": ("blocks",)}


def _block_lists(family: str, dm) -> list[list]:
    """The family's block lists of `dm` (AttributeError / TypeError when its structure is another)."""
    return [list(getattr(dm, name)) for name in _BLOCK_LISTS[family]]


def model_spec(model) -> ModelSpec:
    """Family and block counts of a ComfyUI ModelPatcher (anything with .model.diffusion_model)."""
    base = getattr(model, "model", None)
    dm = getattr(base, "diffusion_model", None)
    family, reason = policy.model_family(_hierarchy(dm), f"{type(base).__name__} ({type(dm).__name__})")
    if family is None:
        return ModelSpec(None, reason)
    if family not in _BLOCK_LISTS:
        return ModelSpec(None, f"unknown family {family}")
    try:
        lists = _block_lists(family, dm)
    except (AttributeError, TypeError) as e:  # a class of the family with another structure
        return ModelSpec(None, f"{type(base).__name__} ({type(dm).__name__}) has no block list of the "
                               f"{family} layout ({e}); attention stays dense")
    return ModelSpec(family, None, sum(len(x) for x in lists), len(lists[0]) if len(lists) == 2 else 0)


def block_modules(family: str, dm) -> list:
    """The transformer blocks of a diffusion model in global block order (the numbering of model_spec: single
    blocks after the double ones), [] when the structure is not the family's."""
    try:
        return [blk for x in _block_lists(family, dm) for blk in x]
    except (AttributeError, TypeError, KeyError):
        return []


@dataclass(frozen=True)
class ForwardInfo:
    family: str
    grid: tuple[int, ...] | None  # the latent token grid
    n_prefix: int  # exact tokens before the grid
    reason: str | None = None  # the whole forward stays dense (with this reason)
    sigma: float | None = None  # read once per forward: on a GPU each read of a tensor is a device sync
    step: tuple[int, int] | None = None
    timing_known: bool = False
    sigmas: tuple[float, ...] | None = None  # each sample's sigma (read while training: per-sample decisions)
    n_suffix: int = 0  # exact tokens after the grid
    side: tuple[tuple[int, str], ...] = ()  # (length, policy.SIDE_STREAMS key) of other self-attention calls
    # the joint calls' mask is all zeros (additive), i.e. none: the model builds one for every call and this
    # forward's own mask argument shows it masks nothing (Lens with an unpadded prompt)
    zero_mask: bool = False

    @property
    def n_tokens(self) -> int | None:
        return None if self.grid is None else self.n_prefix + math.prod(self.grid) + self.n_suffix

    def mask_is_none(self, mask, q_len: int) -> bool:
        """True when `mask`, passed with a joint call of `q_len` tokens, is the [B, 1, 1, L] all-zero additive mask
        this forward's model builds from an all-true text mask (`zero_mask`), so the call counts as unmasked."""
        return (self.zero_mask and isinstance(mask, torch.Tensor) and mask.dim() == 4
                and tuple(mask.shape[1:3]) == (1, 1) and int(mask.shape[-1]) == q_len == self.n_tokens)

    def side_stream(self, q_len: int) -> str | None:
        for n, kind in self.side:
            if n == q_len and n != self.n_tokens:
                return kind
        return None


def _ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def _arg(args, kwargs, i: int, name: str):
    return args[i] if len(args) > i else kwargs.get(name)


def _len(t) -> int:
    return int(t.shape[-2]) if isinstance(t, torch.Tensor) and t.dim() >= 2 else 0


def _patch(dm, n: int, default) -> tuple[int, ...]:
    p = getattr(dm, "patch_size", default)
    p = tuple(p) if isinstance(p, (tuple, list)) else (int(p),) * n
    return p[-n:] if len(p) >= n else (1,) * (n - len(p)) + p


def _grid(shape, patch) -> tuple[int, ...]:
    return tuple(_ceil_div(s, p) for s, p in zip(shape, patch))


def forward_info(family: str, diffusion_model, args, kwargs) -> ForwardInfo:
    """Token layout of one forward from the diffusion model's own arguments (ComfyUI 0.3.x and 0.33)."""
    x = _arg(args, kwargs, 0, "x")
    context = _arg(args, kwargs, 2, "context")
    fn = _LAYOUTS.get(family)
    if fn is None:
        return ForwardInfo(family, None, 0, f"unknown family {family}")
    if family in ("ltxv", "minimax_h3") and isinstance(x, (list, tuple)) and x and isinstance(x[0], torch.Tensor):
        pass  # LTX-2 and MiniMax-H3 pass [video, audio]
    elif not isinstance(x, torch.Tensor):
        return ForwardInfo(family, None, 0, "latent not a tensor")
    return fn(diffusion_model, x, context, args, kwargs)


def _wan_forward_reads(dm, key: str) -> bool:
    """True when `dm` runs ComfyUI's own WanModel._forward and WanModel.forward_orig (not a subclass's: VACE, HuMo,
    S2V, Animate, SCAIL ... lay their extra tokens out their own way) and both read the kwarg `key` (0.3.64's
    forward has no `context_latents`)."""
    for name in ("_forward", "forward_orig"):
        fn = getattr(type(dm), name, None)
        code = getattr(fn, "__code__", None)
        if getattr(fn, "__qualname__", None) != f"WanModel.{name}" or getattr(fn, "__module__", None) != \
                "comfy.ldm.wan.model" or code is None or key not in code.co_consts:
            return False
    return True


def _conv_tokens(conv, shape) -> int | None:
    """Output positions of a Conv2d/Conv3d (kernel, stride, integer padding, dilation read from the module) over the
    spatial `shape`; None when its settings are not plain integers."""
    n = len(shape)
    vals = []
    for name in ("kernel_size", "stride", "padding", "dilation"):
        v = getattr(conv, name, None)
        v = (v,) * n if isinstance(v, int) else v
        if not (isinstance(v, (tuple, list)) and len(v) == n and all(isinstance(i, int) for i in v)):
            return None
        vals.append(v)
    out = 1
    for s, k, st, p, d in zip(shape, *vals):
        out *= max(0, (int(s) + 2 * p - d * (k - 1) - 1) // st + 1)
    return out


def _wan(dm, x, context, args, kwargs) -> ForwardInfo:
    # [Fun reference tokens | video grid (t, h, w raster) | Bernini in-context latents' tokens], read only under
    # WanModel's own forward: with `ref_conv` (Wan2.1 Fun 1.1, Wan2.2 Fun Control) forward_orig puts
    # ref_conv(reference_latent) ([B, C, H, W], not padded: a Conv2d of kernel = stride = patch) in front; ComfyUI
    # 0.33 appends each of `context_latents` ([B, C, T, H, W], padded to the patch by _forward, then
    # patch_embedding) behind. Other subclasses' forwards: 0 extra tokens (their calls stay dense by token count).
    if x.dim() != 5:
        return ForwardInfo("wan", None, 0, f"Wan latent of rank {x.dim()}, expected 5")
    p = _patch(dm, 3, (1, 2, 2))
    t = x.shape[2]
    tdc = _arg(args, kwargs, 4, "time_dim_concat")
    if isinstance(tdc, torch.Tensor):
        t = _ceil_div(t, p[0]) * p[0] + tdc.shape[2]
    grid = _grid((t, x.shape[3], x.shape[4]), p)
    reason, n_ref, n_ctx = None, 0, 0
    ref = kwargs.get("reference_latent")
    if ref is not None and getattr(dm, "ref_conv", None) is not None and _wan_forward_reads(dm, "reference_latent"):
        n = _conv_tokens(dm.ref_conv, ref.shape[2:]) if isinstance(ref, torch.Tensor) and ref.dim() == 4 else None
        if n is None:
            reason = (f"Wan Fun reference latent {tuple(getattr(ref, 'shape', ()))} or its ref_conv unreadable: its "
                      f"token count is not read here")
        n_ref = n or 0
    lats = kwargs.get("context_latents")
    if lats is not None and _wan_forward_reads(dm, "context_latents"):
        if isinstance(lats, (list, tuple)) and all(isinstance(c, torch.Tensor) and c.dim() == 5 for c in lats):
            n_ctx = sum(math.prod(_grid(c.shape[2:], p)) for c in lats)
        else:
            reason = reason or ("Bernini context latents are not a list of 5D latents: their token count is not "
                                "read here")
    n_tokens = n_ref + math.prod(grid) + n_ctx
    if reason is None and isinstance(context, torch.Tensor) and context.shape[1] == n_tokens:
        # old ComfyUI has no block index: self and cross-attention would be indistinguishable
        reason = (f"the text context has as many tokens as the video ({context.shape[1]}); this ComfyUI "
                  f"gives no block index, so self- and cross-attention cannot be told apart")
    return ForwardInfo("wan", grid, n_ref, reason, n_suffix=n_ctx)


def _flux(dm, x, context, args, kwargs) -> ForwardInfo:
    # FLUX.1 (patch 2 over a 16-channel latent) and FLUX.2 (patch 1 over a 128-channel latent): text first
    if x.dim() != 4:
        return ForwardInfo("flux", None, 0, f"FLUX latent of rank {x.dim()}, expected 4")
    return ForwardInfo("flux", _grid(x.shape[2:], _patch(dm, 2, 2)), _len(context))


def _qwen_image(dm, x, context, args, kwargs) -> ForwardInfo:
    # [B, C, T, H, W] (T = 1 for an image; the layered variant stacks T images); MageFlow: [B, 128, H, W] at
    # patch 1 (its blocks are Qwen-Image's); text first
    if x.dim() not in (4, 5):
        return ForwardInfo("qwen_image", None, 0, f"Qwen-Image latent of rank {x.dim()}, expected 4 or 5")
    hw = _grid(x.shape[-2:], _patch(dm, 2, 2))
    t = x.shape[2] if x.dim() == 5 else 1
    return ForwardInfo("qwen_image", hw if t == 1 else (t, *hw), _len(context))


def _lumina2(dm, x, context, args, kwargs) -> ForwardInfo:
    # main layers: [caption | image | pad]; Z-Image pads caption and image each to a multiple of
    # pad_tokens_multiple (32). Before them the caption refiner sees the caption alone, the noise refiner the
    # padded image alone.
    if x.dim() != 4:
        return ForwardInfo("lumina2", None, 0, f"Lumina 2 / Z-Image latent of rank {x.dim()}, expected 4")
    grid = _grid(x.shape[-2:], _patch(dm, 2, 2))
    m = getattr(dm, "pad_tokens_multiple", None) or 1
    cap = _len(context) if isinstance(context, torch.Tensor) else 0
    cap = cap + (-cap) % m if cap else (m if m > 1 else 0)
    pad = (-math.prod(grid)) % m
    return ForwardInfo("lumina2", grid, cap, n_suffix=pad,
                       side=((cap, "text"), (math.prod(grid) + pad, "image")))


def _hunyuan_video(dm, x, context, args, kwargs) -> ForwardInfo:
    # text = the refined prompt + ByT5 glyph tokens + vision tokens (1.5 i2v). In ComfyUI 0.33 the text comes
    # first in double and single blocks; ComfyUI 0.3.x (HunyuanVideo 1.0, `flipped_img_txt`) puts it last.
    ps = getattr(dm, "patch_size", None)
    nd = len(ps) if isinstance(ps, (list, tuple)) and len(ps) in (2, 3) else 3  # 2: HunyuanImage 2.1
    if x.dim() != nd + 2:
        return ForwardInfo("hunyuan_video", None, 0, f"HunyuanVideo latent of rank {x.dim()}, expected {nd + 2}")
    grid = _grid(x.shape[2:], _patch(dm, nd, (1, 2, 2)))
    n_ctx = _len(context)
    n_txt = n_ctx
    if getattr(dm, "byt5_in", None) is not None:
        n_txt += _len(_arg(args, kwargs, 4, "txt_byt5"))
    if getattr(dm, "vision_in", None) is not None:
        n_txt += _len(_arg(args, kwargs, 5, "clip_fea"))
    blocks = getattr(dm, "double_blocks", None)
    text_last = bool(blocks) and bool(getattr(blocks[0], "flipped_img_txt", False))
    side = ((n_ctx, "text"),)  # the token refiner (txt_in) attends over the prompt alone
    if text_last:
        return ForwardInfo("hunyuan_video", grid, 0, n_suffix=n_txt, side=side)
    return ForwardInfo("hunyuan_video", grid, n_txt, side=side)


def _ltxv(dm, x, context, args, kwargs) -> ForwardInfo:
    # video self-attention over the latent grid only (text enters by cross-attention); LTX-2 (LTXAV) passes
    # [video, audio] and runs a separate audio self-attention over the audio frames
    vx = x[0] if isinstance(x, (list, tuple)) else x
    if vx.dim() != 5:
        return ForwardInfo("ltxv", None, 0, f"LTX latent of rank {vx.dim()}, expected 5")
    patchifier = getattr(dm, "patchifier", None)
    p = tuple(getattr(patchifier, "_patch_size", None) or getattr(patchifier, "patch_size", None) or (1, 1, 1))
    p = p if len(p) == 3 else (1, 1, 1)
    grid = _grid(vx.shape[2:], p)
    side = ()
    if isinstance(x, (list, tuple)) and len(x) > 1 and isinstance(x[1], torch.Tensor) and x[1].dim() == 4:
        side = ((int(x[1].shape[2]), "audio"),)
    return ForwardInfo("ltxv", grid, 0, side=side)


def _kandinsky5(dm, x, context, args, kwargs) -> ForwardInfo:
    # video (and image: a 4D latent, one frame) self-attention over the patched grid in raster order; text enters by
    # cross-attention, and the text encoder blocks attend over the prompt alone before the visual blocks
    if x.dim() not in (4, 5):
        return ForwardInfo("kandinsky5", None, 0, f"Kandinsky 5 latent of rank {x.dim()}, expected 4 or 5")
    p = _patch(dm, 3, (1, 2, 2))
    side = ((_len(context), "text"),)
    if x.dim() == 4:
        return ForwardInfo("kandinsky5", _grid(x.shape[-2:], p[1:]), 0, side=side)
    return ForwardInfo("kandinsky5", _grid(x.shape[2:], p), 0, side=side)


def _cosmos_predict2(dm, x, context, args, kwargs) -> ForwardInfo:
    # self-attention over the patched (T, H, W) grid in raster order (one frame for the text-to-image models and
    # Anima: a 2D grid); text enters by cross-attention only
    if x.dim() != 5:
        return ForwardInfo("cosmos_predict2", None, 0, f"Cosmos latent of rank {x.dim()}, expected 5")
    ps, pt = int(getattr(dm, "patch_spatial", 2)), int(getattr(dm, "patch_temporal", 1))
    grid = _grid(x.shape[2:], (pt, ps, ps))
    return ForwardInfo("cosmos_predict2", grid[1:] if grid[0] == 1 else grid, 0)


def _cogvideox(dm, x, context, args, kwargs) -> ForwardInfo:
    # joint text + video attention, the text (the T5 prompt, padded to 226 tokens by its tokenizer) in front of the
    # patched (T, H, W) grid in raster order; patch_size_t: CogVideoX 1.5's temporal patch (1.0: none)
    if x.dim() != 5:
        return ForwardInfo("cogvideox", None, 0, f"CogVideoX latent of rank {x.dim()}, expected 5")
    ps, pt = int(getattr(dm, "patch_size", 2)), int(getattr(dm, "patch_size_t", None) or 1)
    return ForwardInfo("cogvideox", _grid(x.shape[2:], (pt, ps, ps)), _len(context))


def _lens(dm, x, context, args, kwargs) -> ForwardInfo:
    # [image | text]: the image tokens are the latent's pixels in raster order (the 128-channel FLUX.2 latent is
    # already 2x2-packed), the text behind them. Every joint call gets a [B, 1, 1, L] additive mask built from the
    # forward's text mask (all true when none is given): all zeros, i.e. no mask, exactly when that text mask is
    # all true (read once per forward); a padded prompt's mask keeps the calls dense.
    if x.dim() != 4:
        return ForwardInfo("lens", None, 0, f"Lens latent of rank {x.dim()}, expected 4")
    mask = _arg(args, kwargs, 3, "attention_mask")
    zero = mask is None or (isinstance(mask, torch.Tensor) and bool((mask != 0).all()))
    return ForwardInfo("lens", tuple(int(s) for s in x.shape[-2:]), 0, n_suffix=_len(context), zero_mask=zero)


def _joyimage(dm, x, context, args, kwargs) -> ForwardInfo:
    # [image (T, H, W patches, raster) | reference images | text]; no mask. Reference images add tokens between the
    # grid and the text: their calls stay dense (token count)
    if x.dim() != 5:
        return ForwardInfo("joyimage", None, 0, f"JoyImage latent of rank {x.dim()}, expected 5")
    grid = _grid(x.shape[2:], _patch(dm, 3, (1, 2, 2)))
    return ForwardInfo("joyimage", grid[1:] if grid[0] == 1 else grid, 0, n_suffix=_len(context))


def _krea2(dm, x, context, args, kwargs) -> ForwardInfo:
    # single stream [text | image (patch 2, raster)], no mask; a 5D latent runs its frames as a batch of images.
    # The text fusion adapter attends over each token's txtlayers features, then over the prompt alone (text)
    if x.dim() not in (4, 5):
        return ForwardInfo("krea2", None, 0, f"Krea 2 latent of rank {x.dim()}, expected 4 or 5")
    p = int(getattr(dm, "patch", 2))
    n_txt = _len(context)
    side = ((n_txt, "text"),)
    if getattr(dm, "txtlayers", None):
        side += ((int(dm.txtlayers), "text"),)
    return ForwardInfo("krea2", _grid(x.shape[-2:], (p, p)), n_txt, side=side)


def _ideogram4(dm, x, context, args, kwargs) -> ForwardInfo:
    # single stream [text | image]: the image tokens are the latent's pixels in raster order (the 128-channel FLUX.2
    # latent is already 2x2-packed); a padded prompt gets a segment mask (its calls stay dense), none otherwise
    if x.dim() != 4:
        return ForwardInfo("ideogram4", None, 0, f"Ideogram 4 latent of rank {x.dim()}, expected 4")
    return ForwardInfo("ideogram4", tuple(int(s) for s in x.shape[-2:]), _len(context))


def _minimax_h3(dm, x, context, args, kwargs) -> ForwardInfo:
    # one packed sequence [text | keyframe cond rows | reference blocks | target audio | target video], batch 1; the
    # target video is last, patchified (1, 2, 2) in (t, h, w) raster order: everything in front of it is the exact
    # prefix. Its segment table is the PackedLayout that model_base prebuilds into the payload; the forward uses it
    # only when its signature matches (else it builds its own from the payload's keyframes/refs): we read the
    # prefix from that layout under the same check, or, with no keyframes and no references, as text + 2 x audio
    # frames (stereo rows). The token refiner attends over the prompt alone (text); model_base runs it once per
    # sampling run outside any forward, so it appears only when the context comes unrefined.
    if not (isinstance(x, (list, tuple)) and len(x) >= 2 and all(isinstance(t, torch.Tensor) for t in x[:2])):
        return ForwardInfo("minimax_h3", None, 0, "MiniMax-H3 latent is not a [video, audio] pair")
    vx, ax = x[0], x[1]
    if vx.dim() != 5 or ax.dim() < 2:
        return ForwardInfo("minimax_h3", None, 0, f"MiniMax-H3 latents of rank {vx.dim()}/{ax.dim()}, expected 5/4")
    if vx.shape[0] != 1:
        return ForwardInfo("minimax_h3", None, 0, f"MiniMax-H3 batch of {vx.shape[0]} (the model takes 1)")
    p = _patch(dm, 3, (1, 2, 2))
    if p != (1, 2, 2):
        return ForwardInfo("minimax_h3", None, 0, f"MiniMax-H3 patch {p}, its packed layout is built for (1, 2, 2)")
    grid = _grid(vx.shape[2:], p)
    n_text, audio_t = _len(context), int(ax.shape[-1])
    side = ((n_text, "text"),)
    payload = kwargs.get("minimax_payload") or {}
    if not isinstance(payload, dict):
        return ForwardInfo("minimax_h3", None, 0, "MiniMax-H3 payload unreadable")
    layout = payload.get("layout")
    signature = (n_text, grid[0] * p[0], grid[1] * p[1], grid[2] * p[2], audio_t)
    if layout is not None and tuple(getattr(layout, "signature", ())) == signature:
        segs = list(getattr(layout, "segments", ()))
        if not segs or segs[-1][2] != "video" or segs[-1][1] != int(layout.seq_len) \
                or segs[-1][1] - segs[-1][0] != math.prod(grid):
            return ForwardInfo("minimax_h3", None, 0, "MiniMax-H3 packed layout without the target video last")
        return ForwardInfo("minimax_h3", grid, int(segs[-1][0]), side=side)
    if payload.get("keyframes") or payload.get("refs"):
        return ForwardInfo("minimax_h3", None, 0, "MiniMax-H3 keyframes/references without a prebuilt packed "
                                                  "layout: their token count is not read here")
    return ForwardInfo("minimax_h3", grid, n_text + 2 * audio_t, side=side)


_LAYOUTS = {"wan": _wan, "flux": _flux, "qwen_image": _qwen_image, "lumina2": _lumina2,
            "hunyuan_video": _hunyuan_video, "ltxv": _ltxv, "kandinsky5": _kandinsky5,
            "cosmos_predict2": _cosmos_predict2, "cogvideox": _cogvideox, "lens": _lens, "joyimage": _joyimage,
            "krea2": _krea2, "ideogram4": _ideogram4, "minimax_h3": _minimax_h3}


# ---------------------------------------------------------------------------------------------------
# one token permutation for layouts with exact tokens behind the grid

# the one permutation for exact tokens behind the grid (kernels.reorder.front_order; the Ulysses adapter uses it too)
token_order = front_order

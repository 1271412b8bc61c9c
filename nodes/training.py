"""What the override needs while a model patched by the node is trained (ComfyUI's "Train LoRA": the normal
sampler path under autograd, gradient checkpointing on by default, random per-sample sigmas).

- Training = autograd on and the attention call part of it (is_training). There is no schedule then: the
  policy judges each sample's own sigma (policy.training_dense_fraction documents what dense_steps means).
  Known limit: in ComfyUI 0.3.64 (no in_training flag) a block whose q, k, v need no gradient in the forward
  (nothing trainable upstream of its attention) but is recomputed (trainable weights after it) is judged as
  sampling in the forward and as training in the recompute. Train LoRA puts adapters on every weight, so
  every block's q needs a gradient there.
- Gradient checkpointing runs every checkpointed block twice: in the forward and again inside the backward
  (recompute), and the recompute must save the same tensors, so it must take the same decisions. What the
  forward read from transformer_options is not there any more when the recompute runs (our per-forward layout
  entry, newer ComfyUI's `block_index` was overwritten by the last block, the per-forward call counter has
  moved on). So while training, the block index comes from the call stack (the frame of the block module's,
  or one of its submodules', forward: the same in forward and recompute) and the layout entry stays in the
  forward's own transformer_options (a fresh dict per model call) instead of being removed.
"""
from __future__ import annotations

import sys
import weakref

import torch

_BLOCKS: dict[str, tuple[weakref.ref, dict[int, int], frozenset]] = {}  # override uid -> (model, ids, codes)


def grad_mode() -> bool:
    return torch.is_grad_enabled()


def is_training(*xs) -> bool:
    """Autograd is on and this attention call is part of it: q/k/v need gradients, or the call is a
    checkpointed block's recompute, or ComfyUI says it is training (comfy.model_management.in_training, 0.33+).
    ComfyUI samples under inference mode, so sampling is never training."""
    if not torch.is_grad_enabled():
        return False
    if any(isinstance(x, torch.Tensor) and x.requires_grad for x in xs) or in_recompute():
        return True
    mm = sys.modules.get("comfy.model_management")
    return bool(getattr(mm, "in_training", False))


def in_recompute() -> bool:
    """True inside the autograd engine (a checkpointed block recomputed during the backward)."""
    fn = getattr(torch._C, "_current_graph_task_id", None)
    return fn is not None and fn() != -1


def is_checkpoint_stop(e: BaseException) -> bool:
    """torch.utils.checkpoint stops a recompute once it has every tensor it needs by raising this (private)
    exception from inside whatever op runs then: it must pass through the override, never become dense."""
    ckpt = sys.modules.get("torch.utils.checkpoint")
    stop = getattr(ckpt, "_StopRecomputationError", None)
    return stop is not None and isinstance(e, stop)


def register_blocks(uid: str, family: str, diffusion_model) -> None:
    """Remember which modules belong to which transformer block (global index, FLUX single blocks after the
    double ones) and the code objects of their forwards, once per diffusion model."""
    hit = _BLOCKS.get(uid)
    if diffusion_model is None or (hit is not None and hit[0]() is diffusion_model):
        return
    ids: dict[int, int] = {}
    codes = set()
    from .models import block_modules

    for i, blk in enumerate(block_modules(family, diffusion_model)):
        if not isinstance(blk, torch.nn.Module):  # a stand-in or another structure: that block stays unknown
            continue
        for m in blk.modules():
            ids[id(m)] = i
            code = getattr(getattr(type(m), "forward", None), "__code__", None)
            if code is not None:
                codes.add(code)
    _BLOCKS[uid] = (weakref.ref(diffusion_model), ids, frozenset(codes))


def block_from_stack(uid: str, max_depth: int = 64) -> int | None:
    """The index of the transformer block whose forward (or a submodule's) is on the call stack, else None."""
    hit = _BLOCKS.get(uid)
    if hit is None or hit[0]() is None:
        return None
    _, ids, codes = hit
    f = sys._getframe(1)
    for _ in range(max_depth):
        if f is None:
            return None
        if f.f_code in codes:
            b = ids.get(id(f.f_locals.get("self")))
            if b is not None:
                return b
        f = f.f_back
    return None


def sample_sigmas(to: dict, info) -> tuple[float, ...] | None:
    """Each sample's sigma in this forward (the forward wrapper read them once), else from transformer_options."""
    sig = getattr(info, "sigmas", None) if info is not None else None
    if sig:
        return sig
    t = to.get("sigmas")
    if isinstance(t, torch.Tensor) and t.numel():
        return tuple(float(x) for x in t.detach().flatten().float().cpu().tolist())
    return None


def per_row(sigmas: tuple[float, ...] | None, batch: int) -> list[float | None]:
    """The sigma of each of the `batch` rows of q (conditioning chunks repeat the samples: [c0..cn, u0..un])."""
    if not sigmas:
        return [None] * batch
    n = len(sigmas)
    if batch % n == 0:
        return [sigmas[b % n] for b in range(batch)]
    return [sigmas[0]] * batch

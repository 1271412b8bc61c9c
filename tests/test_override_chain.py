"""Chain order with ComfyUI core's "Model Sparse Attention" node (issue 12, class 8): the sparse node nearer the
sampler decides every call, the other is skipped with one log line, and never are both sparse on one call.

The core node (comfy_extras/nodes_sparse_attention.py, ComfyUI from 2026-09, in neither local snapshot) is played by
a stand-in that behaves like it: its override is a closure over its state (`patch`) and the override it found
(`previous`), declined calls go to `previous` (else ComfyUI's function), and it re-installs itself on top at every
ON_PREPARE_STATE. The sampler is the newest ComfyUI's flow in miniature: the sampler's own copy of model_options,
ON_PREPARE_STATE callbacks with (patcher, timestep, model_options) before every step, a fresh transformer_options
dict per forward run through the DIFFUSION_MODEL wrappers, and `wrap_attn`'s call of the override on top.
"""
from __future__ import annotations

import logging
import types

import pytest
import torch

from comfy_inproc import load_pack

load_pack()
from psa_pack.nodes import patch  # noqa: E402

OVERRIDE = "optimized_attention_override"
GRID, HEADS, D = (3, 8, 16), 2, 64
T = GRID[0] * GRID[1] * GRID[2]
N_BLOCKS, STEPS = 4, 3
SIGMAS = torch.tensor([1.0, 0.6, 0.3, 0.0])


# ------------------------------------------------------------------------------------------------- the core node
class CoreState:
    """The core node's per-model state (its SparseAttnPatch): which calls it takes, what it did."""

    def __init__(self, dense_blocks=()):
        self.dense_blocks = set(dense_blocks)
        self.installed = set()
        self.sparse = 0  # calls it computed itself
        self.seen = 0  # calls that reached one of its overrides


def make_core_override(patch, previous):  # the closure variables are named as in the core node
    def override(func, q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False,
                 **kwargs):
        transformer_options = kwargs.get("transformer_options") or {}
        patch.seen += 1

        def dense():
            kw = dict(mask=mask, attn_precision=attn_precision, skip_reshape=skip_reshape,
                      skip_output_reshape=skip_output_reshape, **kwargs)
            return func(q, k, v, heads, **kw) if previous is None else previous(func, q, k, v, heads, **kw)

        if mask is not None or q.shape[1] != k.shape[1] or transformer_options.get("block_index") in patch.dense_blocks:
            return dense()
        patch.sparse += 1
        return torch.full_like(q, 1000.0)  # its "sparse kernel": recognisable

    override.__module__ = "comfy_extras.nodes_sparse_attention"
    return override


def install_core(state, transformer_options):
    current = transformer_options.get(OVERRIDE)
    if current in state.installed:
        return
    ov = make_core_override(state, current)
    state.installed.add(ov)
    transformer_options[OVERRIDE] = ov


def apply_core(model, dense_blocks=()):
    state = CoreState(dense_blocks)
    m = model.clone()
    install_core(state, m.model_options["transformer_options"])
    m.add_callback_with_key("on_prepare_state", "block_sparse_attention",
                            lambda model_patcher, timestep, model_options: install_core(
                                state, model_options["transformer_options"]))
    return m, state


# ------------------------------------------------------------------------------------------- ComfyUI in miniature
def copy_nested(d):
    return {k: copy_nested(v) if isinstance(v, dict) else (list(v) if isinstance(v, list) else v) for k, v in d.items()}


class WanModel(torch.nn.Module):
    patch_size = (1, 2, 2)

    def __init__(self):
        super().__init__()
        self.blocks = [None] * N_BLOCKS


WanModel.__module__ = "comfy.ldm.wan.model"  # the family is read from the class hierarchy (nodes/models.py)


WAN21 = type("WAN21", (), {})


class Patcher:
    """What our node and the core node use of comfy.model_patcher.ModelPatcher (0.33 semantics)."""

    def __init__(self):
        self.model = WAN21()
        self.model.diffusion_model = WanModel()
        self.model_options = {"transformer_options": {}}
        self.callbacks, self.wrappers = {}, {}

    def clone(self):
        n = Patcher.__new__(Patcher)
        n.model = self.model
        n.model_options = copy_nested(self.model_options)
        n.callbacks = {k: {k1: list(c) for k1, c in v.items()} for k, v in self.callbacks.items()}
        n.wrappers = {k: {k1: list(w) for k1, w in v.items()} for k, v in self.wrappers.items()}
        return n

    def add_callback_with_key(self, kind, key, cb):
        self.callbacks.setdefault(kind, {}).setdefault(key, []).append(cb)

    def remove_callbacks_with_key(self, kind, key):
        self.callbacks.get(kind, {}).pop(key, None)

    def add_wrapper_with_key(self, kind, key, w):
        self.wrappers.setdefault(kind, {}).setdefault(key, []).append(w)

    def remove_wrappers_with_key(self, kind, key):
        self.wrappers.get(kind, {}).pop(key, None)

    def get_model_object(self, name):
        assert name == "model_sampling"
        return types.SimpleNamespace(percent_to_sigma=lambda p: 1.0 - p)

    def all_callbacks(self, kind):
        return [cb for cbs in self.callbacks.get(kind, {}).values() for cb in cbs]


class Func:
    """ComfyUI's attention function: SDPA; counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False,
                 **kwargs):
        self.calls += 1
        b, L, c = q.shape
        q, k, v = (t.view(b, -1, heads, c // heads).transpose(1, 2) for t in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return out.transpose(1, 2).reshape(b, L, c)


def sample(patcher, func):
    """STEPS steps of one forward each: per block one self-attention and one cross-attention call."""
    model_options = copy_nested(patcher.model_options)  # the sampler's copy
    for cb in patcher.all_callbacks("on_pre_run"):
        cb(patcher)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, T, HEADS * D, generator=g)
    ctx = torch.randn(1, 16, HEADS * D, generator=g)
    x = torch.zeros(1, 16, GRID[0], 2 * GRID[1], 2 * GRID[2])
    dm = patcher.model.diffusion_model
    for step in range(STEPS):
        sig = SIGMAS[step:step + 1]
        for cb in patcher.all_callbacks("on_prepare_state"):
            cb(patcher, sig, model_options)
        to = copy_nested(model_options["transformer_options"])  # this forward's own dict
        to.update(sigmas=sig, sample_sigmas=SIGMAS, cond_or_uncond=[0])

        def forward(x, timestep, context, transformer_options):
            for b in range(N_BLOCKS):
                t = dict(transformer_options, block_index=b, grid_sizes=GRID)
                for k in (q, ctx):  # wrap_attn: the override on top of this call's transformer_options
                    top = t.get(OVERRIDE)
                    args = (q, k, k, HEADS)
                    out = top(func, *args, transformer_options=t) if top is not None else func(*args)
                    assert torch.isfinite(out).all()

        executor = forward
        for w in reversed([w for ws in patcher.wrappers.get("diffusion_model", {}).values() for w in ws]):
            executor = _bind_wrapper(w, executor, dm)
        executor(x, sig, ctx, transformer_options=to)
    for cb in patcher.all_callbacks("on_cleanup"):
        cb(patcher)


def _bind_wrapper(wrapper, inner, dm):
    class Executor:
        class_obj = dm

        def __call__(self, *a, **kw):
            return inner(*a, **kw)
    return lambda *a, **kw: wrapper(Executor(), *a, **kw)


KNOBS = dict(variant="pwt", density=0.25, dense_steps=1, dense_blocks=(0, -1), min_tokens=256, backend="torch")
SELF_CALLS = STEPS * N_BLOCKS
OURS_SPARSE = (STEPS - 1) * (N_BLOCKS - 2)  # steps 1-2, blocks 1-2


@pytest.fixture
def kernel_calls(monkeypatch):
    calls = []
    real = patch.piecewise_sparse_attention

    def spy(q, k, v, **kw):
        calls.append(tuple(q.shape))
        return real(q, k, v, **kw)
    monkeypatch.setattr(patch, "piecewise_sparse_attention", spy)
    return calls


@pytest.fixture(autouse=True)
def fresh_log():
    patch._logged.clear()


def test_ours_applied_after_the_core_node_decides_every_call_and_the_core_node_is_skipped(kernel_calls, caplog):
    base = Patcher()
    m, core = apply_core(base)
    m = patch.apply_piecewise_sparse_attention(m, **KNOBS)
    func = Func()
    with caplog.at_level(logging.INFO, logger="piecewise_sparse_attention.nodes"):
        sample(m, func)
    assert core.seen == 0 and core.sparse == 0  # re-installed on top every step, never consulted
    assert len(kernel_calls) == OURS_SPARSE
    assert func.calls == 2 * SELF_CALLS - OURS_SPARSE  # every call we leave dense reaches ComfyUI's function
    skipped = [r.getMessage() for r in caplog.records if "Model Sparse Attention" in r.getMessage()]
    assert len(skipped) == 1 and "applied before this node, is skipped" in skipped[0], skipped
    # the core node did re-install itself on top of the sampler's options: the rule held anyway
    assert len(core.installed) >= 2


def test_core_node_applied_after_ours_decides_every_call_and_ours_is_skipped(kernel_calls, caplog):
    base = Patcher()
    m = patch.apply_piecewise_sparse_attention(base, **KNOBS)
    m, core = apply_core(m, dense_blocks=(0,))
    func = Func()
    with caplog.at_level(logging.INFO, logger="piecewise_sparse_attention.nodes"):
        sample(m, func)
    assert kernel_calls == []  # ours never sparse
    assert core.sparse == STEPS * (N_BLOCKS - 1)  # its own choice: every self-attention call but block 0
    assert func.calls == 2 * SELF_CALLS - core.sparse  # its dense calls pass through ours to ComfyUI's function
    lines = [r.getMessage() for r in caplog.records if "dense because" in r.getMessage()]
    assert len(lines) == 1 and "Model Sparse Attention' node is nearer the sampler" in lines[0], lines


def test_without_the_core_node_ours_runs_as_before(kernel_calls):
    m = patch.apply_piecewise_sparse_attention(Patcher(), **KNOBS)
    func = Func()
    sample(m, func)
    assert len(kernel_calls) == OURS_SPARSE and func.calls == 2 * SELF_CALLS - OURS_SPARSE


def test_a_non_sparse_override_between_the_nodes_is_still_called_for_dense_calls(kernel_calls):
    # core -> another pack's chaining override -> ours: ours decides, the middle override still sees dense calls
    seen = []

    def make_chaining(prev):
        def chaining(func, *a, **kw):
            seen.append(1)
            return func(*a, **kw) if prev is None else prev(func, *a, **kw)
        return chaining
    m, core = apply_core(Patcher())
    to = m.model_options["transformer_options"]
    to[OVERRIDE] = make_chaining(to[OVERRIDE])
    m = patch.apply_piecewise_sparse_attention(m, **KNOBS)
    func = Func()
    sample(m, func)
    assert len(kernel_calls) == OURS_SPARSE
    assert len(seen) == 2 * SELF_CALLS - OURS_SPARSE
    # the core node under the chaining override is out of our reach (we call the chaining override, it calls the
    # core node): that node may take dense calls it sees, but a call is never sparse twice (ours returns first)
    assert core.sparse + len(kernel_calls) + func.calls == 2 * SELF_CALLS

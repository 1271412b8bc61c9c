"""The attention override steps aside instead of raising (issue 12, classes 5 and 6): every call it cannot run sparse,
and every exception before or inside the sparse path, becomes a dense call through the previous override (else
ComfyUI's function) with one log line naming the reason; ComfyUI's `scale` keyword is honoured."""
from __future__ import annotations

import logging

import pytest
import torch

from comfy_inproc import load_pack

load_pack()
from psa_pack.kernels import piecewise_sparse_attention  # noqa: E402
from psa_pack.nodes import patch, policy  # noqa: E402

GRID = (3, 8, 16)
T = 384
SIGMAS = torch.tensor([1.0, 0.5, 0.25, 0.0])
LOGGER = "piecewise_sparse_attention.nodes"


class Func:
    """ComfyUI's attention function stand-in: records its arguments, returns a recognisable tensor."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, *args, **kwargs):
        self.calls.append((q, k, v, args, kwargs))
        return torch.full((1,), 7.0)


class Prev:
    """An override installed before ours: gets every call ours leaves dense."""

    def __init__(self):
        self.calls = 0

    def __call__(self, func, *args, **kwargs):
        self.calls += 1
        return func(*args, **kwargs)


def _override(prev=None, **kn):
    k = dict(density=0.25, dense_steps=0, dense_blocks=(), min_tokens=256, backend="torch")
    k.update(kn)
    return patch.SparseAttentionOverride(policy.Knobs(**k), family="wan", total_blocks=4, prev=prev)


def _opts(**kw):
    o = {"sigmas": torch.tensor([0.5]), "sample_sigmas": SIGMAS, "cond_or_uncond": [0], "block_index": 1,
         "grid_sizes": GRID}
    o.update(kw)
    return o


def _qkv(heads=2, d=64, kv_channels=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, T, heads * d, generator=g)
    c = kv_channels or heads * d
    return q, torch.randn(1, T, c, generator=g), torch.randn(1, T, c, generator=g)


def _sparse_ref(q, k, v, heads=2, **kw):
    d = q.shape[-1] // heads
    qh, kh, vh = (t.view(1, T, heads, d).transpose(1, 2) for t in (q, k, v))
    out = piecewise_sparse_attention(qh, kh, vh, density=0.25, band=1, reorder="morton", grid=GRID, backend="torch",
                                     **kw)
    return out.transpose(1, 2).reshape(1, T, -1)


def _forms():
    """(id, call arguments, opts, expected words of the reason): the calls that used to raise inside the override."""
    q, k, v = _qkv()
    q3 = torch.randn(1, T, 128)
    gq, gk, gv = _qkv(heads=4, d=32, kv_channels=64)  # 4 query heads, 2 key/value heads, flat [B, L, H*D]
    return [
        ("block_index_not_an_int", (q, k, v), dict(heads=2), _opts(block_index="first"), "block_index"),
        ("grid_sizes_rows_differ", (q, k, v), dict(heads=2), _opts(grid_sizes=torch.tensor([[3, 8, 16], [3, 8, 8]])),
         "grid_sizes"),
        ("grid_sizes_four_sizes", (q, k, v), dict(heads=2), _opts(grid_sizes=(1, 3, 8, 16)), "grid_sizes"),
        ("channels_not_divisible_by_heads", (q, k, v), dict(heads=3), _opts(), "not divisible by heads=3"),
        ("grouped_query_flat_layout", (gq, gk, gv), dict(heads=4), _opts(), "grouped-query"),
        ("enable_gqa", (q, k, v), dict(heads=2, enable_gqa=True), _opts(), "enable_gqa"),
        ("three_d_with_skip_reshape", (q3, q3, q3), dict(heads=2, skip_reshape=True), _opts(), "skip_reshape=True"),
        ("heads_missing", (q, k, v), dict(heads=None), _opts(), "heads"),
        ("scale_not_finite", (q, k, v), dict(heads=2, scale=float("nan")), _opts(), "scale"),
        ("unknown_keyword", (q, k, v), dict(heads=2, window_size=(64, 64)), _opts(), "window_size"),
        ("full_precision_requested", (q, k, v), dict(heads=2, low_precision_attention=False), _opts(),
         "low_precision_attention=False"),
        ("transformer_options_not_a_dict", (q, k, v), dict(heads=2), "opts", "transformer_options"),
        ("q_not_a_tensor", ([1.0], k, v), dict(heads=2), _opts(), "not tensors"),
    ]


FORMS = _forms()


@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
def test_calls_the_override_cannot_run_sparse_go_dense_through_the_previous_override_with_one_log_line(form, caplog):
    name, qkv, kw, opts, words = form
    patch._logged.clear()
    prev, func = Prev(), Func()
    ov = _override(prev)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(2):
            out = ov(func, *qkv, transformer_options=opts, **kw)
    assert prev.calls == 2 and len(func.calls) == 2 and torch.equal(out, torch.full((1,), 7.0))
    # the dense path gets the call exactly as ComfyUI made it (plain tensors, every keyword)
    q, k, v, _, fkw = func.calls[0]
    assert q is qkv[0] and k is qkv[1] and v is qkv[2]
    assert all(fkw[key] is val or fkw[key] == val for key, val in kw.items())
    lines = [r.getMessage() for r in caplog.records if words in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]


def test_block_index_none_is_read_as_not_given():
    # newer ComfyUI keys with a None value: counted like old ComfyUI (block 0 first), never int(None)
    func = Func()
    ov = _override(dense_blocks=(0,))
    q, k, v = _qkv()
    ov(func, q, k, v, heads=2, transformer_options=_opts(block_index=None))
    assert len(func.calls) == 1  # block 0 of this forward: a dense block
    out = ov(func, q, k, v, heads=2, transformer_options=_opts(block_index=None))
    assert len(func.calls) == 1 and out.shape == q.shape  # block 1: sparse


@pytest.mark.parametrize("grid_sizes", [torch.tensor([[3, 8, 16]]), torch.tensor([3, 8, 16]), [[3, 8, 16]],
                                        torch.Size([3, 8, 16])], ids=["tensor_1x3", "tensor_3", "nested_list", "size"])
def test_grid_sizes_in_any_container_run_sparse_like_a_tuple(grid_sizes):
    func = Func()
    q, k, v = _qkv()
    out = _override()(func, q, k, v, heads=2, transformer_options=_opts(grid_sizes=grid_sizes))
    assert func.calls == []
    torch.testing.assert_close(out, _sparse_ref(q, k, v))


def test_an_exception_while_reading_the_call_runs_dense_with_one_log_line(monkeypatch, caplog):
    def broken(*a, **k):
        raise KeyError("a policy bug")
    monkeypatch.setattr(policy, "call_reason", broken)
    patch._logged.clear()
    prev, func = Prev(), Func()
    q, k, v = _qkv()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(2):
            ov = _override(prev)
            ov(func, q, k, v, heads=2, transformer_options=_opts())
    assert prev.calls == 2 and len(func.calls) == 2
    assert sum("reading an attention call failed" in r.getMessage() for r in caplog.records) == 1
    assert "a policy bug" in caplog.text


def test_an_exception_inside_the_sparse_path_runs_dense_through_the_previous_override(monkeypatch, caplog):
    def boom(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
    monkeypatch.setattr(patch, "piecewise_sparse_attention", boom)
    patch._logged.clear()
    prev, func = Prev(), Func()
    q, k, v = _qkv()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        out = _override(prev)(func, q, k, v, heads=2, transformer_options=_opts())
    assert prev.calls == 1 and torch.equal(out, torch.full((1,), 7.0))
    assert "Tried to allocate 64.00 GiB" in caplog.text


def test_an_exception_of_the_dense_path_itself_is_not_hidden():
    def failing(q, k, v, *a, **kw):
        raise RuntimeError("dense attention failed")
    q, k, v = _qkv()
    with pytest.raises(RuntimeError, match="dense attention failed"):
        _override()(failing, q, k, v, heads=3, transformer_options=_opts())


# class 6: ComfyUI's keywords
def test_comfys_scale_keyword_is_honoured_by_the_sparse_path():
    func = Func()
    q, k, v = _qkv(seed=4)
    out = _override()(func, q, k, v, heads=2, scale=0.3, transformer_options=_opts())
    assert func.calls == []
    torch.testing.assert_close(out, _sparse_ref(q, k, v, scale=0.3))
    assert not torch.allclose(out, _sparse_ref(q, k, v), atol=1e-3)


def test_enable_gqa_false_attn_precision_and_comfys_private_markers_still_run_sparse():
    func = Func()
    q, k, v = _qkv(seed=5)
    out = _override()(func, q, k, v, heads=2, enable_gqa=False, attn_precision=torch.float32,
                      low_precision_attention=True, _inside_attn_wrapper=True, transformer_options=_opts())
    assert func.calls == []
    torch.testing.assert_close(out, _sparse_ref(q, k, v))


@pytest.mark.parametrize("stg", [(1,), [1], (1, 9), ("1",)], ids=["tuple", "list", "out_of_range", "str"])
def test_ltx_stg_skipped_blocks_are_not_counted(stg):
    # LTX's STG forward (ComfyUI 0.33.0 LTX-2, upstream LTX-Video too) runs the blocks of stg_self_attn_blocks with
    # their self-attention replaced by v, so the override sees blocks 0, 2, 3 of 4: the third call is block 3 (a
    # dense block), not block 2
    func = Func()
    ov = _override(dense_blocks=(0, -1))
    q, k, v = _qkv()
    for n_dense in (1, 1, 2):
        ov(func, q, k, v, heads=2, transformer_options=_opts(block_index=None, stg_self_attn_blocks=stg))
        assert len(func.calls) == n_dense
    # an unreadable list counts every block as before
    func2, ov2 = Func(), _override(dense_blocks=(0, -1))
    for n_dense in (1, 1, 1):
        ov2(func2, q, k, v, heads=2, transformer_options=_opts(block_index=None, stg_self_attn_blocks=[None]))
        assert len(func2.calls) == n_dense

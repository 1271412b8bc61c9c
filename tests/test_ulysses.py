"""kernels/ulysses.py: the operator inside Ulysses sequence parallelism. Routing is per head over the whole
sequence, so N ranks each running the operator on H/N heads after the all-to-all compute exactly what one
process computes for all heads; Morton order and the exact text / pad tokens are handled on the whole sequence
each rank sees. The distributed test starts 2 and 4 CPU processes itself (torch.distributed, gloo), bounded
in time. The calling conventions of yunchang (flash_attn_func-style local attention) and raylight (inner
attention processor) are exercised with the arguments those packages pass; neither is imported."""
from __future__ import annotations

import math
import time

import pytest
import torch

from comfy_inproc import load_pack

load_pack()
from psa_pack.kernels import piecewise_sparse_attention, ulysses  # noqa: E402
from psa_pack.kernels.reorder import morton_order  # noqa: E402

import ulysses_worker  # noqa: E402

# (name, grid, n_prefix, n_suffix): FLUX-like text in front; Wan-like with raylight's pads behind (S made
# divisible by the ranks); a plain Wan grid
# divisible by 2 and 4 ranks; 8-9 blocks of 64, so density 0.25 leaves most KV blocks to the virtual tokens
CASES = [dict(name="text_prefix", grid=(16, 28), n_prefix=64, n_suffix=0, heads=4, seed=1),
         dict(name="pads_behind", grid=(2, 16, 16), n_prefix=0, n_suffix=4, heads=4, seed=2),
         dict(name="video", grid=(4, 8, 16), n_prefix=0, n_suffix=0, heads=4, seed=3)]
YUNCHANG_KW = dict(dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                   alibi_slopes=None, deterministic=False, return_attn_probs=False)


def _qkv(case):
    return ulysses_worker.inputs(case)


def _one_process(case, density):
    q, k, v = _qkv(case)
    return ulysses.head_shard_attention(q, k, v, grid=case["grid"], n_prefix=case["n_prefix"],
                                        n_suffix=case["n_suffix"], density=density, backend="torch")


def _sdpa_bshd(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                            v.transpose(1, 2)).transpose(1, 2)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_head_shards_compose_to_the_all_heads_result(case):
    q, k, v = _qkv(case)
    whole = _one_process(case, 0.25)
    parts = [ulysses.head_shard_attention(q[:, :, h:h + 1], k[:, :, h:h + 1], v[:, :, h:h + 1], grid=case["grid"],
                                          n_prefix=case["n_prefix"], n_suffix=case["n_suffix"], density=0.25,
                                          backend="torch") for h in range(q.shape[2])]
    # float64: other head counts batch the reference's matmuls differently (rounding ~1e-16); another routing
    # would differ by ~1e-2
    torch.testing.assert_close(torch.cat(parts, dim=2), whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_density_one_equals_dense_attention(case):
    q, k, v = _qkv(case)
    dense = _sdpa_bshd(q, k, v)
    torch.testing.assert_close(_one_process(case, 1.0), dense, rtol=1e-10, atol=1e-10)
    assert float((_one_process(case, 0.25) - dense).norm() / dense.norm()) > 1e-3  # and 0.25 is really sparse


def test_text_prefix_stays_in_front_and_pads_become_sinks_like_the_operator():
    case = CASES[1]  # pads behind the grid: [grid in raster | 4 pads] -> [4 pads | grid in Morton]
    q, k, v = _qkv(case)
    T, n_grid = q.shape[1], math.prod(case["grid"])
    perm = torch.cat([torch.arange(n_grid, T), morton_order(case["grid"])])
    qh, kh, vh = (t.transpose(1, 2)[:, :, perm] for t in (q, k, v))
    ref = piecewise_sparse_attention(qh, kh, vh, density=0.25, n_sink_blocks=1, backend="torch")
    want = torch.empty_like(ref)
    want[:, :, perm] = ref
    torch.testing.assert_close(_one_process(case, 0.25), want.transpose(1, 2), rtol=0, atol=0)
    case = CASES[0]  # text in front: the operator's own Morton path with n_prefix
    q, k, v = _qkv(case)
    ref = piecewise_sparse_attention(*(t.transpose(1, 2) for t in (q, k, v)), density=0.25, n_sink_blocks=1,
                                     reorder="morton", grid=case["grid"], n_prefix=64, backend="torch")
    torch.testing.assert_close(_one_process(case, 0.25), ref.transpose(1, 2), rtol=0, atol=0)


def test_layouts_agree():
    case = CASES[0]
    q, k, v = _qkv(case)
    kw = dict(grid=case["grid"], n_prefix=64, density=0.25, backend="torch")
    bshd = ulysses.head_shard_attention(q, k, v, layout="bshd", **kw)
    bhsd = ulysses.head_shard_attention(*(t.transpose(1, 2) for t in (q, k, v)), layout="bhsd", **kw)
    sbhd = ulysses.head_shard_attention(*(t.permute(1, 0, 2, 3) for t in (q, k, v)), layout="sbhd", **kw)
    assert torch.equal(bhsd.transpose(1, 2), bshd) and torch.equal(sbhd.permute(1, 0, 2, 3), bshd)
    with pytest.raises(ValueError, match="n_prefix"):
        ulysses.head_shard_attention(q[:, :-1], k[:, :-1], v[:, :-1], **kw)
    with pytest.raises(ValueError, match="layout"):
        ulysses.head_shard_attention(q, k, v, layout="bsh", **kw)


def test_flash_attn_style_takes_yunchangs_call_and_hands_the_rest_to_dense():
    case = CASES[0]
    q, k, v = _qkv(case)
    fn = ulysses.flash_attn_style(grid=case["grid"], n_prefix=64, density=0.25, backend="torch")
    assert torch.equal(fn(q, k, v, **YUNCHANG_KW), _one_process(case, 0.25))
    # causal: PyTorch SDPA's causal answer (no dense_fn given)
    causal = fn(q, k, v, **dict(YUNCHANG_KW, causal=True))
    want = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
    torch.testing.assert_close(causal, want.transpose(1, 2))
    with pytest.raises(ValueError, match="dense_fn"):
        fn(q, k, v, **dict(YUNCHANG_KW, return_attn_probs=True))
    seen = []

    def flash(q, k, v, **kw):
        seen.append(kw)
        return "dense"
    fn = ulysses.flash_attn_style(dense_fn=flash, grid=case["grid"], n_prefix=64, backend="torch")
    assert fn(q, k, v, **dict(YUNCHANG_KW, softcap=30.0)) == "dense" and seen[-1]["softcap"] == 30.0
    assert fn(q, k[:, :64], v[:, :64], **YUNCHANG_KW) == "dense"  # not self-attention


def test_raylight_inner_attention_sparse_on_the_grid_dense_otherwise():
    case = CASES[1]
    q, k, v = _qkv(case)
    calls = []

    def dense(q, k, v, **kw):
        calls.append(kw)
        return _sdpa_bshd(q, k, v)
    proc = ulysses.InnerAttention(density=0.25, backend="torch", dense_blocks=(0, -1))
    assert proc.supports_ring is False
    ring_kw = dict(dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None,
                   deterministic=False, return_attn_probs=False, group=None, attn_layer=None,
                   joint_tensor_key=None, joint_tensor_value=None, joint_strategy="none")
    to = {"grid_sizes": case["grid"], "block_index": 1, "total_blocks": 4}
    out = proc(dense, q, k, v, transformer_options=to, **ring_kw)
    assert calls == [] and torch.equal(out, _one_process(case, 0.25))
    for opts, kw in [(dict(to, block_index=3), {}), (dict(to, grid_sizes=(2, 8, 4)), {}), ({}, {}),
                     (to, dict(joint_tensor_key=k, joint_tensor_value=v)), (to, dict(causal=True))]:
        n = len(calls)
        proc(dense, q, k, v, transformer_options=opts, **dict(ring_kw, **kw))
        assert len(calls) == n + 1, opts


def _spawn(world: int, cases: list, tmp, deadline_s: float):
    import torch.multiprocessing as mp

    init = tmp / f"init_{world}"
    ctx = mp.start_processes(ulysses_worker.run, args=(world, str(init), str(tmp), cases), nprocs=world,
                             join=False, start_method="spawn")
    t_end = time.monotonic() + deadline_s
    try:
        while not ctx.join(timeout=max(0.1, t_end - time.monotonic())):
            if time.monotonic() > t_end:
                raise AssertionError(f"{world} gloo processes did not finish within {deadline_s:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
    return [[torch.load(tmp / f"case{i}_rank{r}.pt") for r in range(world)] for i in range(len(cases))]


@pytest.mark.parametrize("world", [2, 4])
def test_ulysses_over_gloo_processes_equals_one_process(world, tmp_path):
    cases = [dict(c, density=d) for c in CASES for d in (1.0, 0.25)]
    shards = _spawn(world, cases, tmp_path, deadline_s=90)
    for case, got in zip(cases, shards):
        q, k, v = _qkv(case)
        full = torch.cat(got, dim=1)
        if case["density"] == 1.0:
            torch.testing.assert_close(full, _sdpa_bshd(q, k, v), rtol=1e-10, atol=1e-10)
        else:  # routing is per head: one process's result up to float64 rounding
            torch.testing.assert_close(full, _one_process(case, case["density"]), rtol=1e-12, atol=1e-12,
                                       msg=case["name"])

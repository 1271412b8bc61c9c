"""The attention override on its own (no ComfyUI): both call layouts, newer ComfyUI's block_index /
block_type / grid_sizes keys and AttentionTensorContainer, dense fallbacks, clone semantics, re-install."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch

from comfy_inproc import load_pack

load_pack()
from psa_pack.kernels import piecewise_sparse_attention  # noqa: E402
from psa_pack.nodes import patch, policy, speed  # noqa: E402

torch.manual_seed(0)
SIGMAS = torch.tensor([1.0, 0.5, 0.25, 0.0])


class Dense:
    """ComfyUI's attention function stand-in: SDPA in both layouts; records what it was given."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False,
                 **kwargs):
        self.calls.append(tuple(type(t) for t in (q, k, v)))
        if not skip_reshape:
            b, L, hd = q.shape
            q, k, v = (t.view(b, -1, heads, hd // heads).transpose(1, 2) for t in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out if skip_output_reshape else out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)


class Container:
    """Newer ComfyUI's AttentionTensorContainer: hands its tensor out once."""

    def __init__(self, t):
        self._t = t

    def take(self):
        t, self._t = self._t, None
        assert t is not None, "taken twice"
        return t


def _override(family="wan", total_blocks=4, n_double=0, **kn):
    k = dict(density=0.25, dense_steps=1, dense_blocks=(0, -1), min_tokens=256, backend="torch")
    k.update(kn)
    return patch.SparseAttentionOverride(policy.Knobs(**k), family=family, total_blocks=total_blocks, n_double=n_double)


def _opts(**kw):
    o = {"sigmas": torch.tensor([0.5]), "sample_sigmas": SIGMAS, "cond_or_uncond": [0]}
    o.update(kw)
    return o


def _wan_qkv(grid=(3, 8, 16), heads=2, d=64):
    T = grid[0] * grid[1] * grid[2]
    return [torch.randn(1, T, heads * d) for _ in range(3)]


def test_newer_comfy_block_index_and_grid_sizes_run_sparse_like_the_operator():
    ov, func = _override(), Dense()
    q, k, v = _wan_qkv()
    out = ov(func, q, k, v, heads=2, transformer_options=_opts(block_index=1, grid_sizes=(3, 8, 16)))
    assert func.calls == []
    ref = piecewise_sparse_attention(*(t.view(1, -1, 2, 64).transpose(1, 2) for t in (q, k, v)), density=0.25,
                                     band=1, reorder="morton", grid=(3, 8, 16), backend="torch")
    torch.testing.assert_close(out, ref.transpose(1, 2).reshape(1, q.shape[1], -1))


@pytest.mark.parametrize("opts,why", [
    ({"block_index": 0}, "dense block"), ({"block_index": 3}, "dense block"),
    ({"block_index": 1, "sigmas": torch.tensor([1.0])}, "dense step"),
    ({"block_index": 1, "grid_sizes": (3, 8, 8)}, "grid mismatch"),
    ({"block_index": 1, "mask": True}, "mask"),
])
def test_dense_calls_reach_comfys_function(opts, why):
    ov, func = _override(), Dense()
    q, k, v = _wan_qkv()
    mask = torch.zeros(q.shape[1], q.shape[1]) if opts.pop("mask", False) else None
    o = _opts(grid_sizes=(3, 8, 16))
    o.update(opts)
    out = ov(func, q, k, v, heads=2, mask=mask, transformer_options=o)
    assert len(func.calls) == 1, why
    torch.testing.assert_close(out, Dense()(q, k, v, 2, mask=mask))


def test_cross_attention_is_never_sparse():
    ov, func = _override(), Dense()
    q = torch.randn(1, 384, 128)
    kv = torch.randn(1, 16, 128)
    ov(func, q, kv, kv, heads=2, transformer_options=_opts(block_index=1, grid_sizes=(3, 8, 16)))
    assert len(func.calls) == 1


def test_containers_are_unwrapped_once_and_dense_path_gets_plain_tensors():
    ov, func = _override(), Dense()
    q, k, v = _wan_qkv()
    out = ov(func, Container(q), Container(k), Container(v), heads=2,
             transformer_options=_opts(block_index=1, grid_sizes=(3, 8, 16)))
    assert func.calls == [] and torch.isfinite(out).all()
    ov(func, Container(q), Container(k), Container(v), heads=2,
       transformer_options=_opts(block_index=0, grid_sizes=(3, 8, 16)))
    assert func.calls == [(torch.Tensor,) * 3]


def test_flux_layout_single_blocks_and_text_prefix():
    ov, func = _override("flux", total_blocks=4, n_double=2, min_tokens=0), Dense()
    txt, grid = 64, (16, 16)
    q, k, v = (torch.randn(1, 2, txt + 256, 64) for _ in range(3))
    info = patch.ForwardInfo("flux", grid, txt)
    # newer ComfyUI: single block 0 is global block 2 of 4 -> sparse; single block 1 = last -> dense
    out = ov(func, q, k, v, 2, skip_reshape=True, transformer_options=_opts(
        block_index=0, block_type="single", psa_forward=info))
    assert func.calls == []
    ref = piecewise_sparse_attention(q, k, v, density=0.25, band=1, n_sink_blocks=1, reorder="morton", grid=grid,
                                     n_prefix=txt, backend="torch")
    torch.testing.assert_close(out, ref.transpose(1, 2).reshape(1, txt + 256, -1))
    ov(func, q, k, v, 2, skip_reshape=True, transformer_options=_opts(block_index=1, block_type="single",
                                                                      psa_forward=info))
    assert len(func.calls) == 1


def test_flux_layout_output_is_written_token_major_so_the_flat_result_is_a_view(monkeypatch):
    # ComfyUI passes [B, H, L, D] (skip_reshape) and wants [B, L, H*D] back: the node asks the operator for
    # out_layout="bthd" so that reshape costs nothing; with skip_output_reshape it keeps q's layout
    ov, func = _override("flux", total_blocks=4, n_double=2, min_tokens=0), Dense()
    txt, grid = 64, (16, 16)
    q, k, v = (torch.randn(1, 2, txt + 256, 64) for _ in range(3))
    info = patch.ForwardInfo("flux", grid, txt)
    seen = []
    real = patch.piecewise_sparse_attention

    def spy(q_, k_, v_, **kw):
        seen.append(kw["out_layout"])
        out = real(q_, k_, v_, **kw)
        seen.append(out)
        return out
    monkeypatch.setattr(patch, "piecewise_sparse_attention", spy)
    opts = _opts(block_index=0, block_type="single", psa_forward=info)
    flat = ov(func, q, k, v, 2, skip_reshape=True, transformer_options=opts)
    assert seen[0] == "bthd" and flat.shape == (1, txt + 256, 2 * 64)
    assert flat.data_ptr() == seen[1].data_ptr() and flat.is_contiguous()  # a view of what the operator wrote
    same = ov(func, q, k, v, 2, skip_reshape=True, skip_output_reshape=True, transformer_options=opts)
    assert seen[2] == "q" and same.shape == q.shape
    torch.testing.assert_close(same.transpose(1, 2).reshape(flat.shape), flat, rtol=0, atol=0)


def test_old_comfy_counts_self_attention_calls_per_branch():
    ov, func = _override(), Dense()
    q, k, v = _wan_qkv()
    ctx = torch.randn(1, 16, 128)
    info = patch.ForwardInfo("wan", (3, 8, 16), 0)
    sparse = []
    for branch in ([0], [1]):
        patch.run_state(ov.uid).branches.pop(((tuple(branch)), "cpu"), None)
        for block in range(4):
            n = len(func.calls)
            ov(func, q, k, v, heads=2, transformer_options=_opts(cond_or_uncond=branch, psa_forward=info))
            sparse.append(len(func.calls) == n)
            ov(func, q, ctx, ctx, heads=2, transformer_options=_opts(cond_or_uncond=branch, psa_forward=info))
    assert sparse == [False, True, True, False] * 2


def test_density_one_through_the_override_equals_sdpa():
    ov, func = _override(density=1.0, dense_steps=0, dense_blocks=()), Dense()
    q, k, v = _wan_qkv()
    out = ov(func, q, k, v, heads=2, transformer_options=_opts(block_index=2, grid_sizes=(3, 8, 16)))
    assert func.calls == []
    torch.testing.assert_close(out, Dense()(q, k, v, 2), atol=2e-5, rtol=2e-5)


def test_operator_failure_falls_back_to_dense(monkeypatch, caplog):
    def boom(*a, **k):
        raise RuntimeError("kernel exploded")
    monkeypatch.setattr(patch, "piecewise_sparse_attention", boom)
    patch._logged.discard("kernel-failure")
    ov, func = _override(), Dense()
    q, k, v = _wan_qkv()
    out = ov(func, q, k, v, heads=2, transformer_options=_opts(block_index=1, grid_sizes=(3, 8, 16)))
    assert len(func.calls) == 1 and torch.isfinite(out).all()
    assert "kernel exploded" in caplog.text
    assert patch.run_state(ov.uid).tally.dense == {"operator failed, ran dense": 1}
    assert patch.run_state(ov.uid).tally.sparse == 0


def test_override_survives_deepcopy_and_pickle_with_its_identity():
    ov = _override()
    for c in (copy.deepcopy(ov), pickle.loads(pickle.dumps(ov))):
        assert isinstance(c, patch.SparseAttentionOverride) and c.uid == ov.uid and c.knobs == ov.knobs


def test_ensure_installed_reinstalls_only_when_displaced():
    ov = _override()
    theirs = Dense()

    def displacing(func, *a, **k):
        return func(*a, **k)

    to = {"optimized_attention_override": displacing}
    assert patch.ensure_installed(to, ov)
    assert to["optimized_attention_override"].prev is displacing and to["optimized_attention_override"].uid == ov.uid
    assert not patch.ensure_installed(to, ov)  # already in front

    inner = copy.deepcopy(ov)

    def chaining(func, *a, **k):  # another node that chained ours (a copy, as after clone())
        return inner(func, *a, **k)
    to = {"optimized_attention_override": chaining}
    assert not patch.ensure_installed(to, ov) and to["optimized_attention_override"] is chaining

    newer = _override()  # a later Piecewise Sparse Attention node replaced ours on purpose
    to = {"optimized_attention_override": newer}
    assert not patch.ensure_installed(to, ov) and to["optimized_attention_override"] is newer
    assert theirs.calls == []


def test_reentry_decides_once():
    ov, func = _override(), Dense()
    inner = copy.deepcopy(ov)
    outer = ov.with_prev(lambda f, *a, **k: inner(f, *a, **k))
    q, k, v = _wan_qkv()
    outer(func, q, k, v, heads=2, transformer_options=_opts(block_index=0, grid_sizes=(3, 8, 16)))
    assert len(func.calls) == 1  # dense block: outer -> lambda -> inner passes straight through


def test_forward_info_reads_the_latent():
    class Wan:
        patch_size = (1, 2, 2)
    x = torch.zeros(1, 16, 21, 60, 104)
    info = patch.forward_info("wan", Wan(), (x, None, torch.zeros(1, 512, 4096)), {})
    assert info.grid == (21, 30, 52) and info.n_tokens == 32760 and info.reason is None
    odd = patch.forward_info("wan", Wan(), (torch.zeros(1, 16, 3, 33, 33), None, None), {})
    assert odd.grid == (3, 17, 17)
    tied = patch.forward_info("wan", Wan(), (torch.zeros(1, 16, 2, 32, 32), None, torch.zeros(1, 512, 8)), {})
    assert tied.reason is not None  # 512 text tokens == 2 x 16 x 16 video tokens: ambiguous in old ComfyUI

    class Flux:
        patch_size = 2
    f = patch.forward_info("flux", Flux(), (torch.zeros(1, 16, 128, 128), None, torch.zeros(1, 512, 4096)), {})
    assert f.grid == (64, 64) and f.n_prefix == 512 and f.n_tokens == 4608


def test_schedule_is_read_once_per_run_not_per_call():
    sched = torch.tensor([1.0, 0.5, 0.25, 0.0])
    to = {"sigmas": torch.tensor([0.25]), "sample_sigmas": sched}
    assert patch.sigma_and_step(to) == (0.25, (2, 3))
    key = (id(sched), sched.data_ptr(), sched.numel())
    assert patch._SCHEDULES[key][1] == [1.0, 0.5, 0.25, 0.0]
    assert patch.sigma_and_step({"sample_sigmas": sched}) == (None, None)


def test_schedule_cache_is_not_fooled_by_a_recycled_tensor_address():
    # a later run's schedule can land on the id and storage of a freed one (same step count, other sigmas)
    for i in range(300):
        x = 0.3 + i * 0.002
        sched = torch.tensor([1.0, x, x / 2, 0.0])
        assert patch.sigma_and_step({"sigmas": torch.tensor([x]), "sample_sigmas": sched})[1] == (1, 3), i
        del sched


def test_probe_records_do_not_pile_up_over_many_runs():
    # the probe node runs on every prompt (not idempotent) with a fresh probe id: old records must go
    ids = []
    for _ in range(100):
        ov = patch.SparseAttentionOverride(policy.Knobs(), family="wan", total_blocks=4, probe_id=f"leak-{len(ids)}")
        ids.append(ov.probe_id)
        patch.PreRunCallback(ov)()
        patch.PROBES[ov.probe_id].pattern = torch.zeros(512, 512, dtype=torch.bool)
    assert len(patch.PROBES) <= patch.MAX_PROBES < 100
    assert ids[-1] in patch.PROBES  # the last run's record is what the report node reads


def test_probe_failure_never_breaks_sampling(monkeypatch, caplog):
    def boom(*a, **k):
        raise torch.cuda.OutOfMemoryError("probe out of memory")
    monkeypatch.setattr(patch.SparseAttentionOverride, "_probe", boom)
    patch._logged.discard("probe-failure")
    plain = _override()
    ov = patch.SparseAttentionOverride(plain.knobs, family="wan", total_blocks=4, probe_id="probe-fails")
    q, k, v = _wan_qkv()
    opts = _opts(block_index=1, grid_sizes=(3, 8, 16))
    out = ov(Dense(), q, k, v, heads=2, transformer_options=opts)
    want = plain(Dense(), q, k, v, heads=2, transformer_options=opts)
    assert torch.equal(out, want)  # the sparse result, untouched by the failed measurement
    assert "probe out of memory" in caplog.text
    assert patch.run_state(ov.uid).tally.sparse == 1


def test_gpu_inputs_no_fast_kernel_takes_stay_dense_instead_of_the_slow_reference(monkeypatch):
    q = torch.randn(1, 8, 4, 80)
    kn = policy.Knobs()
    assert patch.slow_path_reason(q, 80, kn) is None  # CPU: the reference is what runs
    monkeypatch.setattr(speed, "select_backend",
                        lambda q, cfg, req: ("torch", "triton: head_dim 80 unsupported by triton (64 or 128)"))
    why = patch.slow_path_reason(q, 80, kn, on_gpu=True)
    assert why is not None and "head_dim 80" in why and "dense" in why
    assert patch.slow_path_reason(q, 80, policy.Knobs(backend="torch"), on_gpu=True) is None  # explicit: obeyed
    monkeypatch.setattr(speed, "select_backend", lambda q, cfg, req: ("triton", None))
    assert patch.slow_path_reason(q, 128, kn, on_gpu=True) is None
    monkeypatch.setattr(speed, "select_backend", lambda q, cfg, req: ("torch", None))  # PSA_BACKEND=torch
    assert patch.slow_path_reason(q, 128, kn, on_gpu=True) is None


def test_bad_backend_env_never_breaks_a_gpu_call(monkeypatch):
    monkeypatch.setenv("PSA_BACKEND", "bogus")
    assert patch.slow_path_reason(torch.randn(1, 4, 128), 128, policy.Knobs(), on_gpu=True) is None


def test_run_cleanup_frees_the_cached_cuda_graphs(monkeypatch):
    # the graphs' static buffers are invisible to ComfyUI's memory management: they live for one sampling run
    cleared = []
    monkeypatch.setattr(patch.graphs, "clear", lambda: cleared.append(True))
    ov = patch.SparseAttentionOverride(policy.Knobs(), family="wan", total_blocks=4)
    patch.CleanupCallback(ov)(object())
    assert cleared == [True]
    clone = type("Clone", (), {"is_multigpu_base_clone": True, "model_options": {}, "model": None})()
    patch.CleanupCallback(ov)(clone)  # a MultiGPU per-device clone's cleanup follows the main one's: no-op
    assert cleared == [True]

"""ComfyUI's own MultiGPU CFG split (comfy/multigpu.py, ComfyUI 0.33), in-process on CPU with two stand-in
devices: the "MultiGPU CFG Split" node's deep clone per device, its persistent worker thread per device and its
conditioning split, driving our override from two threads at once. The sampled latent equals the one-device
run, each CFG branch gets the decisions the one-device run made for it, the run is counted once (one summary,
one probe run) although every clone carries our callbacks.

The devices are torch.device("cpu") and torch.device("cpu", 0): distinct keys for ComfyUI's per-device
dictionaries, both the CPU for tensors. tests/test_multigpu_gpu.py runs the same on two GPUs."""
from __future__ import annotations

import json
import logging
import threading

import pytest

from comfy_server import skip_without_comfyui

pytestmark = pytest.mark.comfy
COMFY_INPROC = True

skip_without_comfyui()

import torch  # noqa: E402

from comfy_inproc import WAN_TINY, import_comfy, init_weights, load_pack  # noqa: E402

import_comfy()
load_pack()
try:
    import comfy.multigpu  # noqa: E402
except ImportError:  # ComfyUI before the MultiGPU nodes (0.3.x)
    pytest.skip("ComfyUI MultiGPU test skipped: this ComfyUI has no comfy/multigpu.py (it arrived in 0.33)",
                allow_module_level=True)
import comfy.model_management  # noqa: E402
import comfy.model_patcher  # noqa: E402
import comfy.sample  # noqa: E402
import comfy.supported_models  # noqa: E402
from psa_pack.nodes import patch  # noqa: E402

CPU, CPU0 = torch.device("cpu"), torch.device("cpu", 0)


def _wan():
    """A tiny Wan2.1 patcher with a loader factory (MultiGPU deep clones are made from it, as from a core loader)."""
    mc = comfy.supported_models.WAN21_T2V(dict(WAN_TINY, image_model="wan2.1"))
    mb = mc.get_model({}, device=CPU)
    init_weights(mb.diffusion_model)
    mb.diffusion_model.float()
    p = comfy.model_patcher.ModelPatcher(mb, load_device=CPU, offload_device=CPU)
    p.cached_patcher_init = (_wan, ())
    return p


def _sample(model, steps=3, cfg=3.0):
    cond = [[torch.randn(1, 16, 4096, generator=torch.Generator().manual_seed(1)) * 0.5, {}]]
    neg = [[torch.zeros_like(cond[0][0]), {}]]
    shape = (1, 16, 3, 32, 32)  # 3 x 16 x 16 = 768 video tokens
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    return comfy.sample.sample(model, noise, steps, cfg, "euler", "simple", cond, neg, torch.zeros(shape),
                               denoise=1.0, seed=0, disable_pbar=True)


KNOBS = dict(variant="pwt", density=0.25, band=1, dense_steps=1, dense_blocks=(0, -1), min_tokens=256, backend="torch")


@pytest.fixture
def two_devices(monkeypatch):
    """What comfy.model_management reports on a two-GPU machine, with CPU devices (then MultiGPU CFG Split)."""
    monkeypatch.setattr(comfy.model_management, "get_all_torch_devices",
                        lambda exclude_current=False: [CPU, CPU0])
    yield lambda m: comfy.multigpu.create_multigpu_deepclones(m, 2, reuse_loaded=True)
    comfy.model_management.unload_all_models()


@pytest.fixture
def decisions(tmp_path, monkeypatch):
    path = tmp_path / "decisions.jsonl"
    monkeypatch.setenv(patch.DECISION_LOG_ENV, str(path))

    def read():
        rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        path.unlink(missing_ok=True)
        return rows
    return read


@pytest.fixture
def kernel_threads(monkeypatch):
    seen = []
    real = patch.piecewise_sparse_attention

    def spy(q, k, v, **kw):
        seen.append((threading.get_ident(), q.shape[0]))
        return real(q, k, v, **kw)
    monkeypatch.setattr(patch, "piecewise_sparse_attention", spy)
    return seen


def _per_branch(rows, branch):
    return sorted((r["step"], r["block"], r["q_len"], r["k_len"], r["sparse"], r["reason"] or "")
                  for r in rows if branch in r["branch"])


@pytest.mark.parametrize("order", ["sparse_node_first", "multigpu_node_first"])
def test_multigpu_cfg_split_equals_one_device_with_each_branch_decided_alike(order, two_devices, decisions,
                                                                              kernel_threads, caplog):
    base = _wan()
    m = patch.apply_piecewise_sparse_attention(base, **KNOBS)
    with caplog.at_level(logging.INFO, logger="piecewise_sparse_attention.nodes"):
        one = _sample(m)
        seq_rows, seq_threads = decisions(), list(kernel_threads)
        kernel_threads.clear()
        if order == "sparse_node_first":  # the MultiGPU node's own advice: after nodes that change the model
            mg = two_devices(m)
        else:
            mg = patch.apply_piecewise_sparse_attention(two_devices(base), **KNOBS)
        assert [c.load_device for c in mg.get_additional_models_with_key("multigpu")] == [CPU0]
        split = _sample(mg)
    rows = decisions()
    # one device: cond and uncond batched in one call per attention (branch [1, 0]); split: one branch per device
    assert {tuple(r["branch"]) for r in seq_rows} == {(1, 0)}
    assert {tuple(r["branch"]) for r in rows} == {(0,), (1,)}
    for b in (0, 1):
        assert _per_branch(rows, b) == _per_branch(seq_rows, b)
    assert sum(r["sparse"] for r in rows) == 2 * sum(r["sparse"] for r in seq_rows) > 0
    # the sparse calls ran in two worker threads, one branch (batch 1) each
    assert {n for _, n in seq_threads} == {2} and {n for _, n in kernel_threads} == {1}
    assert len({t for t, _ in kernel_threads}) == 2 and threading.get_ident() not in {t for t, _ in kernel_threads}
    rel = float((split - one).norm() / one.norm())
    assert rel < 1e-5, rel  # batch 2 vs batch 1 matmuls: float32 summation order only
    summaries = [r.getMessage() for r in caplog.records if "d=0.250): " in r.getMessage()]
    assert len(summaries) == 2  # one per run: the clone's cleanup does not log (or reset) the run again
    n_sparse = sum(r["sparse"] for r in rows)
    assert summaries[1].split(": ", 1)[1].startswith(f"{n_sparse} sparse")


def test_multigpu_probe_records_one_run_from_both_devices(two_devices):
    m = patch.apply_probe(patch.apply_piecewise_sparse_attention(_wan(), **KNOBS))
    mg = two_devices(m)
    _sample(mg, steps=2)
    rec = patch.PROBES[patch.probe_id_of(mg)]
    assert rec.runs == 1  # the clone's pre_run does not start a second run
    # step 1, blocks 1 and 2 sparse, once per branch (two devices)
    assert sorted((k, len(v)) for k, v in rec.rel_err.items()) == [((1, 1), 2), ((1, 2), 2)]
    assert rec.pattern is not None and rec.tally.sparse == 4

"""The pack against ComfyUI's own model code, in-process: tiny FLUX (comfy.ldm.flux.model.Flux, which
ComfyUI's detection only recognises at full width) and tiny Wan2.1 models inside a ComfyUI ModelPatcher,
sampled with comfy.sample.sample so the wrapper, callbacks and transformer_options are the real ones."""
from __future__ import annotations

import json
import logging
import types

import pytest

from comfy_server import skip_without_comfyui

pytestmark = pytest.mark.comfy
COMFY_VERSIONED = True  # every test runs against each ComfyUI version (tests/conftest.py)
COMFY_INPROC = True

skip_without_comfyui()

import torch  # noqa: E402

from comfy_inproc import import_comfy, load_pack, tiny_patcher  # noqa: E402

import_comfy()
load_pack()
import comfy.model_patcher  # noqa: E402
import comfy.sample  # noqa: E402
import comfy.supported_models  # noqa: E402
from psa_pack.nodes import patch  # noqa: E402

CPU = torch.device("cpu")
TXT = 64  # text tokens of the test conditioning


def _patcher(family: str):
    return tiny_patcher(family)


@pytest.fixture(scope="module")
def flux():
    return _patcher("flux")


@pytest.fixture(scope="module")
def wan():
    return _patcher("wan")


def _sample(model, family: str, steps: int = 3, cfg: float = 1.0, seed: int = 0):
    if family == "flux":
        cond = [[torch.randn(1, TXT, 4096, generator=torch.Generator().manual_seed(1)) * 0.5,
                 {"pooled_output": torch.zeros(1, 768), "guidance": 3.5}]]
        shape = (1, 16, 64, 64)  # 32 x 32 image tokens after the 2x2 patch, + 64 text tokens
    else:
        extra = {}
        if family == "wan_i2v":  # a start image's CLIP vision tokens (257) join the text as a second cross-attention
            extra["clip_vision_output"] = types.SimpleNamespace(
                penultimate_hidden_states=torch.randn(1, 257, 1280, generator=torch.Generator().manual_seed(2)))
        cond = [[torch.randn(1, 16, 4096, generator=torch.Generator().manual_seed(1)) * 0.5, extra]]
        shape = (1, 16, 3, 32, 32)  # 3 x 16 x 16 = 768 video tokens
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    neg = [[torch.zeros_like(cond[0][0]), dict(cond[0][1])]]
    return comfy.sample.sample(model, noise, steps, cfg, "euler", "simple", cond, neg, torch.zeros(shape),
                               denoise=1.0, seed=seed, disable_pbar=True)


def _knobs(**kw):
    k = dict(variant="pwt", density=0.25, band=1, dense_steps=1, dense_blocks=(0, -1), min_tokens=256,
             backend="torch")
    k.update(kw)
    return k


@pytest.fixture
def decisions(tmp_path, monkeypatch):
    path = tmp_path / "decisions.jsonl"
    monkeypatch.setenv(patch.DECISION_LOG_ENV, str(path))

    def read():
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return read


@pytest.fixture
def kernel_calls(monkeypatch):
    calls = []
    real = patch.piecewise_sparse_attention

    def spy(q, k, v, **kw):
        calls.append(dict(kw, shape=tuple(q.shape)))
        return real(q, k, v, **kw)
    monkeypatch.setattr(patch, "piecewise_sparse_attention", spy)
    return calls


def test_flux_sparse_on_expected_blocks_with_text_prefix_kept_in_front(flux, decisions, kernel_calls):
    m = patch.apply_piecewise_sparse_attention(flux, **_knobs())
    out = _sample(m, "flux", steps=3)
    assert torch.isfinite(out).all()
    rows = decisions()
    # 2 double + 2 single blocks, one joint call each; step 0 dense, blocks 0 and 3 dense
    assert len(rows) == 3 * 4 and all(r["q_len"] == r["k_len"] == TXT + 32 * 32 for r in rows)
    assert sorted((r["step"], r["block"]) for r in rows if r["sparse"]) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert len(kernel_calls) == 4
    for c in kernel_calls:
        assert c["shape"] == (1, 2, TXT + 1024, 64)  # [B, H, T, D]
        assert c["n_prefix"] == TXT and tuple(c["grid"]) == (32, 32) and c["reorder"] == "morton"
        assert c["n_sink_blocks"] == 1  # auto: the 64 text tokens are one block
        assert c["density"] == 0.25 and c["variant"] == "pwt" and c["band"] == 1 and c["backend"] == "torch"


@pytest.mark.parametrize("family", ["flux", "wan"])
def test_density_one_reproduces_dense_sampling(family, request):
    model = request.getfixturevalue(family)
    dense = _sample(patch.apply_piecewise_sparse_attention(model, variant="off"), family, steps=2, cfg=1.0)
    full = _sample(patch.apply_piecewise_sparse_attention(model, **_knobs(density=1.0, dense_steps=0, dense_blocks=())),
                   family, steps=2, cfg=1.0)
    sparse = _sample(patch.apply_piecewise_sparse_attention(model, **_knobs(density=0.1, dense_steps=0, dense_blocks=())),
                     family, steps=2, cfg=1.0)
    scale = dense.norm()
    assert float((full - dense).norm() / scale) < 1e-4  # the layout handling (reshape, Morton, prefix) is exact
    assert float((sparse - dense).norm() / scale) > 1e-4  # and the sparse run did change attention


def test_wan_cfg_branches_and_cross_attention(wan, decisions):
    m = patch.apply_piecewise_sparse_attention(wan, **_knobs(dense_blocks=(0,)))
    out = _sample(m, "wan", steps=3, cfg=3.0)
    assert torch.isfinite(out).all()
    rows = decisions()
    cross = [r for r in rows if r["q_len"] != r["k_len"]]
    assert cross and all(r["reason"] == "cross-attention" for r in cross)
    self_rows = [r for r in rows if r["q_len"] == r["k_len"]]
    branches = {c for r in self_rows for c in r["branch"]}
    assert branches == {0, 1}
    per_branch = {}
    for r in self_rows:
        per_branch.setdefault(tuple(r["branch"]), []).append((r["step"], r["block"], r["sparse"]))
    for seq in per_branch.values():  # every forward counts its blocks from 0, per branch
        assert [b for _, b, _ in seq] == [0, 1, 2, 3] * 3
        assert {(s, b) for s, b, sp in seq if sp} == {(s, b) for s in (1, 2) for b in (1, 2, 3)}


SEEN: dict[str, list] = {}


def test_wan_i2v_sparse_on_self_attention_only(decisions):
    m = patch.apply_piecewise_sparse_attention(_patcher("wan_i2v"), **_knobs())
    out = _sample(m, "wan_i2v", steps=3)
    assert torch.isfinite(out).all()
    rows = decisions()
    assert {r["k_len"] for r in rows if r["q_len"] != r["k_len"]} == {16, 257}  # text and image cross-attention
    assert all(not r["sparse"] for r in rows if r["q_len"] != r["k_len"])
    assert sorted((r["step"], r["block"]) for r in rows if r["sparse"]) == [(1, 1), (1, 2), (2, 1), (2, 2)]


class Recorder:
    """An attention override from another node: records each call (in SEEN: ModelPatcher.clone()
    deep-copies the override), then chains."""

    def __init__(self, name, log, prev=None):
        SEEN[name] = log
        self.name, self.prev = name, prev

    def __call__(self, func, *args, **kwargs):
        q, k = args[0], args[1]
        SEEN[self.name].append((self.name, q.shape[-2] if kwargs.get("skip_reshape") else q.shape[1],
                         k.shape[-2] if kwargs.get("skip_reshape") else k.shape[1]))
        if self.prev is not None:
            return self.prev(func, *args, **kwargs)
        return func(*args, **kwargs)


def _install(model, override):
    m = model.clone()
    m.model_options.setdefault("transformer_options", {})["optimized_attention_override"] = override
    return m


def test_override_installed_before_ours_gets_every_dense_call(wan, decisions):
    seen = []
    m = patch.apply_piecewise_sparse_attention(_install(wan, Recorder("before", seen)), **_knobs())
    _sample(m, "wan", steps=3)
    rows = decisions()
    n_dense = sum(not r["sparse"] for r in rows)
    assert n_dense == len(seen) and sum(r["sparse"] for r in rows) == 2 * 2  # steps 1-2 x blocks 1-2
    assert ("before", 768, 16) in seen  # cross-attention reached it


def test_override_chained_after_ours_sees_every_call_and_ours_still_runs(wan, decisions):
    seen = []
    ours = patch.apply_piecewise_sparse_attention(wan, **_knobs())
    prev = ours.model_options["transformer_options"]["optimized_attention_override"]
    m = _install(ours, Recorder("after", seen, prev=prev))
    _sample(m, "wan", steps=3)
    rows = decisions()
    assert len(seen) == len(rows) and sum(r["sparse"] for r in rows) == 4


def test_override_that_displaces_ours_is_chained_behind_it(wan, decisions, caplog):
    seen = []
    ours = patch.apply_piecewise_sparse_attention(wan, **_knobs())
    m = _install(ours, Recorder("displacing", seen))  # replaces ours without chaining
    with caplog.at_level(logging.INFO, logger="piecewise_sparse_attention.nodes"):
        _sample(m, "wan", steps=3)
    rows = decisions()
    assert sum(r["sparse"] for r in rows) == 4
    assert len(seen) == sum(not r["sparse"] for r in rows)  # it still runs every call we leave dense
    assert sum("re-installed ours" in r.getMessage() for r in caplog.records) == 1


def test_other_model_passes_through_with_one_log_line(caplog):
    class SDXL:  # stands in for any model we do not support
        diffusion_model = torch.nn.Linear(1, 1)

    mp = comfy.model_patcher.ModelPatcher(SDXL(), load_device=CPU, offload_device=CPU, size=1)
    patch._logged.clear()
    with caplog.at_level(logging.INFO, logger="piecewise_sparse_attention.nodes"):
        out = patch.apply_piecewise_sparse_attention(mp)
        patch.apply_piecewise_sparse_attention(mp)
    assert "optimized_attention_override" not in out.model_options.get("transformer_options", {})
    lines = [r.getMessage() for r in caplog.records if "SDXL" in r.getMessage()]
    assert len(lines) == 1 and "Linear" in lines[0] and "dense" in lines[0]


def test_probe_records_error_per_block_and_step_and_renders(flux):
    from psa_pack.nodes import probe_report

    m = patch.apply_probe(patch.apply_piecewise_sparse_attention(flux, **_knobs()))
    _sample(m, "flux", steps=3)
    rec = patch.PROBES[patch.probe_id_of(m)]
    assert sorted(rec.rel_err) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    errs = [e for v in rec.rel_err.values() for e in v]
    assert all(0.0 < e < 1.0 for e in errs)
    assert rec.pattern is not None and rec.pattern.dtype == torch.bool
    n_blocks = -(-(TXT + 1024) // 64)
    assert rec.pattern.shape == (n_blocks, n_blocks)
    assert rec.pattern[:, 0].all()  # the text prefix block is an exact sink for every query block
    img = probe_report.render(rec)
    assert img.dim() == 4 and img.shape[0] == 1 and img.shape[-1] == 3 and 0 <= float(img.min()) <= float(img.max()) <= 1
    text = probe_report.summary(rec)
    assert "relative error vs dense attention" in text and "4 sparse" in text


def test_two_advanced_sampler_passes_count_steps_across_the_split(wan, decisions):
    # KSamplerAdvanced x2 (steps 0-2 with leftover noise, then 2-4): dense_steps counts the whole schedule
    m = patch.apply_piecewise_sparse_attention(wan, **_knobs(dense_steps=2, dense_blocks=()))
    shape = (1, 16, 3, 32, 32)
    cond = [[torch.randn(1, 16, 4096, generator=torch.Generator().manual_seed(1)) * 0.5, {}]]
    neg = [[torch.zeros_like(cond[0][0]), {}]]
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    half = comfy.sample.sample(m, noise, 4, 1.0, "euler", "simple", cond, neg, torch.zeros(shape), last_step=2,
                               seed=0, disable_pbar=True)
    out = comfy.sample.sample(m, noise, 4, 1.0, "euler", "simple", cond, neg, half, disable_noise=True,
                              start_step=2, seed=0, disable_pbar=True)
    assert torch.isfinite(out).all()
    rows = [r for r in decisions() if r["q_len"] == r["k_len"]]
    assert sorted({(r["step"], r["sparse"]) for r in rows}) == [(0, False), (1, False), (2, True), (3, True)]

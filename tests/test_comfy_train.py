"""ComfyUI's own "Train LoRA" (comfy_extras/nodes_train.py) on a model patched by the node, in-process on CPU
with the torch reference: a tiny Wan2.1 (and a tiny FLUX). The normal sampler path runs under autograd with
gradient checkpointing (each checkpointed block's attention runs twice: forward and recompute) and random
per-sample sigmas; the override must run sparse on the same calls both times, and the gradients through it
must train the LoRA (density 1 through the node trains exactly like ComfyUI's own attention)."""
from __future__ import annotations

import json
import math

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
import comfy_extras.nodes_train as nodes_train  # noqa: E402
from psa_pack.nodes import patch, policy  # noqa: E402

CPU = torch.device("cpu")


def _patcher(family: str):
    p = tiny_patcher(family)
    if hasattr(p, "cached_patcher_init"):  # 0.33: Train LoRA deep-copies the model by re-running its loader
        p.cached_patcher_init = (_reload, (family,))
    return p


def _reload(family, disable_dynamic=False):
    return _patcher(family)


def _data(family: str, n: int = 2):
    g = torch.Generator().manual_seed(0)
    if family == "flux":
        lat = torch.randn(n, 16, 64, 64, generator=g)  # 32 x 32 image tokens + 64 text tokens
        cond = [[torch.randn(1, 64, 4096, generator=g) * 0.5, {"pooled_output": torch.zeros(1, 768), "guidance": 3.5}]]
    else:
        lat = torch.randn(n, 16, 3, 32, 32, generator=g)  # 3 x 16 x 16 = 768 video tokens, 12 blocks of 64
        cond = [[torch.randn(1, 16, 4096, generator=g) * 0.5, {}]]
    return {"samples": lat}, cond


def train_lora(model, latents, positive, *, steps=4, batch_size=1, learning_rate=2e-3, checkpointing=True, seed=0):
    """Run the Train LoRA node of this ComfyUI (0.3.64: TrainLoraNode.train; 0.33: the io.ComfyNode execute
    with list inputs). Returns (lora state dict, losses). The global torch seed fixes the per-step sigmas."""
    torch.manual_seed(seed)
    node = nodes_train.TrainLoraNode
    algorithm = list(nodes_train.adapter_maps.keys())[0]
    kw = dict(batch_size=batch_size, steps=steps, grad_accumulation_steps=1, learning_rate=learning_rate, rank=4,
              optimizer="AdamW", loss_function="MSE", seed=seed, training_dtype="fp32", lora_dtype="fp32",
              algorithm=algorithm, gradient_checkpointing=checkpointing, existing_lora="[None]")
    if hasattr(node, "train"):
        _, lora, loss, _ = node().train(model, latents, positive, **kw)
    else:
        extra = dict(quantized_backward=False, checkpoint_depth=1, offloading=False, bucket_mode=False,
                     bypass_mode=False)
        args = {k: [v] for k, v in {**kw, **extra}.items()}
        res = node.execute(model=[model], latents=[latents], positive=[positive], **args)
        lora, loss = res.result[0], res.result[1]
    return {k: v.detach().clone() for k, v in lora.items()}, list(loss["loss"])


def _knobs(**kw):
    k = dict(variant="pwt", density=0.25, band=1, dense_steps=0, dense_blocks=(0, -1), min_tokens=256,
             backend="torch")
    k.update(kw)
    return k


def decisions(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture
def decision_log(tmp_path, monkeypatch):
    path = tmp_path / "decisions.jsonl"
    monkeypatch.setenv(patch.DECISION_LOG_ENV, str(path))
    return path


@pytest.fixture(scope="module")
def wan():
    return _patcher("wan")


def test_train_lora_through_the_node_runs_sparse_and_lowers_the_loss(wan, decision_log):
    lat, cond = _data("wan")
    model = patch.apply_piecewise_sparse_attention(wan, **_knobs())
    lora, loss = train_lora(model, lat, cond, steps=4)
    log = decisions(decision_log)
    # the same run without updates (same sigmas, noise, batches): the trained LoRA must have lowered the loss
    _, loss0 = train_lora(model, lat, cond, steps=4, learning_rate=0.0)
    assert all(math.isfinite(x) for x in loss) and len(loss) == 4
    assert loss[0] == pytest.approx(loss0[0], rel=1e-6)  # step 1 runs before any update
    assert sum(loss[1:]) < 0.95 * sum(loss0[1:]), (loss, loss0)
    # every LoRA matrix of the sparse blocks' self-attention moved off its start (up matrices start at 0)
    ups = {k: v for k, v in lora.items() if ".self_attn." in k and "up" in k and (".blocks.1." in k or ".blocks.2." in k)}
    assert ups and all(v.abs().max() > 0 for v in ups.values()), sorted(ups)

    self_calls = [d for d in log if d["q_len"] == d["k_len"]]
    assert all(d["training"] for d in self_calls)
    fwd = [d for d in self_calls if not d["recompute"]]
    rec = [d for d in self_calls if d["recompute"]]
    # four training steps x four blocks, each block recomputed once in the backward (checkpointing)
    assert len(fwd) == 16 and len(rec) == 16
    assert [d["block"] for d in fwd] == [0, 1, 2, 3] * 4
    assert sorted(d["block"] for d in rec) == sorted(d["block"] for d in fwd)
    for d in fwd + rec:
        assert d["sparse"] == (d["block"] in (1, 2)), d
        assert d["reason"] == (None if d["block"] in (1, 2) else "dense block"), d


def test_recompute_takes_the_forwards_decisions_and_checkpointing_changes_nothing(wan, decision_log):
    lat, cond = _data("wan")
    model = patch.apply_piecewise_sparse_attention(wan, **_knobs())
    lora_on, loss_on = train_lora(model, lat, cond, steps=3, checkpointing=True)
    n_on = len(decisions(decision_log))
    decision_log.unlink()
    lora_off, loss_off = train_lora(model, lat, cond, steps=3, checkpointing=False)
    log_off = decisions(decision_log)
    assert n_on == 2 * len(log_off)  # every attention call ran twice with checkpointing
    assert not any(d["recompute"] for d in log_off)
    assert loss_on == pytest.approx(loss_off, rel=1e-5)
    for k in lora_on:
        assert torch.allclose(lora_on[k], lora_off[k], rtol=1e-4, atol=1e-7), k


def test_density_one_through_the_node_trains_like_comfyuis_own_attention(wan, decision_log):
    # at density 1 the operator equals dense attention, forward and backward: the whole LoRA run must match
    # the run without the node (ComfyUI's CPU attention) up to float32 rounding
    lat, cond = _data("wan")
    ours = patch.apply_piecewise_sparse_attention(wan, **_knobs(density=1.0, dense_blocks=()))
    lora_a, loss_a = train_lora(ours, lat, cond, steps=3)
    assert sum(d["sparse"] for d in decisions(decision_log)) == 3 * 4 * 2  # every self-attention, twice
    lora_b, loss_b = train_lora(wan.clone(), lat, cond, steps=3)
    assert loss_a == pytest.approx(loss_b, rel=1e-4)
    for k in lora_a:
        # (Adam turns a float32 rounding difference in a tiny gradient into up to a step's worth: one element in
        # 1024 differed by 2.2e-6 on weights of 6e-3 with torch 2.14.1 on a 2026-12-02 CI machine: 0.1% of the scale)
        assert torch.allclose(lora_a[k], lora_b[k], rtol=1e-3, atol=1e-3 * float(lora_b[k].abs().max())), k


def test_random_per_sample_sigmas_decide_dense_per_sample(wan, decision_log):
    # dense_steps 25 while training = the noisiest 25/50 of the noise range stays dense, judged per sample
    lat, cond = _data("wan", n=2)
    model = patch.apply_piecewise_sparse_attention(wan, **_knobs(dense_steps=25))
    ms = wan.get_model_object("model_sampling")
    dense_sigma = float(ms.percent_to_sigma(policy.training_dense_fraction(25)))
    lora, loss = train_lora(model, lat, cond, steps=4, batch_size=2, seed=3)
    assert all(math.isfinite(x) for x in loss)
    rows = [d for d in decisions(decision_log) if d["q_len"] == d["k_len"] and d["block"] in (1, 2)]
    mixed = [d for d in rows if d["sparse_rows"] is not None and len(set(d["sparse_rows"])) == 2]
    assert mixed, "this seed draws batches with one dense and one sparse sample"
    for d in rows:
        want = [sg <= dense_sigma for sg in d["row_sigmas"]]
        got = d["sparse_rows"] if d["sparse_rows"] is not None else [d["sparse"]] * len(want)
        assert got == want, (d, dense_sigma)
    by_block = {}
    for d in rows:
        by_block.setdefault((d["block"], d["recompute"]), []).append(d["sparse_rows"] or [d["sparse"]] * 2)
    for b in (1, 2):  # the recompute (backward order: last step first within each step) agrees as a multiset
        assert sorted(map(tuple, by_block[(b, False)])) == sorted(map(tuple, by_block[(b, True)]))


def test_train_lora_tiny_flux_in_process(decision_log):
    flux = _patcher("flux")
    lat, cond = _data("flux", n=1)
    model = patch.apply_piecewise_sparse_attention(flux, **_knobs())
    lora, loss = train_lora(model, lat, cond, steps=2)
    assert all(math.isfinite(x) for x in loss)
    assert any(v.abs().max() > 0 for k, v in lora.items() if "up" in k)
    log = [d for d in decisions(decision_log) if d["q_len"] == d["k_len"]]
    # 2 double + 2 single blocks, 0 and -1 dense: double block 1 and single block 0 (global 1, 2) sparse,
    # forward and recompute, both steps
    sparse = sorted((d["block"], d["recompute"]) for d in log if d["sparse"])
    assert sparse == sorted([(1, False), (2, False), (1, True), (2, True)] * 2)
    assert all(d["q_len"] == 64 + 32 * 32 for d in log)

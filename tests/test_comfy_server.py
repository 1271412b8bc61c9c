"""The pack inside a real ComfyUI server (main.py --cpu): node listing, shipped workflows, a tiny Wan2.1 run.

One server serves the module. The tiny Wan2.1 file (dim 256, 2 heads, 4 blocks; ComfyUI's own model
detection recognises it) is written by the test; the pack writes one JSON line per attention call to
PSA_DECISION_LOG, which the test reads to check the override ran sparse on exactly the expected calls.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from comfy_server import PACK_DIR_NAME, comfy_server, http_json, post_json, skip_without_comfyui, wait_history

pytestmark = pytest.mark.comfy
COMFY_VERSIONED = True  # every test runs against each ComfyUI version's server (tests/conftest.py)

skip_without_comfyui()

import torch  # noqa: E402

from comfy_inproc import import_comfy, tiny_wan  # noqa: E402
from media_fixtures import TRAIN_CLIP, write_tiny_clip  # noqa: E402
from workflow_api import NOTE_TYPES, load_workflows, not_made_for, workflow_to_prompt  # noqa: E402

NODE = "PiecewiseSparseAttention"
EXPECTED_ORDER = ["model", "variant", "density", "band", "sink_blocks", "dense_steps", "start_percent",
                  "end_percent", "dense_blocks", "reorder", "cov_bias", "min_tokens", "backend"]
ADVANCED = {"cov_bias", "min_tokens", "backend"}

# model files named in the shipped workflows: empty placeholders make them valid combo values
PLACEHOLDERS = {
    "diffusion_models": ["wan2.1_t2v_1.3B_fp16.safetensors", "wan2.1_t2v_14B_fp16.safetensors",
                         "flux1-dev.safetensors", "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
                         "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors", "wan2.2_ti2v_5B_fp16.safetensors",
                         "qwen_image_fp8_e4m3fn.safetensors"],
    "text_encoders": ["umt5_xxl_fp8_e4m3fn_scaled.safetensors", "clip_l.safetensors", "t5xxl_fp16.safetensors",
                      "qwen_2.5_vl_7b_fp8_scaled.safetensors"],
    "vae": ["wan_2.1_vae.safetensors", "ae.safetensors", "wan2.2_vae.safetensors", "qwen_image_vae.safetensors"],
}

TEST_NODES = '''
import torch

class PSATestZeroConditioning:
    """Test only: text conditioning of zeros [1, length, 4096] (no text-encoder weights needed)."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"length": ("INT", {"default": 16, "min": 1, "max": 4096})}}
    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "run"
    CATEGORY = "testing"
    def run(self, length):
        return ([[torch.zeros(1, length, 4096), {}]],)

NODE_CLASS_MAPPINGS = {"PSATestZeroConditioning": PSATestZeroConditioning}
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory, comfy_version):
    tmp = tmp_path_factory.mktemp("comfy_models")
    dirs = {}
    for folder, names in PLACEHOLDERS.items():
        d = tmp / folder
        d.mkdir()
        for n in names:
            (d / n).write_bytes(b"")
        dirs[folder] = d
    import_comfy()
    import safetensors.torch

    model = tiny_wan()
    safetensors.torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                                str(dirs["diffusion_models"] / "psa_tiny_wan.safetensors"))
    decision_log = tmp / "decisions.jsonl"
    t0 = time.monotonic()
    with comfy_server({"psa_test_nodes.py": TEST_NODES}, diffusion_models=dirs["diffusion_models"],
                      model_dirs={"text_encoders": dirs["text_encoders"], "vae": dirs["vae"]},
                      env={"PSA_DECISION_LOG": str(decision_log)}, install=comfy_version) as base:
        print(f"ComfyUI {comfy_version.version} up in {time.monotonic() - t0:.1f} s at {base}")
        write_tiny_clip(base.tmp / "input" / TRAIN_CLIP)  # the clip the shipped training workflow loads
        yield base, decision_log


@pytest.fixture(scope="module")
def object_info(server):
    return http_json(server[0] + "/object_info", timeout=60)


def test_object_info_lists_our_nodes_with_inputs_in_the_fixed_order(object_info):
    info = object_info[NODE]
    assert info["display_name"] == "Piecewise Sparse Attention"
    assert info["category"] == "model/patch"
    assert info["python_module"].startswith("custom_nodes.")
    assert info["input_order"] == {"required": EXPECTED_ORDER}
    req = info["input"]["required"]
    assert req["variant"][1]["options"] == ["pwt", "pisa", "drop", "off"] or req["variant"][0] == [
        "pwt", "pisa", "drop", "off"]
    d = req["density"][1]
    assert (d["min"], d["max"], d["step"], d["default"], d["display"]) == (0.02, 1.0, 0.005, 0.125, "slider")
    assert req["band"][1]["min"] == 0 and req["band"][1]["max"] == 8 and req["band"][1]["default"] == 1
    assert req["dense_steps"][1]["min"] == -1 and req["dense_steps"][1]["default"] == -1
    assert req["dense_blocks"][1]["default"] == "0,-1" and req["sink_blocks"][1]["default"] == "auto"
    assert req["min_tokens"][1]["default"] == 4096
    for name, (_, opts) in req.items():
        if name != "model":
            assert any(ch.isdigit() for ch in opts.get("tooltip", "")), f"{name}: tooltip without a number"
        assert bool(opts.get("advanced")) == (name in ADVANCED), name
    assert info["output"] == ["MODEL"]
    assert object_info["PiecewiseSparseProbe"]["input_order"] == {"required": ["model"]}
    rep = object_info["PiecewiseSparseProbeReport"]
    assert rep["input_order"]["required"] == ["model", "latent"]
    assert rep["output"] == ["IMAGE", "STRING"] and rep["output_node"] is True


def test_template_browser_lists_the_shipped_workflows(server):
    listing = http_json(server[0] + "/workflow_templates")
    shipped = sorted(p.stem for p in load_workflows())
    assert len(shipped) >= 3
    assert sorted(listing.get(PACK_DIR_NAME, [])) == shipped, listing
    for name in shipped:  # served where the browser fetches them
        wf = http_json(f"{server[0]}/api/workflow_templates/{PACK_DIR_NAME}/{name}.json")
        assert any(n["type"] == NODE for n in wf["nodes"])


@pytest.mark.parametrize("path", load_workflows(), ids=lambda p: p.stem)
def test_shipped_workflow_converts_and_validates(server, object_info, path, comfy_version):
    wf = json.loads(path.read_text())
    why = not_made_for(wf, getattr(comfy_version, "version", None))
    if why is not None:
        pytest.skip(why)
    types = {n["type"] for n in wf["nodes"]}
    assert NODE in types
    assert types & NOTE_TYPES, "every shipped workflow explains the knobs in a Note"
    prompt = workflow_to_prompt(wf, object_info)  # raises on unknown node types or bad widget values
    assert any(n["class_type"] == NODE for n in prompt.values())
    # ComfyUI's own validation: a 200 means every node type exists and every value validates; the run
    # itself then fails at loading the empty placeholder weights, which is expected
    status, body = post_json(server[0] + "/prompt", {"prompt": prompt})
    assert status == 200, json.dumps(body, indent=1)[:3000]
    hist = wait_history(server[0], body["prompt_id"], timeout=120)
    msgs = json.dumps(hist["status"].get("messages", []))
    assert "execution_error" in msgs or hist["status"].get("completed"), msgs[:2000]


def _wan_prompt(model_node: dict, steps: int = 4, extra: dict | None = None) -> dict:
    p = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "psa_tiny_wan.safetensors", "weight_dtype": "default"}},
        "2": model_node,
        "3": {"class_type": "PSATestZeroConditioning", "inputs": {"length": 16}},
        "4": {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["3", 0]}},
        "5": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": 256, "height": 256, "length": 9,
                                                                  "batch_size": 1}},
        "6": {"class_type": "KSampler", "inputs": {"model": ["2", 0], "seed": 7, "steps": steps, "cfg": 2.0,
                                                   "sampler_name": "euler", "scheduler": "simple",
                                                   "positive": ["3", 0], "negative": ["4", 0],
                                                   "latent_image": ["5", 0], "denoise": 1.0}},
        "7": {"class_type": "SaveLatent", "inputs": {"samples": ["6", 0], "filename_prefix": "psa_tiny"}},
    }
    p.update(extra or {})
    return p


def _node(**kw) -> dict:
    inputs = {"model": ["1", 0], "variant": "pwt", "density": 0.25, "band": 1, "sink_blocks": "auto",
              "dense_steps": 1, "start_percent": 0.0, "end_percent": 1.0, "dense_blocks": "0,-1",
              "reorder": "morton", "cov_bias": False, "min_tokens": 256, "backend": "torch"}
    inputs.update(kw)
    return {"class_type": NODE, "inputs": inputs}


def _run(base: str, prompt: dict) -> dict:
    status, body = post_json(base + "/prompt", {"prompt": prompt})
    assert status == 200, json.dumps(body, indent=1)[:3000]
    hist = wait_history(base, body["prompt_id"], timeout=240)
    assert hist["status"]["status_str"] == "success", json.dumps(hist["status"], indent=1)[:4000]
    return hist


def _latest_latent(base) -> torch.Tensor:
    import safetensors.torch

    files = sorted((base.tmp / "output").rglob("psa_tiny*.latent"), key=lambda p: p.stat().st_mtime)
    assert files, "SaveLatent wrote nothing"
    return safetensors.torch.load_file(str(files[-1]))["latent_tensor"]


@pytest.mark.parametrize("bad,kind", [
    ({"dense_blocks": "0,x"}, "custom_validation_failed"), ({"sink_blocks": "-2"}, "custom_validation_failed"),
    ({"start_percent": 0.8, "end_percent": 0.2}, "custom_validation_failed"),
    ({"end_percent": 1.5}, "custom_validation_failed"),
    ({"density": 5.0}, "value_bigger_than_max"), ({"band": -1}, "value_smaller_than_min"),
    ({"variant": "fast"}, "custom_validation_failed"), ({"backend": "cuda"}, "custom_validation_failed"),
    ({"reorder": "hilbert"}, "custom_validation_failed"),
])
def test_bad_values_are_rejected_before_running(server, bad, kind):
    status, body = post_json(server[0] + "/prompt", {"prompt": _wan_prompt(_node(**bad))})
    assert status == 400, body
    errors = [e for n in body["node_errors"].values() for e in n["errors"]]
    assert any(e["type"] == kind for e in errors), errors


def test_tiny_wan_runs_sparse_exactly_on_the_expected_calls(server):
    base, decision_log = server
    decision_log.write_text("")
    # the probe after our node: the same knobs, plus a dense-vs-sparse measurement and a report
    prompt = _wan_prompt(_node(), extra={
        "8": {"class_type": "PiecewiseSparseProbe", "inputs": {"model": ["2", 0]}},
        "9": {"class_type": "PiecewiseSparseProbeReport", "inputs": {"model": ["8", 0], "latent": ["6", 0]}},
    })
    prompt["6"]["inputs"]["model"] = ["8", 0]
    hist = _run(base, prompt)
    out = _latest_latent(base)
    assert out.shape == (1, 16, 3, 32, 32) and torch.isfinite(out).all()

    rows = [json.loads(line) for line in decision_log.read_text().splitlines()]
    assert rows, "the override never ran"
    tokens = 3 * 16 * 16  # 9 frames -> 3 latent frames; 256 px -> 32 latent -> 16 after the 2x2 patch
    self_rows = [r for r in rows if r["q_len"] == r["k_len"]]
    cross_rows = [r for r in rows if r["q_len"] != r["k_len"]]
    assert all(r["q_len"] == tokens for r in self_rows)
    assert cross_rows and all(r["k_len"] == 16 and not r["sparse"] and r["reason"] == "cross-attention"
                              for r in cross_rows)
    branches = {tuple(r["branch"]) for r in self_rows}
    n_branch_evals = sum(len(b) for b in branches) or 1
    # 4 steps x 4 blocks per CFG branch; dense step 0 and dense blocks 0 and 3 (= -1)
    sparse = sorted((r["step"], r["block"], tuple(r["branch"])) for r in self_rows if r["sparse"])
    expected = sorted((s, b, br) for br in branches for s in (1, 2, 3) for b in (1, 2))
    assert sparse == expected
    assert len(self_rows) == 4 * 4 * len(branches)
    assert {1, 0} <= {c for br in branches for c in br}, "both CFG branches ran"
    assert n_branch_evals == 2
    for r in self_rows:
        if not r["sparse"]:
            assert r["reason"] == ("dense step" if r["step"] == 0 else "dense block"), r
    assert all(r["probe"] for r in rows)

    report = hist["outputs"]["9"]
    assert report["images"], report
    text = "\n".join(report["text"])
    assert "relative error vs dense attention" in text
    m = float(text.split("mean ")[1].split(",")[0])
    assert 0.0 < m < 1.0 and math.isfinite(m)


def test_tiny_wan_variant_off_is_dense_and_differs_from_sparse(server):
    base, decision_log = server
    decision_log.write_text("")
    _run(base, _wan_prompt(_node(variant="off")))
    dense = _latest_latent(base)
    assert decision_log.read_text() == "", "variant off must not install the override"
    _run(base, _wan_prompt(_node(density=0.25, dense_steps=0, dense_blocks="")))
    sparse = _latest_latent(base)
    rows = [json.loads(line) for line in decision_log.read_text().splitlines()]
    assert all(r["sparse"] for r in rows if r["q_len"] == r["k_len"])
    assert torch.isfinite(sparse).all()
    rel = float((sparse - dense).norm() / dense.norm())
    assert 0.0 < rel < 0.5, rel

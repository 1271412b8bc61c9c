"""The one module that decides when to sparsify (nodes/policy.py): pure Python, no ComfyUI."""
from __future__ import annotations

import math

import pytest

from comfy_inproc import load_pack

load_pack()
from psa_pack.nodes import policy  # noqa: E402
from psa_pack.nodes.policy import Call, Knobs, call_reason  # noqa: E402


@pytest.mark.parametrize("text,expected", [
    ("0,-1", (-1, 0)), ("", ()), (" 0 , 2-4 ,-1", (-1, 0, 2, 3, 4)), ("-3--1", (-3, -2, -1)), ("5;5", (5,)),
])
def test_parse_dense_blocks(text, expected):
    assert policy.parse_dense_blocks(text) == expected


@pytest.mark.parametrize("bad", ["a", "1-", "3-1", "-1-2", "1.5"])
def test_parse_dense_blocks_rejects_with_the_piece(bad):
    with pytest.raises(ValueError, match="dense_blocks"):
        policy.parse_dense_blocks(bad)


def test_resolve_dense_blocks_counts_negatives_from_the_end_and_ignores_out_of_range():
    assert policy.resolve_dense_blocks((0, -1), 40) == {0, 39}
    assert policy.resolve_dense_blocks((0, -1, 99, -99), 4) == {0, 3}


@pytest.mark.parametrize("text,expected", [("auto", None), (" AUTO ", None), ("", None), ("3", 3), ("0", 0)])
def test_parse_sink_blocks(text, expected):
    assert policy.parse_sink_blocks(text) == expected


@pytest.mark.parametrize("bad", ["-1", "x", "1.5"])
def test_parse_sink_blocks_rejects(bad):
    with pytest.raises(ValueError, match="sink_blocks"):
        policy.parse_sink_blocks(bad)


def test_auto_sinks_cover_the_text_prefix():
    assert policy.resolve_sink_blocks(None, 512, 64) == 8  # FLUX: 512 T5 tokens
    assert policy.resolve_sink_blocks(None, 77, 64) == 2
    assert policy.resolve_sink_blocks(None, 0, 64) == 0  # Wan
    assert policy.resolve_sink_blocks(3, 512, 64) == 3


@pytest.mark.parametrize("n_steps,dense", [(50, 10), (30, 6), (20, 4), (4, 1), (1, 0)])
def test_auto_dense_steps_is_the_papers_20_percent(n_steps, dense):
    assert policy.resolve_dense_steps(-1, n_steps) == dense
    assert policy.resolve_dense_steps(0, n_steps) == 0
    assert policy.resolve_dense_steps(3, n_steps) == 3


def test_step_of_maps_sigmas_and_in_between_evaluations():
    sched = [1.0, 0.75, 0.5, 0.25, 0.0]
    assert [policy.step_of(s, sched) for s in (1.0, 0.75, 0.5, 0.25)] == [(i, 4) for i in range(4)]
    assert policy.step_of(0.6, sched) == (1, 4)  # a 2nd-order sampler's extra evaluation inside step 1
    assert policy.step_of(0.75 * (1 + 1e-7), sched) == (1, 4)
    assert policy.step_of(5.0, sched) == (0, 4)
    assert policy.step_of(0.5, None) is None and policy.step_of(0.5, [1.0]) is None


def _mro(*pairs):
    return [tuple(p.split(":")) for p in pairs] + [("torch.nn.modules.module", "Module"), ("builtins", "object")]


def test_model_family_is_found_anywhere_in_the_class_hierarchy():
    assert policy.model_family(_mro("comfy.ldm.wan.model:WanModel"), "WAN21 (WanModel)") == ("wan", None)
    # Wan2.2 TI2V 5B is WAN22 around the same WanModel; VACE is a subclass of it
    assert policy.model_family(_mro("comfy.ldm.wan.model:WanModel"), "WAN22 (WanModel)") == ("wan", None)
    assert policy.model_family(_mro("comfy.ldm.wan.model:VaceWanModel", "comfy.ldm.wan.model:WanModel"))[0] == "wan"
    assert policy.model_family(_mro("comfy.ldm.flux.model:Flux"), "Flux2 (Flux)") == ("flux", None)
    assert policy.model_family(_mro("comfy.ldm.lightricks.av_model:LTXAVModel", "comfy.ldm.lightricks.model:LTXVModel",
                                    "comfy.ldm.lightricks.model:LTXBaseModel"))[0] == "ltxv"
    # Mage-Flow runs Qwen-Image's blocks in a class of its own; Krea 2's class has a generic name
    assert policy.model_family(_mro("comfy.ldm.mage_flow.model:MageFlowTransformer2DModel"))[0] == "qwen_image"
    assert policy.model_family(_mro("comfy.ldm.krea2.model:SingleStreamDiT"))[0] == "krea2"
    assert policy.model_family(_mro("comfy.ldm.minimax.model:MiniMaxH3Model"))[0] == "minimax_h3"
    # a class of the same name from another module is not ours
    assert policy.model_family(_mro("someone.else:WanModel"))[0] is None
    assert policy.model_family(_mro("someone.else:SingleStreamDiT"))[0] is None


def test_model_family_names_the_class_of_unsupported_models():
    fam, reason = policy.model_family(_mro("comfy.ldm.modules.diffusionmodules.openaimodel:UNetModel"),
                                      "SDXL (UNetModel)")
    assert fam is None and "SDXL (UNetModel)" in reason and "dense" in reason
    fam, reason = policy.model_family(_mro("comfy.ldm.wan.ar_model:CausalWanModel", "comfy.ldm.wan.model:WanModel"),
                                      "WAN21_CausalAR (CausalWanModel)")
    assert fam is None and "KV cache" in reason


def _call(**kw):
    c = dict(q_len=8192, k_len=8192, head_dim=128, dtype="torch.bfloat16", has_mask=False, n_tokens_expected=8192,
             block=5, total_blocks=40, step=20, n_steps=50, sigma=0.5, sigma_window=(math.inf, -math.inf))
    c.update(kw)
    return Call(**c)


def test_a_plain_self_attention_call_runs_sparse():
    assert call_reason(Knobs(), _call()) is None


@pytest.mark.parametrize("knobs,call,reason", [
    (Knobs(variant="off"), {}, "variant is off"),
    (Knobs(), {"k_len": 512}, "cross-attention"),
    (Knobs(), {"has_mask": True}, "attention mask present"),
    (Knobs(), {"forward_reason": "unknown layout"}, "unknown layout"),
    (Knobs(), {"head_dim": 72}, "head_dim 72 not supported"),
    (Knobs(), {"dtype": "torch.float64"}, "dtype torch.float64 not supported"),
    (Knobs(), {"q_len": 1024, "k_len": 1024, "n_tokens_expected": 1024}, "1024 tokens < min_tokens 4096"),
    (Knobs(), {"n_tokens_expected": None}, "token grid unknown"),
    (Knobs(), {"n_tokens_expected": 4096}, "8192 tokens but the latent grid gives 4096"),
    (Knobs(start_percent=0.2), {"sigma_window": (0.4, -math.inf)}, "outside start_percent..end_percent"),
    (Knobs(end_percent=0.9), {"sigma_window": (math.inf, 0.6)}, "outside start_percent..end_percent"),
    (Knobs(end_percent=0.9), {"sigma_window": None}, "sigma or its start/end window unknown"),
    (Knobs(), {"step": 9}, "dense step"),
    (Knobs(dense_steps=25), {"step": 24}, "dense step"),
    (Knobs(), {"step": None, "n_steps": None}, "sampling schedule unknown"),
    (Knobs(), {"block": 0}, "dense block"),
    (Knobs(), {"block": 39}, "dense block"),
    (Knobs(dense_blocks=(3,)), {"block": 3}, "dense block"),
    (Knobs(), {"block": None}, "block index unknown"),
])
def test_dense_reasons(knobs, call, reason):
    got = call_reason(knobs, _call(**call))
    assert got is not None and got.startswith(reason), got


def test_edges_of_the_windows_are_sparse():
    assert call_reason(Knobs(), _call(step=10)) is None  # steps 0..9 dense of 50
    assert call_reason(Knobs(dense_steps=0), _call(step=None, n_steps=None)) is None
    assert call_reason(Knobs(dense_blocks=()), _call(block=0)) is None
    assert call_reason(Knobs(start_percent=0.2, end_percent=0.8), _call(sigma=0.4, sigma_window=(0.4, 0.3))) is None
    assert call_reason(Knobs(min_tokens=8192), _call()) is None


def test_validate_knobs():
    policy.validate_knobs(Knobs())
    for bad in (Knobs(variant="x"), Knobs(density=0.0), Knobs(density=1.5), Knobs(band=-1), Knobs(reorder="hilbert"),
                Knobs(backend="cuda"), Knobs(start_percent=0.8, end_percent=0.2), Knobs(min_tokens=-1)):
        with pytest.raises(ValueError):
            policy.validate_knobs(bad)


def test_tally_summary():
    t = policy.Tally()
    for r in (None, None, "dense step", "cross-attention", "dense step"):
        t.add(r)
    assert t.summary() == "2 sparse, 1 dense (cross-attention), 2 dense (dense step)"


def test_breakeven_table_keeps_sizes_where_sparse_measured_slower_dense():
    breakeven_reason = policy.breakeven_reason
    table = {"gpu": "NVIDIA H200", "rows": [[4608, 0.2, 0.45, 0.42], [16896, 0.2, 1.1, 3.9],
                                            [4608, 0.125, 0.40, 0.42], [16896, 0.125, 0.9, 3.9]]}
    # measured slower at 4608 for density 0.2 -> dense, with a reason naming the GPU and the ratio
    why = breakeven_reason(table, "NVIDIA H200", 4608, 0.2)
    assert why is not None and "NVIDIA H200" in why and "1.07x" in why
    # faster at 16896, and interpolated in log T in between (the ratio crosses 1 just above 4608)
    assert breakeven_reason(table, "NVIDIA H200", 16896, 0.2) is None
    assert breakeven_reason(table, "NVIDIA H200", 9000, 0.2) is None
    # the nearest measured density at or above the call's: 0.15 uses the 0.2 rows (conservative)
    assert breakeven_reason(table, "NVIDIA H200", 4608, 0.15) is not None
    assert breakeven_reason(table, "NVIDIA H200", 4608, 0.125) is None
    # below the smallest measured size the smallest one counts; another GPU or no table: no rule
    assert breakeven_reason(table, "NVIDIA H200", 1000, 0.2) is not None
    assert breakeven_reason(table, "NVIDIA A100", 4608, 0.2) is None
    assert breakeven_reason(None, "NVIDIA H200", 4608, 0.2) is None


def test_breakeven_table_without_cuda_graphs_reads_its_eager_rows():
    breakeven_reason = policy.breakeven_reason
    table = {"gpu": "NVIDIA H200", "rows": [[4608, 0.2, 0.40, 0.42], [16896, 0.2, 1.1, 3.9]],
             "rows_eager": [[4608, 0.2, 1.10, 0.42], [16896, 0.2, 1.1, 3.9]]}
    assert breakeven_reason(table, "NVIDIA H200", 4608, 0.2) is None  # replayed from a graph: faster
    why = breakeven_reason(table, "NVIDIA H200", 4608, 0.2, graphs=False)
    assert why is not None and "2.62x" in why and "without CUDA graphs" in why
    # a table measured before the graph cache has only "rows": they count either way
    old = {"gpu": "NVIDIA H200", "rows": table["rows_eager"]}
    assert breakeven_reason(old, "NVIDIA H200", 4608, 0.2) is not None
    assert breakeven_reason(old, "NVIDIA H200", 4608, 0.2, graphs=False) is not None


@pytest.mark.parametrize("name,slug", [("NVIDIA H200", "h200"), ("NVIDIA GeForce RTX 4090", "rtx_4090"),
                                       ("NVIDIA H100 80GB HBM3", "h100_80gb_hbm3"), ("", "gpu")])
def test_gpu_slug_names_the_break_even_file(name, slug):
    assert policy.gpu_slug(name) == slug


def test_break_even_table_is_looked_up_per_gpu_model(tmp_path, monkeypatch, caplog):
    """nodes/speed.py reads breakeven_<slug>.json for the GPU at hand: PSA_BREAKEVEN_DIR first (a table measured
    with bench/pieces.py --breakeven on the user's own GPU), then the shipped ones beside the module (the H200's and the H100 80GB HBM3's);
    a file measured on another GPU, or unreadable, is said and skipped; no table: one line, no rule."""
    import json
    import logging

    from psa_pack.nodes import speed
    monkeypatch.setattr(speed, "_BREAKEVEN", {})
    rows = [[4608, 0.2, 0.5, 0.4], [16896, 0.2, 1.1, 3.9]]
    (tmp_path / "breakeven_rtx_4090.json").write_text(json.dumps({"gpu": "NVIDIA GeForce RTX 4090", "rows": rows}))
    (tmp_path / "breakeven_l40s.json").write_text(json.dumps({"gpu": "NVIDIA A100", "rows": rows}))
    (tmp_path / "breakeven_a10.json").write_text("{not json")
    monkeypatch.setenv("PSA_BREAKEVEN_DIR", str(tmp_path))
    with caplog.at_level(logging.INFO, logger="piecewise_sparse_attention"):
        t = speed._breakeven_table("NVIDIA GeForce RTX 4090")
        assert t is not None and t["rows"] == rows
        assert policy.breakeven_reason(t, "NVIDIA GeForce RTX 4090", 4608, 0.2) is not None  # 1.25x: dense
        # the shipped H200 table, found beside the module although PSA_BREAKEVEN_DIR has none
        h200 = speed._breakeven_table("NVIDIA H200")
        assert h200 is not None and h200["gpu"] == "NVIDIA H200" and h200["rows"]
        # the H100's (session 32): FLUX.1-size calls (4608 tokens) sparse, the smallest measured size (2816) dense
        h100 = speed._breakeven_table("NVIDIA H100 80GB HBM3")
        assert h100 is not None and h100["gpu"] == "NVIDIA H100 80GB HBM3" and h100["rows_eager"]
        assert policy.breakeven_reason(h100, "NVIDIA H100 80GB HBM3", 4608, 0.2) is None
        assert policy.breakeven_reason(h100, "NVIDIA H100 80GB HBM3", 2816, 0.2) is not None
        assert speed._breakeven_table("NVIDIA L40S") is None  # its file was measured on an A100
        assert speed._breakeven_table("NVIDIA A10") is None  # unreadable
        assert speed._breakeven_table("NVIDIA B200") is None  # none at all
        assert speed._breakeven_table(None) is None
    text = caplog.text
    assert "measured on 'NVIDIA A100', not 'NVIDIA L40S'" in text and "breakeven_a10.json skipped" in text
    assert text.count("no break-even table for the NVIDIA B200") == 1
    speed._breakeven_table("NVIDIA B200")  # read once per name: not said again
    assert caplog.text.count("no break-even table for the NVIDIA B200") == 1

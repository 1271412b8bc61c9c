"""Node inputs (issue 12, class 7): values the UI or an API prompt can send that are invalid are rejected in
validate_inputs with a message naming the input; the pure entry point checks the same values the same way."""
from __future__ import annotations

import inspect

import pytest

from comfy_inproc import load_pack

load_pack()
from psa_pack.nodes import patch, policy  # noqa: E402

# the node's widget values as ComfyUI hands them over (after its own str/float/int/bool conversion)
UI_DEFAULTS = dict(variant="pwt", density=0.125, band=1, sink_blocks="auto", dense_steps=-1, start_percent=0.0,
                   end_percent=1.0, dense_blocks="0,-1", reorder="morton", cov_bias=False, min_tokens=4096,
                   backend="auto")


@pytest.mark.parametrize("values,name", [
    (dict(variant="pwt2"), "variant"),
    (dict(density=float("nan")), "density"),
    (dict(density=0.0), "density"),
    (dict(density=1.5), "density"),
    (dict(band=-1), "band"),
    (dict(sink_blocks="-3"), "sink_blocks"),
    (dict(sink_blocks="two"), "sink_blocks"),
    (dict(dense_steps=-2), "dense_steps"),
    (dict(start_percent=1.5), "start_percent"),
    (dict(end_percent=float("inf")), "end_percent"),
    (dict(start_percent=0.6, end_percent=0.2), "start_percent"),
    (dict(dense_blocks="0,a"), "dense_blocks"),
    (dict(dense_blocks="3-1"), "dense_blocks"),
    (dict(reorder="hilbert"), "reorder"),
    (dict(backend="cuda"), "backend"),
    (dict(min_tokens=-64), "min_tokens"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_invalid_ui_values_are_rejected_with_a_message_naming_the_input(values, name):
    why = policy.input_error(**dict(UI_DEFAULTS, **values))
    assert why is not None and why.startswith(name), why


def test_valid_ui_values_and_linked_inputs_pass():
    assert policy.input_error(**UI_DEFAULTS) is None
    # a linked input is not known at validation time: ComfyUI passes None
    assert policy.input_error(**dict(UI_DEFAULTS, density=None, sink_blocks=None, dense_blocks=None)) is None


@pytest.mark.parametrize("kwargs,name", [
    (dict(sink_blocks=-3), "sink_blocks"),
    (dict(density="abc"), "density"),
    (dict(density="0.25"), "density"),
    (dict(dense_blocks="first"), "dense_blocks"),
    (dict(dense_blocks=5), "dense_blocks"),
    (dict(band="2"), "band"),
    (dict(band=1.5), "band"),
    (dict(cov_bias="no"), "cov_bias"),
    (dict(min_tokens=None), "min_tokens"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_apply_rejects_bad_values_before_touching_the_model_naming_the_input(kwargs, name):
    with pytest.raises(ValueError) as e:
        patch.apply_piecewise_sparse_attention(object(), **kwargs)  # checked before model.clone()
    msg = str(e.value)
    assert msg.startswith(name) and "could not convert" not in msg and "invalid literal" not in msg, msg


def test_apply_reads_the_nodes_text_for_dense_blocks_and_sink_blocks():
    k = policy.knobs_from(dense_blocks="0-1, -1", sink_blocks="2", density=1, band=0.0)
    assert k.dense_blocks == (-1, 0, 1) and k.sink_blocks == 2 and k.density == 1.0 and k.band == 0
    assert policy.knobs_from(sink_blocks="auto").sink_blocks is None


def test_the_nodes_validate_inputs_checks_what_comfyui_does_not():
    from comfy_server import comfyui_path
    if comfyui_path() is None:
        pytest.skip("ComfyUI checkout not found (COMFYUI_PATH or ~/comfy/ComfyUI)")
    from comfy_inproc import import_comfy
    import_comfy()
    from psa_pack.nodes import comfy_nodes

    node = comfy_nodes.PiecewiseSparseAttention
    checked = list(inspect.signature(node.validate_inputs).parameters)
    assert checked == ["variant", "sink_blocks", "start_percent", "end_percent", "dense_blocks", "reorder", "backend"]
    # every other number input has a range ComfyUI enforces itself (it skips that for the inputs listed above)
    for inp in node.define_schema().inputs:
        if inp.id not in checked and inp.id not in ("model", "cov_bias"):
            d = inp.as_dict() if hasattr(inp, "as_dict") else {}
            assert "min" in d and "max" in d, (inp.id, d)
    ui = {name: UI_DEFAULTS[name] for name in checked}
    assert node.validate_inputs(**ui) is True
    for name, bad in (("sink_blocks", "-3"), ("dense_blocks", "0,x"), ("variant", "fast"), ("end_percent", 1.5)):
        why = node.validate_inputs(**dict(ui, **{name: bad}))
        assert isinstance(why, str) and why.startswith(name), why

"""The ComfyUI nodes (V3 schema). Thin: `execute` converts UI units and calls nodes/patch.py.

Inputs are only ever appended, never reordered or removed: saved workflows store widget values by position.
"""
from __future__ import annotations

import inspect
import logging

from comfy_api.latest import ComfyExtension, io, ui

from . import patch, policy, probe_report

log = logging.getLogger("piecewise_sparse_attention.nodes")

CATEGORY = "model/patch"


def _advanced(inp):
    """Mark an input advanced: the `advanced=` argument in newer ComfyUI, the schema dict entry in 0.3.x."""
    inp.extra_dict = dict(getattr(inp, "extra_dict", None) or {}, advanced=True)
    if hasattr(inp, "advanced"):
        inp.advanced = True
    return inp


def _slider():
    return io.NumberDisplay.slider


def _int_input(*args, slider=False, **kwargs):
    if slider and "display_mode" in inspect.signature(io.Int.Input.__init__).parameters:
        kwargs["display_mode"] = _slider()
    return io.Int.Input(*args, **kwargs)


class PiecewiseSparseAttention(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="PiecewiseSparseAttention",
            display_name="Piecewise Sparse Attention",
            category=CATEGORY,
            description=(
                "Makes Wan2.1 and FLUX self-attention piecewise sparse (PISA / PWT): the most important key "
                "blocks are computed exactly, every other block becomes one Taylor 'virtual token' in the "
                "same softmax, so nothing is dropped. Put it between the model loader and the sampler. Other "
                "models pass through unchanged."),
            inputs=[
                io.Model.Input("model", tooltip="Wan2.1 (T2V/I2V, 1.3B/14B) or FLUX.1 (dev/schnell) model. "
                               "Any other model passes through with dense attention (one log line)."),
                io.Combo.Input("variant", options=list(policy.VARIANTS), default="pwt", tooltip=(
                    "pwt: PISA plus the second-order block-mass correction (best quality at low density). "
                    "pisa: the paper's 0th+1st order virtual tokens. drop: keep-or-drop block-sparse baseline "
                    "(discards the other blocks). off: dense attention, the model passes through.")),
                io.Float.Input("density", default=0.125, min=0.02, max=1.0, step=0.005, round=0.005,
                               display_mode=_slider(), tooltip=(
                                   "Fraction of key blocks computed exactly per query block. 0.125 computes "
                                   "12.5% exactly (the paper's setting, ~6-8x less attention work); 0.25 is "
                                   "safer for fine detail; 1.0 equals dense attention.")),
                _int_input("band", default=1, min=0, max=8, slider=True, tooltip=(
                    "Key blocks within this distance of the query block are always exact. 1 keeps the "
                    "block and its 2 neighbours (with Morton order: the surrounding 4x4x4 token cubes). "
                    "0 = none.")),
                io.String.Input("sink_blocks", default="auto", tooltip=(
                    "Leading key blocks that are always exact. auto = the text prefix for FLUX (ComfyUI's T5 "
                    "gives at least 256 text tokens = 4 blocks of 64; long prompts more), none for Wan. Or a number, e.g. 1.")),
                io.Int.Input("dense_steps", default=-1, min=-1, max=1000, tooltip=(
                    "The first N sampling steps run dense (they set the layout). -1 = auto: the first 20% "
                    "(10 of 50 steps, the paper's protocol; 4 of 20). 0 = sparse from the first step.")),
                io.Float.Input("start_percent", default=0.0, min=0.0, max=1.0, step=0.001,
                               display_mode=_slider(), tooltip=(
                                   "Sparse only from this point of the schedule on (0.0 = the start, 0.5 = "
                                   "halfway in sigma terms), like the core nodes' start_percent.")),
                io.Float.Input("end_percent", default=1.0, min=0.0, max=1.0, step=0.001,
                               display_mode=_slider(), tooltip=(
                                   "Sparse only up to this point of the schedule (1.0 = the end). E.g. 0.9 "
                                   "makes the last 10% dense again.")),
                io.String.Input("dense_blocks", default="0,-1", tooltip=(
                    "Transformer blocks that stay dense: indices and ranges, negative from the end. "
                    "\"0,-1\" = first and last (paper protocol; Wan2.1-14B has 40 blocks, 1.3B 30, FLUX "
                    "19 double + 38 single = 57). \"\" = none, \"0-2,-1\" = 0, 1, 2 and the last.")),
                io.Combo.Input("reorder", options=list(policy.REORDERS), default="morton", tooltip=(
                    "morton: order video/image tokens along a Z-curve so each block of 64 is a compact "
                    "4x4x4 (video) or 8x8 (image) patch; about 3x lower error at the same density on the Wan "
                    "480p grid (PWT at 0.125: 1.0% vs 2.9% off dense, bench/results/demo_h200.txt). "
                    "none: raster order.")),
                _advanced(io.Boolean.Input("cov_bias", default=False, tooltip=(
                    "Add the PISA covariance term log||H_j - H||_F to the block ranking (paper eq. 11). "
                    "Costs one more pass over the keys and values per call."))),
                _advanced(io.Int.Input("min_tokens", default=4096, min=0, max=10_000_000, step=64, tooltip=(
                    "Attention over fewer tokens stays dense (sparsity does not pay below a few thousand). "
                    "On an H200 the pack also keeps sizes dense where it measured the sparse call slower than dense "
                    "attention (below about 10K tokens, e.g. FLUX at 1024x1024); every Wan 480p video (32760 tokens "
                    "at 81 frames) runs sparse."))),
                _advanced(io.Combo.Input("backend", options=list(policy.BACKENDS), default="auto", tooltip=(
                    "auto: the fastest that can run these inputs (cute on Hopper / SM90, else triton on a CUDA "
                    "GPU, else the PyTorch reference on any device). A backend that cannot run falls back to "
                    "torch with 1 log line; the PSA_BACKEND environment variable overrides auto."))),
            ],
            outputs=[io.Model.Output(tooltip="The model with piecewise sparse self-attention.")],
        )

    @classmethod
    def validate_inputs(cls, variant, sink_blocks, start_percent, end_percent, dense_blocks, reorder, backend):
        # the inputs ComfyUI cannot check itself (text, combos, start <= end) are checked here with a message
        # naming the input; no **kwargs, so ComfyUI still range-checks the numbers (density, band, dense_steps,
        # min_tokens) with its own errors. A linked input arrives as None and is skipped.
        why = policy.input_error(variant=variant, sink_blocks=sink_blocks, start_percent=start_percent,
                                 end_percent=end_percent, dense_blocks=dense_blocks, reorder=reorder, backend=backend)
        return True if why is None else why

    @classmethod
    def execute(cls, model, variant, density, band, sink_blocks, dense_steps, start_percent, end_percent,
                dense_blocks, reorder, cov_bias, min_tokens, backend) -> io.NodeOutput:
        m = patch.apply_piecewise_sparse_attention(
            model, variant=variant, density=density, band=band,
            sink_blocks=policy.parse_sink_blocks(sink_blocks), dense_steps=dense_steps,
            start_percent=start_percent, end_percent=end_percent,
            dense_blocks=policy.parse_dense_blocks(dense_blocks), reorder=reorder, cov_bias=cov_bias,
            min_tokens=min_tokens, backend=backend)
        return io.NodeOutput(m)


class PiecewiseSparseProbe(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="PiecewiseSparseProbe",
            display_name="Piecewise Sparse Probe",
            category=CATEGORY,
            description=(
                "Arms a side-by-side measurement for the next sampling run: every call that runs sparse is "
                "also computed dense, and the error is recorded per block and step. Put it after Piecewise "
                "Sparse Attention (it uses that node's settings). Costs one extra dense attention per sparse "
                "call: use it on a short, small test render."),
            inputs=[io.Model.Input("model", tooltip="A model patched by Piecewise Sparse Attention (its settings "
                                   "are used; without one, the defaults: pwt, density 0.125).")],
            outputs=[io.Model.Output(tooltip="Connect to the sampler; the run is rendered with sparse attention "
                                     "while the dense result is measured beside it.")],
            not_idempotent=True,
        )

    @classmethod
    def execute(cls, model) -> io.NodeOutput:
        return io.NodeOutput(patch.apply_probe(model))


class PiecewiseSparseProbeReport(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="PiecewiseSparseProbeReport",
            display_name="Piecewise Sparse Probe Report",
            category=CATEGORY,
            description="Heat map of the relative error per block x step and the kept-block pattern of one layer, "
                        "from the last run of the probe's model.",
            inputs=[
                io.Model.Input("model", tooltip="The MODEL output of Piecewise Sparse Probe."),
                io.Latent.Input("latent", tooltip="The sampler's output: makes this report run after sampling."),
            ],
            outputs=[
                io.Image.Output(display_name="heat_map", tooltip="Relative error |sparse - dense| / |dense| per "
                                "block (x) and step (y), log colour scale 1e-4..1; grey = dense."),
                io.String.Output(display_name="summary", tooltip="Mean and worst error, exact fraction, calls."),
            ],
            is_output_node=True,
            not_idempotent=True,
        )

    @classmethod
    def fingerprint_inputs(cls, **kwargs):
        return float("nan")  # never cached: the record changes with every run

    @classmethod
    def execute(cls, model, latent) -> io.NodeOutput:
        pid = patch.probe_id_of(model)
        rec = patch.PROBES.get(pid) if pid is not None else None
        if pid is None:
            log.warning("Piecewise Sparse Probe Report: the model did not come from Piecewise Sparse Probe")
        image = probe_report.render(rec)
        text = probe_report.summary(rec)
        shown = ui.PreviewImage(image, cls=cls).as_dict()
        shown["text"] = [text]  # the summary is shown under the image too (and kept in the history)
        return io.NodeOutput(image, text, ui=shown)


NODES = [PiecewiseSparseAttention, PiecewiseSparseProbe, PiecewiseSparseProbeReport]


class PiecewiseSparseExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return list(NODES)


async def comfy_entrypoint() -> PiecewiseSparseExtension:
    return PiecewiseSparseExtension()

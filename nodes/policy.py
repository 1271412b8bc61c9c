"""When to sparsify: the one place that decides (pure Python, no ComfyUI, no torch).

Every rule returns a reason string when a call must stay dense, or None when it may run sparse, so the
glue can log each distinct reason once and a test can read the decisions as data. Units are already
converted (fractions, sets of block indices, sigmas); the node's `execute` does the UI conversion.
"""
from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field

VARIANTS = ("pwt", "pisa", "drop", "off")
REORDERS = ("morton", "none")
BACKENDS = ("auto", "triton", "cute", "torch")

# Paper protocol (PISA §5, PWT README): the first 10 of 50 sampling steps run dense.
AUTO_DENSE_STEP_FRACTION = 0.2
# While training there is no schedule: dense_steps = N is read as N of the paper's 50 steps (see
# training_dense_fraction)
TRAINING_REFERENCE_STEPS = 50
# head dims the operator's fast backends are built for; anything else stays dense
SUPPORTED_HEAD_DIMS = (32, 64, 80, 96, 128, 256)
SUPPORTED_DTYPES = ("torch.float16", "torch.bfloat16", "torch.float32")

# ComfyUI diffusion-model classes whose token layout we know, matched anywhere in the class hierarchy of the
# loaded model (so ComfyUI's subclasses count too: VACE, Camera, Animate, S2V Wan; LTX-2's LTXAVModel), never
# by the exact class name. (module, class) -> family; nodes/models.py holds each family's token layout.
FAMILY_CLASSES = {
    ("comfy.ldm.wan.model", "WanModel"): "wan",  # Wan2.1, Wan2.2 A14B (WAN21) and TI2V 5B (WAN22), VACE, ...
    ("comfy.ldm.flux.model", "Flux"): "flux",  # FLUX.1 dev/schnell, FLUX.2 (Flux2), Kontext
    ("comfy.ldm.chroma.model", "Chroma"): "flux",  # Chroma, Chroma Radiance: FLUX's blocks and token layout
    ("comfy.ldm.qwen_image.model", "QwenImageTransformer2DModel"): "qwen_image",
    ("comfy.ldm.lumina.model", "NextDiT"): "lumina2",  # Lumina Image 2.0, Z-Image
    ("comfy.ldm.hunyuan_video.model", "HunyuanVideo"): "hunyuan_video",  # HunyuanVideo 1.0 and 1.5
    ("comfy.ldm.lightricks.model", "LTXVModel"): "ltxv",  # LTX-Video, LTX-2 (LTXAVModel)
    ("comfy.ldm.kandinsky5.model", "Kandinsky5"): "kandinsky5",  # Kandinsky 5 video (lite, pro) and image
    ("comfy.ldm.cosmos.predict2", "MiniTrainDIT"): "cosmos_predict2",  # Cosmos Predict2 (T2I, I2V), Anima
    ("comfy.ldm.cogvideo.model", "CogVideoXTransformer3DModel"): "cogvideox",  # CogVideoX 1.0 / 1.5 (T2V, I2V, Fun)
    # Mage-Flow: Qwen-Image's blocks and layout at patch 1 over the 128-channel FLUX.2 latent (ComfyUI 0.33)
    ("comfy.ldm.mage_flow.model", "MageFlowTransformer2DModel"): "qwen_image",
    ("comfy.ldm.lens.model", "LensTransformer2DModel"): "lens",  # Lens: image first, text last (ComfyUI 0.33)
    ("comfy.ldm.joyimage.model", "JoyImageTransformer3DModel"): "joyimage",  # JoyImage (Edit): text last (0.33)
    ("comfy.ldm.krea2.model", "SingleStreamDiT"): "krea2",  # Krea 2: single stream, text first (0.33)
    ("comfy.ldm.ideogram4.model", "Ideogram4Transformer2DModel"): "ideogram4",  # Ideogram 4: text first (0.33)
    # MiniMax-H3 (video + audio): one packed sequence, the target video last (0.33)
    ("comfy.ldm.minimax.model", "MiniMaxH3Model"): "minimax_h3",
}
# subclasses of a known class whose attention is not the parent's: (module, class) -> why they stay dense
EXCLUDED_CLASSES = {
    ("comfy.ldm.wan.ar_model", "CausalWanModel"): "causal (autoregressive) Wan attends to a KV cache",
    ("comfy.ldm.flux.controlnet", "ControlNetFlux"): "a ControlNet, not a diffusion model",
    ("comfy.ldm.qwen_image.controlnet", "QwenImageControlNetModel"): "a ControlNet, not a diffusion model",
}
SUPPORTED_MODELS = ("Wan2.1, Wan2.2 (A14B, TI2V 5B, VACE), FLUX.1, FLUX.2, Chroma, Qwen-Image, Z-Image / Lumina 2, "
                    "HunyuanVideo 1.0/1.5, LTX-Video / LTX-2, Kandinsky 5, Cosmos Predict2 / Anima, CogVideoX, "
                    "Mage-Flow, Lens, JoyImage, Krea 2, Ideogram 4, MiniMax-H3")


@dataclass(frozen=True)
class Knobs:
    """The node's inputs in operator units."""

    variant: str = "pwt"
    density: float = 0.125
    band: int = 1
    sink_blocks: int | None = None  # None = auto (text prefix for FLUX, 0 for Wan)
    dense_steps: int = -1  # -1 = auto (first 20% of the steps), 0 = none, N = first N steps
    start_percent: float = 0.0  # sparse only inside [start_percent, end_percent] of the schedule,
    end_percent: float = 1.0  # compared as sigmas (ComfyUI's percent_to_sigma), like the core nodes
    dense_blocks: tuple[int, ...] = (0, -1)  # may hold negative indices (from the end)
    reorder: str = "morton"
    cov_bias: bool = False
    min_tokens: int = 4096
    backend: str = "auto"
    block_size: int = 64


def parse_dense_blocks(text: str) -> tuple[int, ...]:
    """"0,-1" / "0-3, 10, -2" / "" -> sorted tuple of ints (ranges inclusive, negatives count from the end).

    Raises ValueError with the offending piece."""
    out: set[int] = set()
    for raw in str(text).replace(";", ",").split(","):
        piece = raw.strip()
        if not piece:
            continue
        # a range "a-b" whose ends may be negative: split on a '-' that is not a leading sign
        cut = piece.find("-", 1)
        try:
            if cut > 0:
                a, b = int(piece[:cut]), int(piece[cut + 1:])
                if (a < 0) != (b < 0) or b < a:
                    raise ValueError
                out.update(range(a, b + 1))
            else:
                out.add(int(piece))
        except ValueError:
            raise ValueError(f"dense_blocks: cannot read {piece!r}; use indices and ranges like \"0,-1\" or "
                             f"\"0-2,39\" (negative = from the last block)") from None
    return tuple(sorted(out))


def parse_sink_blocks(text) -> int | None:
    """"auto" -> None; "3" -> 3. Raises ValueError for anything else."""
    s = str(text).strip().lower()
    if s in ("", "auto"):
        return None
    try:
        n = int(s)
    except ValueError:
        raise ValueError(f"sink_blocks must be \"auto\" or an integer >= 0, got {text!r}") from None
    if n < 0:
        raise ValueError(f"sink_blocks must be \"auto\" or an integer >= 0, got {text!r}")
    return n


def resolve_dense_blocks(dense_blocks, total_blocks: int) -> frozenset[int]:
    """Negative indices counted from the end; indices outside [0, total) are ignored."""
    out = set()
    for b in dense_blocks:
        i = b + total_blocks if b < 0 else b
        if 0 <= i < total_blocks:
            out.add(i)
    return frozenset(out)


def resolve_dense_steps(dense_steps: int, n_steps: int) -> int:
    """How many leading steps run dense: -1 -> 20% of the schedule (10 of 50), else as given."""
    if dense_steps < 0:
        return int(math.floor(AUTO_DENSE_STEP_FRACTION * n_steps + 0.5))
    return dense_steps


def training_dense_fraction(dense_steps: int) -> float:
    """While training (no sampling schedule; each sample has its own noise level), dense_steps is a fraction
    of the noise range: -1 -> the noisiest 20% (the paper's 10 of 50 steps), 0 -> none, N -> the noisiest
    N/50 (N of the paper's 50 steps). A sample is dense when its sigma lies above the model's sigma at that
    percent of the schedule (model_sampling.percent_to_sigma), so with ComfyUI's Train LoRA, which draws the
    percent uniformly, that fraction of the samples runs dense: inference keeps the same noise levels dense."""
    if dense_steps < 0:
        return AUTO_DENSE_STEP_FRACTION
    return min(1.0, dense_steps / TRAINING_REFERENCE_STEPS)


def resolve_sink_blocks(sink_blocks: int | None, n_prefix: int, block_size: int) -> int:
    """Auto: every block that holds a prefix (text) token is a sink."""
    if sink_blocks is not None:
        return sink_blocks
    return -(-n_prefix // block_size)


def step_of(sigma: float, sample_sigmas) -> tuple[int, int] | None:
    """(step index, number of steps) of `sigma` in a descending schedule of steps + 1 sigmas.

    A sigma between two schedule entries (a 2nd-order sampler's extra evaluation) belongs to the step
    that starts above it. None when there is no schedule."""
    if sample_sigmas is None:
        return None
    sig = [float(s) for s in sample_sigmas]
    if len(sig) < 2:
        return None
    n_steps = len(sig) - 1
    tol = 1e-5 * max(1.0, abs(sigma))
    step = sum(1 for s in sig[:-1] if s >= sigma - tol) - 1
    return min(max(step, 0), n_steps - 1), n_steps


def model_family(hierarchy, model_name: str = "") -> tuple[str | None, str | None]:
    """(family, None) when a class of the diffusion model's hierarchy is one we know, else (None, reason naming
    the model). `hierarchy`: the (module, class name) pairs of type(diffusion_model).__mro__, most derived first;
    `model_name` names the model in the reason (e.g. "WAN22 (WanModel)")."""
    hierarchy = [tuple(h) for h in hierarchy]
    name = model_name or (hierarchy[0][1] if hierarchy else "?")
    for h in hierarchy:
        why = EXCLUDED_CLASSES.get(h)
        if why is not None:
            return None, f"{name} is not supported ({why}); attention stays dense"
        fam = FAMILY_CLASSES.get(h)
        if fam is not None:
            return fam, None
    return None, f"{name} is not a supported model ({SUPPORTED_MODELS}); attention stays dense"


def _real(name: str, x, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(float(x)):
        raise ValueError(f"{name} must be {what}, got {x!r}")
    return float(x)


def _integer(name: str, x, what: str) -> int:
    v = _real(name, x, what)
    if not v.is_integer():
        raise ValueError(f"{name} must be {what}, got {x!r}")
    return int(v)


def _choice(name: str, x, options: tuple[str, ...]) -> str:
    if not isinstance(x, str) or x not in options:
        raise ValueError(f"{name} must be one of {', '.join(options)}, got {x!r}")
    return x


def knobs_from(*, variant="pwt", density=0.125, band=1, sink_blocks=None, dense_steps=-1, start_percent=0.0,
               end_percent=1.0, dense_blocks=(0, -1), reorder="morton", cov_bias=False, min_tokens=4096,
               backend="auto") -> Knobs:
    """The node's knobs from a caller's values, checked: ValueError naming the input and what to pass.

    Operator units (fractions, ints, a tuple of block indices); `sink_blocks` and `dense_blocks` may also be
    the node's text ("auto", "0,-1")."""
    if isinstance(sink_blocks, str):
        sink_blocks = parse_sink_blocks(sink_blocks)
    elif sink_blocks is not None:
        sink_blocks = _integer("sink_blocks", sink_blocks, "\"auto\" (None) or an integer >= 0")
        if sink_blocks < 0:
            raise ValueError(f"sink_blocks must be \"auto\" (None) or an integer >= 0, got {sink_blocks}")
    if isinstance(dense_blocks, str):
        dense_blocks = parse_dense_blocks(dense_blocks)
    else:
        try:
            items = list(dense_blocks)
        except TypeError:
            raise ValueError(f"dense_blocks must be block indices like (0, -1) or text like \"0,-1\", got "
                             f"{dense_blocks!r}") from None
        dense_blocks = tuple(_integer("dense_blocks", b, "block indices like (0, -1)") for b in items)
    if not isinstance(cov_bias, bool):
        raise ValueError(f"cov_bias must be True or False, got {cov_bias!r}")
    k = Knobs(variant=_choice("variant", variant, VARIANTS),
              density=_real("density", density, "a number in (0, 1] (the exact fraction of key blocks)"),
              band=_integer("band", band, "an integer >= 0"), sink_blocks=sink_blocks,
              dense_steps=_integer("dense_steps", dense_steps, "-1 (auto), 0 or a number of steps"),
              start_percent=_real("start_percent", start_percent, "a number in 0..1"),
              end_percent=_real("end_percent", end_percent, "a number in 0..1"), dense_blocks=dense_blocks,
              reorder=_choice("reorder", reorder, REORDERS), cov_bias=cov_bias,
              min_tokens=_integer("min_tokens", min_tokens, "an integer >= 0"),
              backend=_choice("backend", backend, BACKENDS))
    validate_knobs(k)
    return k


def input_error(**values) -> str | None:
    """The node's validate_inputs: the message for the first invalid input among `values` (UI units; a linked
    input arrives as None and is skipped), else None."""
    try:
        knobs_from(**{name: v for name, v in values.items() if v is not None})
    except ValueError as e:
        return str(e)
    return None


def validate_knobs(k: Knobs) -> None:
    """ValueError for values the UI could not have produced (API prompts, scripts)."""
    if k.variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {k.variant!r}")
    if not (0.0 < k.density <= 1.0):
        raise ValueError(f"density must be in (0, 1] (the exact fraction of key blocks), got {k.density}")
    if k.band < 0:
        raise ValueError(f"band must be >= 0, got {k.band}")
    if k.sink_blocks is not None and k.sink_blocks < 0:
        raise ValueError(f"sink_blocks must be \"auto\" (None) or an integer >= 0, got {k.sink_blocks}")
    if k.dense_steps < -1:
        raise ValueError(f"dense_steps must be -1 (auto), 0 or a number of steps, got {k.dense_steps}")
    if k.reorder not in REORDERS:
        raise ValueError(f"reorder must be one of {REORDERS}, got {k.reorder!r}")
    if k.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {k.backend!r}")
    for name in ("start_percent", "end_percent"):
        if not 0.0 <= getattr(k, name) <= 1.0:
            raise ValueError(f"{name} must be within 0..1, got {getattr(k, name)}")
    if k.start_percent > k.end_percent:
        raise ValueError(f"start_percent ({k.start_percent}) must not be after end_percent ({k.end_percent})")
    if k.min_tokens < 0:
        raise ValueError(f"min_tokens must be >= 0, got {k.min_tokens}")


@dataclass(frozen=True)
class Call:
    """What the override knows about one attention call (all plain values)."""

    q_len: int
    k_len: int
    head_dim: int
    dtype: str  # str(torch dtype)
    has_mask: bool
    n_tokens_expected: int | None  # n_prefix + prod(grid) of this forward, None when unknown
    block: int | None  # global block index, None when unknown
    total_blocks: int
    step: int | None  # None when the schedule is unknown
    n_steps: int | None
    sigma: float | None
    sigma_window: tuple[float, float] | None = None  # (start_sigma, end_sigma) resolved for this run
    forward_reason: str | None = None  # set when the whole forward is inert (e.g. unknown layout)
    side_stream: str | None = None  # a SIDE_STREAMS key: a self-attention call outside the joint layout
    training: bool = False  # autograd is on (e.g. ComfyUI's Train LoRA): judge the sample's sigma, no schedule
    dense_sigma: float | None = None  # training: samples with sigma above this stay dense (training_dense_fraction)


def call_reason(k: Knobs, c: Call) -> str | None:
    """Why this call stays dense, or None when it runs sparse. Checked in a fixed order, cheapest first."""
    if k.variant == "off":
        return "variant is off"
    if c.q_len != c.k_len:
        return "cross-attention"
    if c.has_mask:
        return "attention mask present"
    if c.side_stream is not None:
        return SIDE_STREAMS.get(c.side_stream, f"{c.side_stream} self-attention")
    if c.forward_reason is not None:
        return c.forward_reason
    if c.head_dim not in SUPPORTED_HEAD_DIMS:
        return f"head_dim {c.head_dim} not supported (supported: {', '.join(map(str, SUPPORTED_HEAD_DIMS))})"
    if c.dtype not in SUPPORTED_DTYPES:
        return f"dtype {c.dtype} not supported"
    if c.q_len < k.min_tokens:
        return f"{c.q_len} tokens < min_tokens {k.min_tokens}"
    if c.n_tokens_expected is None:
        return "token grid unknown for this forward"
    if c.q_len != c.n_tokens_expected:
        return (f"{c.q_len} tokens but the latent grid gives {c.n_tokens_expected} "
                f"(reference latents, VACE or another extension adds tokens); attention stays dense")
    if k.start_percent > 0.0 or k.end_percent < 1.0:
        if c.sigma is None or c.sigma_window is None:
            return "sigma or its start/end window unknown, start_percent/end_percent cannot be honoured"
        start_sigma, end_sigma = c.sigma_window
        if not (end_sigma <= c.sigma <= start_sigma):
            return "outside start_percent..end_percent"
    if c.training:
        if training_dense_fraction(k.dense_steps) > 0.0:
            if c.sigma is None or c.dense_sigma is None:
                return "noise level or the model's sigma range unknown, dense_steps cannot be honoured while training"
            if c.sigma > c.dense_sigma:
                return "dense noise level (training)"
    elif c.step is not None and c.n_steps is not None:
        if c.step < resolve_dense_steps(k.dense_steps, c.n_steps):
            return "dense step"
    elif k.dense_steps != 0:
        return "sampling schedule unknown, dense_steps cannot be honoured"
    if c.block is None:
        return "block index unknown"
    if c.block in resolve_dense_blocks(k.dense_blocks, c.total_blocks):
        return "dense block"
    return None


# self-attention calls of a forward outside its joint text+latent layout, kept dense as part of the design
SIDE_STREAMS = {
    "text": "text-only self-attention (a text refiner layer)",
    "image": "image-only self-attention (a refiner layer before the joint blocks)",
    "audio": "audio self-attention (LTX-2's audio stream)",
}
# reasons that are part of normal operation: logged at debug level, not announced
ROUTINE_REASONS = ("cross-attention", "dense step", "dense block", "outside start_percent..end_percent",
                   "dense noise level (training)", *SIDE_STREAMS.values())


def is_routine(reason: str) -> bool:
    return reason in ROUTINE_REASONS


@dataclass
class Tally:
    """Counts of decisions (for the log line at the end of a run and for the probe summary)."""

    sparse: int = 0
    dense: dict[str, int] = field(default_factory=dict)

    def add(self, reason: str | None) -> None:
        if reason is None:
            self.sparse += 1
        else:
            self.dense[reason] = self.dense.get(reason, 0) + 1

    def summary(self) -> str:
        parts = [f"{self.sparse} sparse"] + [f"{n} dense ({r})" for r, n in sorted(self.dense.items())]
        return ", ".join(parts)


# ---------------------------------------------------------------------------------------------------
# break-even: below a measured size the sparse operator is slower than dense attention on that GPU

def gpu_slug(name: str) -> str:
    """The file-name part of a GPU's break-even table: "NVIDIA H200" -> "h200", "NVIDIA GeForce RTX 4090" ->
    "rtx_4090" (nodes/breakeven_<slug>.json)."""
    words = re.findall(r"[a-z0-9]+", name.lower())
    return "_".join(w for w in words if w not in ("nvidia", "geforce")) or "gpu"


def breakeven_reason(table: dict | None, gpu: str | None, q_len: int, density: float, *,
                     graphs: bool = True) -> str | None:
    """Why a call of q_len tokens stays dense on `gpu` because the sparse path measured slower than dense
    attention there, or None. `table` is nodes/breakeven_<gpu>.json: {"gpu": name, "rows": [[T, density,
    sparse_ms, dense_ms], ...], "rows_eager": [...]} from bench/pieces.py --breakeven: "rows" timed the way
    the operator runs by default (small calls replayed from cached CUDA graphs, kernels/graphs.py),
    "rows_eager" without graphs; `graphs=False` (PSA_CUDA_GRAPHS=0, or a call too large for the cache) reads
    the latter where the table has it. The ratio sparse/dense is interpolated in log T between the measured
    sizes of the nearest measured density at or above the call's (conservative); outside the measured sizes
    the nearest one counts. A GPU without a table: no rule (None)."""
    if not table or not gpu or table.get("gpu") != gpu:
        return None
    key = "rows" if graphs or not table.get("rows_eager") else "rows_eager"
    rows = [r for r in table.get(key, []) if len(r) == 4 and r[2] > 0 and r[3] > 0]
    if not rows:
        return None
    dens = sorted({float(r[1]) for r in rows})
    d = next((x for x in dens if x >= density - 1e-9), dens[-1])
    pts = sorted((int(r[0]), r[2] / r[3]) for r in rows if float(r[1]) == d)
    if q_len <= pts[0][0]:
        ratio = pts[0][1]
    elif q_len >= pts[-1][0]:
        ratio = pts[-1][1]
    else:
        for (t0, r0), (t1, r1) in zip(pts, pts[1:]):
            if t0 <= q_len <= t1:
                f = (math.log(q_len) - math.log(t0)) / max(1e-12, math.log(t1) - math.log(t0))
                ratio = r0 + f * (r1 - r0)
                break
    if ratio < 1.0:
        return None
    how = "" if key == "rows" else ", without CUDA graphs"
    return (f"{q_len} tokens at density {density:g}: the sparse operator measured {ratio:.2f}x the time of dense "
            f"attention at this size on the {gpu} (break-even table{how}), so dense is faster")

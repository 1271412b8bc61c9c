"""Rendering a probe record: heat map of relative error per block x step, one layer's kept blocks, summary.

Pure torch + Pillow (both present wherever ComfyUI runs); no ComfyUI import.
"""
from __future__ import annotations

import math

import torch
from PIL import Image, ImageDraw, ImageFont

from . import policy

# viridis anchors (matplotlib's, sampled at 0, .25, .5, .75, 1)
_VIRIDIS = torch.tensor([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]],
                        dtype=torch.float32) / 255.0
_EMPTY = (0.22, 0.22, 0.22)  # cells that ran dense (no error to show)
_BG = (24, 24, 24)
_FG = (230, 230, 230)
# error scale of the colour bar: log10 relative error from 1e-4 (dark) to 1 (yellow)
_LOG_LO, _LOG_HI = -4.0, 0.0


def _colour(x: float) -> tuple[int, int, int]:
    t = min(max(x, 0.0), 1.0) * (len(_VIRIDIS) - 1)
    i = min(int(t), len(_VIRIDIS) - 2)
    c = _VIRIDIS[i] * (1 - (t - i)) + _VIRIDIS[i + 1] * (t - i)
    return tuple(int(round(255 * float(v))) for v in c)


def _err_pos(err: float) -> float:
    return (math.log10(max(err, 1e-12)) - _LOG_LO) / (_LOG_HI - _LOG_LO)


def error_grid(rec) -> tuple[torch.Tensor, list[int]]:
    """[n_steps, total_blocks] mean relative error (NaN where dense) and the step labels."""
    steps = sorted({s for s, _ in rec.rel_err})
    n_steps = rec.n_steps or (max(steps) + 1 if steps else 1)
    rows = list(range(n_steps)) if all(s >= 0 for s in steps) else steps
    grid = torch.full((len(rows), max(1, rec.total_blocks)), float("nan"))
    for (s, b), errs in rec.rel_err.items():
        if s in rows and b is not None and 0 <= b < grid.shape[1]:
            grid[rows.index(s), b] = sum(errs) / len(errs)
    return grid, rows


def summary(rec) -> str:
    """A few lines an artist can read: coverage, error, where it is worst, what the density buys."""
    if rec is None or not rec.rel_err:
        return ("Piecewise sparse probe: no sparse attention call was recorded in the last run. Connect the "
                "probe's MODEL to the sampler and this node's latent input to that sampler's output; check "
                "the log for the reason attention stayed dense (model type, min_tokens, dense steps/blocks).")
    kn = rec.knobs or policy.Knobs()
    all_errs = [e for errs in rec.rel_err.values() for e in errs]
    mean = sum(all_errs) / len(all_errs)
    (ws, wb), worst = max(((k, sum(v) / len(v)) for k, v in rec.rel_err.items()), key=lambda kv: kv[1])
    lines = [
        f"Piecewise sparse probe ({rec.family}, {kn.variant}, density {kn.density:.3f}, band {kn.band}, "
        f"{kn.reorder}): {len(all_errs)} sparse calls on {rec.tokens} tokens",
        f"relative error vs dense attention: mean {mean:.2e}, worst {worst:.2e} (step {ws}, block {wb})",
    ]
    if rec.pattern is not None:
        frac = float(rec.pattern.float().mean())
        where = rec.pattern_where or (None, None)
        lines.append(f"exact KV blocks: {100 * frac:.1f}% of {rec.pattern.shape[1]} per query block "
                     f"(block {where[1]}, step {where[0]}, head 0); the rest are Taylor virtual tokens")
    if rec.tally.sparse or rec.tally.dense:
        lines.append(f"calls: {rec.tally.summary()}")
    lines.append("lower is closer to the dense render; compare densities on the same seed, and raise density, "
                 "band or dense_steps where the map is bright")
    return "\n".join(lines)


def render(rec, *, max_side: int = 480) -> torch.Tensor:
    """IMAGE [1, H, W, 3] float in [0, 1]: error heat map (left), colour bar, one layer's kept blocks (right)."""
    font = ImageFont.load_default()
    if rec is None or not rec.rel_err:
        img = Image.new("RGB", (640, 120), _BG)
        ImageDraw.Draw(img).text((12, 12), "no sparse attention call recorded in the last run\n"
                                 "(see the summary text output)", fill=_FG, font=font)
        return _to_tensor(img)
    grid, rows = error_grid(rec)
    n_rows, n_cols = grid.shape
    cell = max(4, min(28, max_side // max(n_cols, 1), max_side // max(n_rows, 1)))
    pad, top, left = 12, 48, 52
    heat_w, heat_h = n_cols * cell, n_rows * cell
    bar_h = max(heat_h, 120)
    bar_x, bar_w = left + heat_w + pad, 14
    pat = rec.pattern
    kn = rec.knobs or policy.Knobs()
    where = rec.pattern_where or (None, None)
    pat_title = f"exact KV blocks: block {where[1]}, step {where[0]}, head 0"
    pat_caption = "rows: query blocks, columns: KV blocks, white = exact"
    px = bar_x + bar_w + 48
    pat_cell = 0 if pat is None else max(1, min(12, 360 // max(pat.shape)))
    pat_w = 0 if pat is None else pat.shape[1] * pat_cell
    pat_h = 0 if pat is None else pat.shape[0] * pat_cell
    text_w = 6 * max(len(pat_title), len(pat_caption)) if pat is not None else 0
    title = (f"relative error of sparse vs dense attention per block x step - {rec.family}, {kn.variant}, "
             f"density {kn.density:.3f}, band {kn.band}")
    W = max(px + max(pat_w, text_w) + pad if pat is not None else px, 6 * len(title) + 2 * pad)
    H = top + max(bar_h, pat_h + 20) + 48
    img = Image.new("RGB", (W, H), _BG)
    d = ImageDraw.Draw(img)
    d.text((pad, 8), title, fill=_FG, font=font)
    d.text((left, top - 16), "block ->", fill=_FG, font=font)
    d.text((pad, top - 16), "step", fill=_FG, font=font)
    for r in range(n_rows):
        for c in range(n_cols):
            v = float(grid[r, c])
            col = tuple(int(255 * x) for x in _EMPTY) if math.isnan(v) else _colour(_err_pos(v))
            x0, y0 = left + c * cell, top + r * cell
            d.rectangle([x0, y0, x0 + cell - 1, y0 + cell - 1], fill=col)
    label_every = max(1, math.ceil(12 / cell))
    for r in range(0, n_rows, label_every):
        d.text((pad, top + r * cell + max(0, (cell - 10) // 2)), str(rows[r]), fill=_FG, font=font)
    for c in range(0, n_cols, max(label_every, math.ceil(24 / cell))):
        d.text((left + c * cell, top + heat_h + 4), str(c), fill=_FG, font=font)
    for y in range(bar_h):
        d.line([bar_x, top + y, bar_x + bar_w, top + y], fill=_colour(1.0 - y / max(1, bar_h - 1)))
    d.text((bar_x + bar_w + 4, top), "1", fill=_FG, font=font)
    d.text((bar_x + bar_w + 4, top + bar_h // 2 - 5), "1e-2", fill=_FG, font=font)
    d.text((bar_x + bar_w + 4, top + bar_h - 10), "1e-4", fill=_FG, font=font)
    if pat is not None:
        d.text((px, top - 16), pat_title, fill=_FG, font=font)
        p = pat.to(torch.bool)
        d.rectangle([px, top, px + pat_w - 1, top + pat_h - 1], fill=(60, 60, 60))
        for i, j in p.nonzero().tolist():
            x0, y0 = px + j * pat_cell, top + i * pat_cell
            d.rectangle([x0, y0, x0 + pat_cell - 1, y0 + pat_cell - 1], fill=(250, 250, 250))
        d.text((px, top + pat_h + 6), pat_caption, fill=_FG, font=font)
    d.text((pad, H - 18), "grey cells ran dense (dense step or dense block); log colour scale", fill=_FG, font=font)
    return _to_tensor(img)


def _to_tensor(img: Image.Image) -> torch.Tensor:
    t = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(img.height, img.width, 3)
    return (t.float() / 255.0).unsqueeze(0)

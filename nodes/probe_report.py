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
    lines.append("guide: mean error below ~1e-2 is usually invisible; raise density or dense_steps if higher")
    return "\n".join(lines)


def render(rec, *, cell: int = 14, max_side: int = 1400) -> torch.Tensor:
    """IMAGE [1, H, W, 3] float in [0, 1]."""
    font = ImageFont.load_default()
    if rec is None or not rec.rel_err:
        img = Image.new("RGB", (640, 120), _BG)
        ImageDraw.Draw(img).text((12, 12), "no sparse attention call recorded in the last run\n"
                                 "(see the summary text output)", fill=_FG, font=font)
        return _to_tensor(img)
    grid, rows = error_grid(rec)
    n_rows, n_cols = grid.shape
    cell = max(3, min(cell, (max_side // 2) // max(n_cols, 1), (max_side // 2) // max(n_rows, 1)))
    pad, top, left = 12, 40, 56
    heat_w, heat_h = n_cols * cell, n_rows * cell

    pat = rec.pattern
    pat_side = 0
    if pat is not None:
        pat_cell = max(1, min(8, 360 // max(pat.shape[0], pat.shape[1])))
        pat_side = pat_cell
    pat_w = 0 if pat is None else pat.shape[1] * pat_side
    pat_h = 0 if pat is None else pat.shape[0] * pat_side
    bar_w = 16
    W = left + heat_w + pad + bar_w + 48 + (pat_w + 2 * pad if pat is not None else 0) + pad
    H = top + max(heat_h, pat_h, 160) + 36
    img = Image.new("RGB", (W, H), _BG)
    d = ImageDraw.Draw(img)
    kn = rec.knobs or policy.Knobs()
    d.text((pad, 8), f"relative error vs dense per block x step - {rec.family} {kn.variant} density "
           f"{kn.density:.3f} band {kn.band}", fill=_FG, font=font)
    for r in range(n_rows):
        for c in range(n_cols):
            v = float(grid[r, c])
            col = tuple(int(255 * x) for x in _EMPTY) if math.isnan(v) else _colour(_err_pos(v))
            x0, y0 = left + c * cell, top + r * cell
            d.rectangle([x0, y0, x0 + cell - 1, y0 + cell - 1], fill=col)
    d.text((left, top - 14), "block ->", fill=_FG, font=font)
    d.text((pad, top), "step", fill=_FG, font=font)
    for r in range(0, n_rows, max(1, n_rows // 8)):
        d.text((pad, top + r * cell + 12), str(rows[r]), fill=_FG, font=font)
    for c in range(0, n_cols, max(1, n_cols // 8)):
        d.text((left + c * cell, top + heat_h + 4), str(c), fill=_FG, font=font)
    # colour bar
    bx = left + heat_w + pad
    for y in range(heat_h if heat_h >= 60 else 60):
        d.line([bx, top + y, bx + bar_w, top + y], fill=_colour(1.0 - y / max(1, (heat_h if heat_h >= 60 else 60) - 1)))
    d.text((bx + bar_w + 3, top), "1", fill=_FG, font=font)
    d.text((bx + bar_w + 3, top + max(heat_h, 60) - 10), "1e-4", fill=_FG, font=font)
    if pat is not None:
        px = bx + bar_w + 48 + pad
        where = rec.pattern_where or (None, None)
        d.text((px, top - 14), f"exact KV blocks, block {where[1]} step {where[0]} head 0", fill=_FG, font=font)
        p = pat.to(torch.bool)
        for i in range(p.shape[0]):
            for j in range(p.shape[1]):
                if p[i, j]:
                    x0, y0 = px + j * pat_side, top + i * pat_side
                    d.rectangle([x0, y0, x0 + pat_side - 1, y0 + pat_side - 1], fill=(250, 250, 250))
        d.rectangle([px - 1, top - 1, px + pat_w, top + pat_h], outline=(120, 120, 120))
        d.text((px, top + pat_h + 4), "query block (rows) x KV block (cols); white = exact", fill=_FG, font=font)
    d.text((pad, H - 16), "grey = dense (step or block kept dense)", fill=_FG, font=font)
    return _to_tensor(img)


def _to_tensor(img: Image.Image) -> torch.Tensor:
    t = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(img.height, img.width, 3)
    return (t.float() / 255.0).unsqueeze(0)

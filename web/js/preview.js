// Live preview on the "Piecewise Sparse Attention" node: which KV blocks stay exact for a few query
// blocks on a representative Wan or FLUX token grid (band, sinks, Morton vs raster neighbourhoods), the
// exact fraction, and the estimated attention speedup. Drawn from the current widget values on every draw:
// the classic canvas draws it with the node, Nodes 2.0 (Vue) when a knob's callback or a configure asks for it
// (refresh). On a frontend without the APIs used here the node stays plain.
import { app } from "../../../scripts/app.js";
import {
  CAT, GRIDS, blockGeometry, estimateSpeedup, exactFraction, formatPercent, parseDenseBlocks,
  parseSinks, routeRow, sparseSteps, validCurve,
} from "./lib/sparsity_model.js";

const EXT = "piecewise_sparse.preview";
const NODE = "PiecewiseSparseAttention";
const WIDGET = "piecewise_sparse.preview";
const GRID_PROP = "piecewise_sparse.preview_grid"; // "auto" | "wan480p" | "flux1024"

const PAD = 10;
const HEADER_H = 18;
const MAP_H = 156;
const MATRIX_ROWS = 6;
const ROW_H = 5;
const LINE_H = 15;
const STRIP_H = 7;
const PREVIEW_H = HEADER_H + MAP_H + 6 + 12 + MATRIX_ROWS * (ROW_H + 1) + 6 + 14 + 4 * LINE_H + 2 * (STRIP_H + 5) + 8;
const MIN_WIDTH = 360;

const COLORS = {
  [CAT.VIRTUAL]: "#2a3646",
  [CAT.TOPK]: "#3fae5a",
  [CAT.BAND]: "#e8953a",
  [CAT.SINK]: "#a77be0",
  [CAT.QUERY]: "#f2f2f2",
  dropped: "#141414",
  dense: "#5b6b5e",
  frame: "#555",
};

let curve = null;
try {
  fetch(new URL("./speedup_h200.json", import.meta.url))
    .then((r) => (r.ok ? r.json() : null))
    .then((c) => {
      curve = validCurve(c);
      for (const node of app?.graph?.nodes ?? []) if (node?.type === NODE) refresh(node);
    })
    .catch(() => {});
} catch (e) {
  curve = null;
}

function widgetValue(node, name, fallback) {
  const w = node.widgets?.find((x) => x.name === name);
  return w === undefined || w.value === undefined || w.value === null ? fallback : w.value;
}

// Guess Wan or FLUX from the loaders upstream of the model input (file names mention the family).
function inferGrid(node) {
  try {
    const seen = new Set();
    const queue = [node];
    while (queue.length && seen.size < 32) {
      const cur = queue.shift();
      if (!cur || seen.has(cur.id)) continue;
      seen.add(cur.id);
      const texts = [cur.type, ...(cur.widgets ?? []).map((w) => w.value)].filter((v) => typeof v === "string");
      for (const t of texts) {
        if (/flux/i.test(t)) return GRIDS.flux1024;
        if (/\bwan|wan2|wan_/i.test(t)) return GRIDS.wan480p;
      }
      // getInputNode: LiteGraph's own walk over a connection (input.link is deprecated in frontend 1.58)
      for (let slot = 0; slot < (cur.inputs?.length ?? 0); slot++) {
        const up = cur.getInputNode?.(slot);
        if (up) queue.push(up);
      }
    }
  } catch (e) {
    // inference is a convenience only
  }
  return GRIDS.wan480p;
}

function readKnobs(node) {
  const choice = node.properties?.[GRID_PROP] ?? "auto";
  const preset = GRIDS[choice] ?? inferGrid(node);
  const sinks = parseSinks(widgetValue(node, "sink_blocks", "auto"), preset);
  const dense = parseDenseBlocks(widgetValue(node, "dense_blocks", "0,-1"), preset.blocks);
  const density = Math.min(1, Math.max(0.0001, Number(widgetValue(node, "density", 0.125))));
  return {
    preset,
    gridAuto: !(choice in GRIDS),
    variant: String(widgetValue(node, "variant", "pwt")),
    density,
    band: Math.max(0, Math.trunc(Number(widgetValue(node, "band", 1)))),
    sinks,
    nSink: sinks.n,
    denseSteps: Math.trunc(Number(widgetValue(node, "dense_steps", -1))),
    start: Number(widgetValue(node, "start_percent", 0)),
    end: Number(widgetValue(node, "end_percent", 1)),
    dense,
    reorder: String(widgetValue(node, "reorder", "morton")),
    covBias: !!widgetValue(node, "cov_bias", false),
    minTokens: Number(widgetValue(node, "min_tokens", 4096)),
    backend: String(widgetValue(node, "backend", "auto")),
  };
}

// Everything the drawing needs, recomputed only when a knob or the grid changes.
function computeModel(k) {
  const preset = k.preset;
  const reorder = k.reorder === "morton" ? "morton" : "none";
  const geom = blockGeometry(preset, reorder);
  const n = geom.n;
  const tokens = preset.prefix + preset.grid.reduce((a, b) => a * b, 1);
  const off = k.variant === "off";
  const small = tokens < k.minTokens;
  const ef = exactFraction(n, k.density, k.band, k.nSink);
  const sparse = !off && !small;
  const fraction = sparse ? ef.fraction : 1;
  const speed = sparse ? estimateSpeedup(fraction, curve) : { value: 1, kind: "dense", label: "dense" };

  // query blocks: the one at the grid centre (drawn on the map) plus evenly spaced others
  const centre = preset.grid.map((g) => Math.floor(g / 2));
  const centreRaster = centre.reduce((acc, c, d) => acc * preset.grid[d] + c, 0);
  const focus = geom.blockOfToken[centreRaster];
  const rows = [];
  for (let r = 0; r < MATRIX_ROWS; r++) {
    rows.push(Math.min(n - 1, Math.round(((r + 0.5) * n) / MATRIX_ROWS)));
  }
  if (!rows.includes(focus)) rows[Math.floor(MATRIX_ROWS / 2)] = focus;
  rows.sort((a, b) => a - b);
  const knobs = { variant: k.variant, density: k.density, band: k.band, nSink: k.nSink, covBias: k.covBias };
  const cats = new Map();
  for (const i of new Set([focus, ...rows])) cats.set(i, routeRow(geom, i, knobs));

  const steps = sparseSteps(k.denseSteps, k.start, k.end, preset.steps);
  const nSparseSteps = steps.filter(Boolean).length;
  const nSparseBlocks = preset.blocks - k.dense.set.size;
  const rho = sparse ? (nSparseSteps / preset.steps) * (nSparseBlocks / preset.blocks) : 0;
  const runSpeed = 1 / (rho / speed.value + (1 - rho));

  const focusFrame = preset.grid.length === 3 ? centre[0] : null;
  const fractionText = formatPercent(fraction);
  const lines = [];
  if (off) lines.push("variant off: dense attention everywhere (100% exact)");
  else if (small) lines.push(`T=${tokens} < min_tokens ${k.minTokens}: stays dense (100% exact)`);
  else lines.push(`exact ${fractionText} of KV blocks · ${ef.meanExact.toFixed(ef.meanExact % 1 ? 1 : 0)} of ${n} per query block`);
  lines.push(sparse
    ? `attention ≈ ${speed.value.toFixed(1)}× faster (${speed.label})`
    : "attention 1.0× (dense)");
  // attention only: the FFN and projections stay dense, so a whole step gains less (bench/results)
  lines.push(`attention over the run ≈ ${runSpeed.toFixed(2)}× · sparse ${nSparseSteps}/${preset.steps} steps × ${nSparseBlocks}/${preset.blocks} blocks`);
  const errors = [k.sinks.error, k.dense.error].filter(Boolean);
  lines.push(errors.length ? `⚠ ${errors[0]}` : `${k.variant} · band ${k.band} · sinks ${k.nSink}${k.sinks.auto ? " (auto)" : ""} · ${reorder === "morton" ? "Morton" : "raster"}${k.covBias ? " · cov_bias" : ""} · ${k.backend}`);

  return {
    geom, n, tokens, off, small, sparse, fraction, formulaFraction: ef.fraction, k: ef.k, meanExact: ef.meanExact,
    fractionText, speed, runSpeed, rows, focus, focusFrame, cats, steps, denseBlocks: k.dense.set, lines,
    hasError: errors.length > 0,
  };
}

function fitText(ctx, text, maxW) {
  if (ctx.measureText(text).width <= maxW) return text;
  let t = text;
  while (t.length > 1 && ctx.measureText(`${t}…`).width > maxW) t = t.slice(0, -1);
  return `${t}…`;
}

function cellColor(m, cat) {
  if (!m.sparse) return cat === CAT.QUERY ? COLORS[CAT.QUERY] : COLORS.dense;
  if (cat === CAT.VIRTUAL && m.variantDrop) return COLORS.dropped;
  return COLORS[cat];
}

function drawMap(ctx, m, k, x, y, w, h) {
  const preset = k.preset;
  const grid = preset.grid;
  const rowsN = grid[grid.length - 2];
  const colsN = grid[grid.length - 1];
  const cat = m.cats.get(m.focus);
  const prefixN = m.geom.nPrefixBlocks;
  const textW = prefixN ? 18 : 0;
  const c = Math.min((w - textW) / colsN, h / rowsN);
  const mw = c * colsN;
  const mh = c * rowsN;
  const x0 = Math.round(x + (w - mw - textW) / 2 + textW);
  const y0 = Math.round(y + (h - mh) / 2);
  const frameOffset = m.focusFrame === null ? 0 : m.focusFrame * rowsN * colsN;
  for (let r = 0; r < rowsN; r++) {
    const ya = Math.round(y0 + r * c);
    const yb = Math.round(y0 + (r + 1) * c);
    for (let q = 0; q < colsN; q++) {
      const j = m.geom.blockOfToken[frameOffset + r * colsN + q];
      ctx.fillStyle = cellColor(m, cat[j]);
      const xa = Math.round(x0 + q * c);
      ctx.fillRect(xa, ya, Math.round(x0 + (q + 1) * c) - xa, yb - ya);
    }
  }
  ctx.strokeStyle = COLORS.frame;
  ctx.lineWidth = 1;
  ctx.strokeRect(x0 - 0.5, y0 - 0.5, mw + 1, mh + 1);
  if (prefixN) {
    // the text prefix blocks, top to bottom, left of the image grid
    const bh = Math.min(mh / prefixN, 14);
    for (let j = 0; j < prefixN; j++) {
      ctx.fillStyle = cellColor(m, cat[j]);
      ctx.fillRect(x0 - textW, y0 + j * bh, textW - 4, bh - 1);
    }
    ctx.save();
    ctx.fillStyle = globalThis.LiteGraph?.WIDGET_SECONDARY_TEXT_COLOR ?? "#999";
    ctx.font = "9px sans-serif";
    ctx.textAlign = "center";
    ctx.fillText("text", x0 - textW / 2 - 2, y0 + prefixN * bh + 10);
    ctx.restore();
  }
  ctx.save();
  ctx.fillStyle = globalThis.LiteGraph?.WIDGET_SECONDARY_TEXT_COLOR ?? "#999";
  ctx.font = "10px sans-serif";
  ctx.textAlign = "left";
  const caption = m.focusFrame === null
    ? `${rowsN}×${colsN} tokens`
    : `frame ${m.focusFrame + 1}/${grid[0]}`;
  ctx.fillText(caption, x, y + 10);
  ctx.restore();
}

function drawMatrix(ctx, m, x, y, w) {
  const n = m.n;
  const px = Math.max(1, Math.floor(w));
  for (let r = 0; r < m.rows.length; r++) {
    const cat = m.cats.get(m.rows[r]);
    const yy = y + r * (ROW_H + 1);
    // several blocks per pixel column: show the most important category among them
    for (let p = 0; p < px; p++) {
      const a = Math.floor((p * n) / px);
      const b = Math.max(a + 1, Math.floor(((p + 1) * n) / px));
      let best = CAT.VIRTUAL;
      for (let j = a; j < b; j++) if (cat[j] > best) best = cat[j];
      ctx.fillStyle = cellColor(m, best);
      const xa = Math.round(x + (p * w) / px);
      ctx.fillRect(xa, yy, Math.max(1, Math.round(x + ((p + 1) * w) / px) - xa), ROW_H);
    }
  }
}

function drawLegend(ctx, m, x, y, w) {
  const items = [
    [CAT.QUERY, "query"], [CAT.BAND, "band"], [CAT.SINK, "sink"], [CAT.TOPK, "top-k"],
    [CAT.VIRTUAL, m.variantDrop ? "dropped" : "virtual token"],
  ];
  ctx.font = "10px sans-serif";
  ctx.textAlign = "left";
  let xx = x;
  for (const [cat, label] of items) {
    ctx.fillStyle = cellColor(m, cat);
    ctx.fillRect(xx, y - 8, 9, 9);
    ctx.strokeStyle = COLORS.frame;
    ctx.strokeRect(xx - 0.5, y - 8.5, 10, 10);
    ctx.fillStyle = globalThis.LiteGraph?.WIDGET_TEXT_COLOR ?? "#ddd";
    ctx.fillText(label, xx + 12, y);
    xx += 12 + ctx.measureText(label).width + 10;
    if (xx > x + w) break;
  }
}

function drawStrip(ctx, label, values, x, y, w) {
  ctx.font = "10px sans-serif";
  ctx.textAlign = "left";
  ctx.fillStyle = globalThis.LiteGraph?.WIDGET_SECONDARY_TEXT_COLOR ?? "#999";
  ctx.fillText(label, x, y + STRIP_H);
  const x0 = x + 44;
  const sw = (w - 44) / values.length;
  for (let s = 0; s < values.length; s++) {
    ctx.fillStyle = values[s] ? COLORS[CAT.TOPK] : COLORS.dense;
    const xa = Math.round(x0 + s * sw);
    ctx.fillRect(xa, y, Math.max(1, Math.round(x0 + (s + 1) * sw) - xa - 1), STRIP_H);
  }
}

function toggleRect(width) {
  return [width - PAD - 92, 0, 92, HEADER_H - 2];
}

function drawPreview(ctx, node, width, y) {
  const k = readKnobs(node);
  const key = JSON.stringify([k.preset.id, k.gridAuto, k.variant, k.density, k.band, k.nSink, k.sinks.error,
    k.denseSteps, k.start, k.end, [...k.dense.set], k.dense.error, k.reorder, k.covBias, k.minTokens, k.backend, !!curve]);
  const state = node.__psaPreviewState ?? (node.__psaPreviewState = { key: null, model: null, draws: 0 });
  if (state.key !== key) {
    state.model = computeModel(k);
    state.model.variantDrop = k.variant === "drop";
    state.key = key;
  }
  const m = state.model;
  const x = PAD;
  const w = width - 2 * PAD;
  ctx.save();
  ctx.fillStyle = "rgba(0,0,0,0.25)";
  ctx.fillRect(x, y, w, PREVIEW_H - 4);

  // header: grid name + the grid toggle
  ctx.font = "11px sans-serif";
  ctx.textAlign = "left";
  ctx.fillStyle = globalThis.LiteGraph?.WIDGET_TEXT_COLOR ?? "#ddd";
  const g = k.preset;
  const head = `${g.label} ${g.prefix ? `${g.prefix} text + ` : ""}${g.grid.join("×")}${k.gridAuto ? " (auto)" : ""} · ${m.n} blocks`;
  const [tx, , tw, th] = toggleRect(width);
  ctx.fillText(fitText(ctx, head, tx - x - 10), x + 4, y + 13);
  ctx.fillStyle = "#333";
  ctx.fillRect(tx, y + 1, tw, th);
  ctx.strokeStyle = COLORS.frame;
  ctx.strokeRect(tx + 0.5, y + 1.5, tw - 1, th - 1);
  ctx.fillStyle = globalThis.LiteGraph?.WIDGET_TEXT_COLOR ?? "#ddd";
  ctx.textAlign = "center";
  ctx.fillText(g.id === "flux1024" ? "show Wan ⇄" : "show FLUX ⇄", tx + tw / 2, y + 13);

  let yy = y + HEADER_H + 2;
  drawMap(ctx, m, k, x + 4, yy, w - 8, MAP_H);
  yy += MAP_H + 6;
  ctx.font = "10px sans-serif";
  ctx.textAlign = "left";
  ctx.fillStyle = globalThis.LiteGraph?.WIDGET_SECONDARY_TEXT_COLOR ?? "#999";
  ctx.fillText(fitText(ctx, `KV blocks 0…${m.n - 1} (${k.reorder === "morton" ? "Morton" : "raster"} order) for ${m.rows.length} query blocks`, w - 8), x + 4, yy + 8);
  yy += 12;
  drawMatrix(ctx, m, x + 4, yy, w - 8);
  yy += MATRIX_ROWS * (ROW_H + 1) + 6 + 10;
  drawLegend(ctx, m, x + 4, yy, w - 8);
  yy += 4;
  for (let l = 0; l < m.lines.length; l++) {
    ctx.font = l === 0 ? "bold 12px sans-serif" : "11px sans-serif";
    ctx.fillStyle = l === 3 && m.hasError ? "#ff7a6e" : (globalThis.LiteGraph?.WIDGET_TEXT_COLOR ?? "#ddd");
    ctx.textAlign = "left";
    ctx.fillText(fitText(ctx, m.lines[l], w - 8), x + 4, yy + LINE_H - 3);
    yy += LINE_H;
  }
  yy += 3;
  drawStrip(ctx, "steps", m.steps.map((s) => s && m.sparse), x + 4, yy, w - 8);
  yy += STRIP_H + 5;
  drawStrip(ctx, "blocks", Array.from({ length: g.blocks }, (_, b) => m.sparse && !m.denseBlocks.has(b)), x + 4, yy, w - 8);
  ctx.restore();

  state.draws += 1;
  // what the preview shows, for scripts and tests (not serialised)
  node.psaPreview = {
    grid: g.id,
    gridAuto: k.gridAuto,
    variant: k.variant,
    density: k.density,
    band: k.band,
    nSink: k.nSink,
    reorder: k.reorder,
    nBlocks: m.n,
    tokens: m.tokens,
    minTokens: k.minTokens,
    sparse: m.sparse,
    k: m.k,
    fraction: m.fraction,
    formulaFraction: m.formulaFraction,
    fractionText: m.fractionText,
    speedup: m.speed.value,
    speedupKind: m.speed.kind,
    runSpeedup: m.runSpeed,
    lines: m.lines.slice(),
    rect: [x, y, w, PREVIEW_H - 4],
    draws: state.draws,
  };
}

function makeWidget(node) {
  const widget = {
    name: WIDGET,
    type: "piecewise_sparse_preview",
    value: "",
    serialize: false,
    options: { serialize: false },
    failed: false,
    draw(ctx, n, width, y) {
      if (this.failed) return;
      try {
        // where it was drawn, for the toggle's hit test: Nodes 2.0 draws it on a canvas of its own (y = 1,
        // the element's width) while the node's classic layout keeps its own widget.y
        this.drawnAt = [width, y];
        drawPreview(ctx, n, width, y);
      } catch (e) {
        this.failed = true;
        console.warn(`[${EXT}] preview disabled for this node: ${e?.message ?? e}`);
        try {
          // give the space back: the node shows its plain widgets only
          const h = n.computeSize?.()?.[1];
          if (h) n.setSize?.([n.size[0], h]);
        } catch (err) {
          // size is cosmetic
        }
      }
    },
    computeSize(width) {
      return [width ?? node.size?.[0] ?? MIN_WIDTH, this.failed ? 0 : PREVIEW_H];
    },
    mouse(e, pos, n) {
      try {
        const type = e?.type ?? "";
        if (!type.endsWith("down")) return false;
        const [width, top] = this.drawnAt ?? [n.size[0], this.y ?? this.last_y ?? 0];
        const [tx, , tw, th] = toggleRect(width);
        const ly = pos[1] - top;
        if (pos[0] >= tx && pos[0] <= tx + tw && ly >= 0 && ly <= th + 2) {
          const cur = n.psaPreview?.grid ?? "wan480p";
          // assignment only: properties is a Vue reactive object in frontend 1.58 (never delete its keys)
          n.properties ??= {};
          n.properties[GRID_PROP] = cur === "flux1024" ? "wan480p" : "flux1024";
          refresh(n);
          return true;
        }
      } catch (err) {
        // clicks on the preview are a convenience only
      }
      return false;
    },
  };
  return widget;
}

// Redraw the preview now. The classic renderer draws widgets on the graph canvas (setDirtyCanvas); Nodes 2.0
// (the Vue renderer) draws a canvas widget on a <canvas> of its own and redraws it when the frontend calls the
// widget's `triggerDraw`, which it sets while the widget is mounted and otherwise only calls on the widget's own
// callback: so every knob's callback and every configure ends here.
function refresh(node) {
  try {
    node.widgets?.find((w) => w.name === WIDGET)?.triggerDraw?.();
    node.setDirtyCanvas?.(true, true);
  } catch (e) {
    // a redraw request is a convenience; the next draw reads the current values anyway
  }
}

// Chain a redraw onto each knob's callback, which the frontends call for mouse, keyboard and Vue widget input
// and which code setting a value is expected to call (`widget.value = v; widget.callback?.(v)`).
const followed = new WeakSet();
function followKnobs(node) {
  for (const w of node.widgets ?? []) {
    if (w.name === WIDGET || followed.has(w)) continue;
    const callback = w.callback;
    w.callback = function () {
      const r = callback?.apply(this, arguments);
      refresh(node);
      return r;
    };
    followed.add(w);
  }
}

function fitNode(node) {
  const want = node.computeSize?.();
  if (!want) return;
  const w = Math.max(node.size[0], MIN_WIDTH, want[0]);
  const h = Math.max(node.size[1], want[1]);
  if (w !== node.size[0] || h !== node.size[1]) node.setSize?.([w, h]);
}

function supported(nodeType) {
  return typeof nodeType?.prototype === "object" && typeof globalThis.LiteGraph === "object" && globalThis.LiteGraph !== null;
}

try {
  if (typeof app?.registerExtension === "function") {
    app.registerExtension({
      name: EXT,
      async beforeRegisterNodeDef(nodeType, nodeData) {
        try {
          if (nodeData?.name !== NODE || !supported(nodeType)) return;
          const onNodeCreated = nodeType.prototype.onNodeCreated;
          nodeType.prototype.onNodeCreated = function () {
            const r = onNodeCreated?.apply(this, arguments);
            try {
              if (typeof this.addCustomWidget === "function" && !this.widgets?.some((w) => w.name === WIDGET)) {
                this.addCustomWidget(makeWidget(this));
                fitNode(this);
              }
              followKnobs(this);
            } catch (e) {
              console.warn(`[${EXT}] no preview on this frontend: ${e?.message ?? e}`);
            }
            return r;
          };
          const onConfigure = nodeType.prototype.onConfigure;
          nodeType.prototype.onConfigure = function () {
            const r = onConfigure?.apply(this, arguments);
            try {
              // a workflow saved without the preview has a smaller node: make room for it; the loaded
              // values are new to the preview
              if (this.widgets?.some((w) => w.name === WIDGET)) {
                fitNode(this);
                refresh(this);
              }
            } catch (e) {
              // size is cosmetic
            }
            return r;
          };
        } catch (e) {
          console.warn(`[${EXT}] disabled: ${e?.message ?? e}`);
        }
      },
    });
  }
} catch (e) {
  console.warn(`[${EXT}] disabled: ${e?.message ?? e}`);
}


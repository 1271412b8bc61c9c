// Pure model of what the PiecewiseSparseAttention knobs do, for the node preview.
// No DOM, no ComfyUI: importable on its own (the browser test checks it against kernels/).
// The maths is docs/MATH.md: k = ceil(density * N), S_i = forced (band, sinks) + top-k by score,
// |S_i| = max(k, #forced_i). The score here is synthetic and deterministic (see routeRow).

export const BLOCK_SIZE = 64;

// Representative token grids (tokens after patching). Wan2.1 480p 81 frames: 21 x 30 x 52 latent
// tokens, 30 transformer blocks (1.3B); FLUX 1024^2: 64 x 64 image tokens after 256 T5 text tokens (ComfyUI pads
// the FLUX T5 prompt to at least 256),
// 19 double + 38 single blocks.
export const GRIDS = {
  wan480p: { id: "wan480p", label: "Wan 480p 81f", grid: [21, 30, 52], prefix: 0, blocks: 30, steps: 50 },
  flux1024: { id: "flux1024", label: "FLUX 1024²", grid: [64, 64], prefix: 256, blocks: 57, steps: 28 },
};

const mortonCache = new Map();

// perm[newPos] = raster index of the grid token placed there; Z-order over (F, H, W) or (H, W),
// the last axis taking the lowest bit of each bit group (same convention as kernels/reorder.py).
export function mortonOrder(grid) {
  const key = grid.join("x");
  const hit = mortonCache.get(key);
  if (hit) return hit;
  const nd = grid.length;
  const count = grid.reduce((a, b) => a * b, 1);
  let nbits = 0;
  for (const n of grid) nbits = Math.max(nbits, Math.max(n - 1, 1).toString(2).length);
  const codes = new Float64Array(count);
  const idx = new Array(nd).fill(0);
  for (let t = 0; t < count; t++) {
    let code = 0;
    for (let b = 0; b < nbits; b++) {
      for (let d = 0; d < nd; d++) {
        if ((idx[d] >> b) & 1) code += 2 ** (b * nd + (nd - 1 - d));
      }
    }
    codes[t] = code;
    for (let d = nd - 1; d >= 0; d--) {
      if (++idx[d] < grid[d]) break;
      idx[d] = 0;
    }
  }
  const order = Array.from({ length: count }, (_, i) => i);
  order.sort((a, b) => codes[a] - codes[b] || a - b);
  const perm = Int32Array.from(order);
  mortonCache.set(key, perm);
  return perm;
}

// k = ceil(density * N), robust to float noise like kernels/config.py (0.1 * 30 gives 3, not 4).
export function budget(density, n) {
  const x = Math.round(density * n * 1e6) / 1e6;
  return Math.max(1, Math.min(n, Math.ceil(x)));
}

export function forcedCount(i, n, band, nSink) {
  const lo = Math.max(0, i - band);
  const hi = Math.min(n - 1, i + band);
  let c = Math.max(0, hi - lo + 1);
  const sinks = Math.min(nSink, n);
  // sinks that are not already inside the band
  c += sinks - Math.max(0, Math.min(sinks, hi + 1) - lo);
  return c;
}

// Mean exact fraction over all query blocks: mean_i max(k, #forced_i) / N.
export function exactFraction(n, density, band, nSink) {
  const k = budget(density, n);
  let total = 0;
  for (let i = 0; i < n; i++) total += Math.max(k, forcedCount(i, n, band, nSink));
  return { fraction: total / (n * n), k, meanExact: total / n };
}

// "auto" = the text prefix blocks (FLUX), 0 without a prefix (Wan); else a non-negative integer.
export function parseSinks(text, preset) {
  const s = String(text ?? "auto").trim().toLowerCase();
  if (s === "" || s === "auto") return { n: Math.ceil(preset.prefix / BLOCK_SIZE), auto: true, error: null };
  if (/^[-+]?\d+$/.test(s) && parseInt(s, 10) >= 0) return { n: parseInt(s, 10), auto: false, error: null };
  return { n: 0, auto: false, error: `sink_blocks "${text}" is not "auto" or an integer` };
}

// "0,-1" or "0-2, 39" -> Set of block indices in [0, total); negative counts from the end. Same reading as
// nodes/policy.py parse_dense_blocks: "," or ";" separate, a range "a-b" has ends of one sign and b >= a.
export function parseDenseBlocks(text, total) {
  const out = new Set();
  const bad = (piece) => ({ set: new Set(), error: `dense_blocks: cannot read "${piece}" (use "0,-1" or "0-2,39")` });
  for (const raw of String(text ?? "").replace(/;/g, ",").split(",")) {
    const piece = raw.trim();
    if (!piece) continue;
    const cut = piece.indexOf("-", 1);
    let lo;
    let hi;
    if (cut > 0) {
      const a = piece.slice(0, cut).trim();
      const b = piece.slice(cut + 1).trim();
      if (!/^-?\d+$/.test(a) || !/^-?\d+$/.test(b)) return bad(piece);
      lo = parseInt(a, 10);
      hi = parseInt(b, 10);
      if ((lo < 0) !== (hi < 0) || hi < lo) return bad(piece);
    } else {
      if (!/^[-+]?\d+$/.test(piece)) return bad(piece);
      lo = hi = parseInt(piece, 10);
    }
    for (let x = lo; x <= hi; x++) {
      const i = x < 0 ? x + total : x;
      if (i >= 0 && i < total) out.add(i);
    }
  }
  return { set: out, error: null };
}

// Which of `steps` sampling steps run sparse: after the dense warm-up (-1 = first 20%) and inside
// [start, end] of the schedule.
export function sparseSteps(denseSteps, start, end, steps) {
  const warm = denseSteps < 0 ? Math.floor(0.2 * steps + 0.5) : Math.min(denseSteps, steps);
  const out = new Array(steps);
  for (let s = 0; s < steps; s++) {
    const p = s / steps;
    out[s] = s >= warm && p >= start && p <= end;
  }
  return out;
}

// Geometry of the KV blocks of a grid under a token order: block of each raster token, block centroids
// and spatial spread (sum over axes of the positional variance of the block's tokens).
const geomCache = new Map();
export function blockGeometry(preset, reorder) {
  const key = `${preset.id}:${reorder}`;
  const hit = geomCache.get(key);
  if (hit) return hit;
  const grid = preset.grid;
  const nd = grid.length;
  const count = grid.reduce((a, b) => a * b, 1);
  const nPrefixBlocks = Math.ceil(preset.prefix / BLOCK_SIZE);
  const perm = reorder === "morton" ? mortonOrder(grid) : null;
  const nGridBlocks = Math.ceil(count / BLOCK_SIZE);
  const n = nPrefixBlocks + nGridBlocks;
  const blockOfToken = new Int32Array(count);
  const sum = new Float64Array(n * nd);
  const sum2 = new Float64Array(n * nd);
  const cnt = new Float64Array(n);
  const coord = new Array(nd);
  for (let pos = 0; pos < count; pos++) {
    const t = perm ? perm[pos] : pos;
    const j = nPrefixBlocks + Math.floor(pos / BLOCK_SIZE);
    blockOfToken[t] = j;
    let r = t;
    for (let d = nd - 1; d >= 0; d--) {
      coord[d] = r % grid[d];
      r = Math.floor(r / grid[d]);
    }
    for (let d = 0; d < nd; d++) {
      sum[j * nd + d] += coord[d];
      sum2[j * nd + d] += coord[d] * coord[d];
    }
    cnt[j] += 1;
  }
  const centroid = new Float64Array(n * nd);
  const spread = new Float64Array(n);
  for (let j = nPrefixBlocks; j < n; j++) {
    let v = 0;
    for (let d = 0; d < nd; d++) {
      const m = sum[j * nd + d] / cnt[j];
      centroid[j * nd + d] = m;
      v += sum2[j * nd + d] / cnt[j] - m * m;
    }
    spread[j] = Math.max(v, 0);
  }
  const diag = Math.sqrt(grid.reduce((a, g) => a + g * g, 0));
  const geom = { preset, reorder, nd, n, nPrefixBlocks, blockOfToken, centroid, spread, diag };
  geomCache.set(key, geom);
  return geom;
}

// Category of each KV block for query block i.
export const CAT = { VIRTUAL: 0, TOPK: 1, BAND: 2, SINK: 3, QUERY: 4 };

// Synthetic routing of one query block. Score = -(distance between block centroids on the token grid),
// as if keys were smooth functions of position; PWT adds its bounded second-order bonus, which grows
// with the block's key spread (here its positional variance), cov_bias adds log(spread). Text blocks
// sit half a grid diagonal away from every image block. Forced blocks (band, sinks) count in the budget.
export function routeRow(geom, i, knobs) {
  const { n, nd, nPrefixBlocks, centroid, spread, diag } = geom;
  const score = new Float64Array(n);
  const lnB = Math.log(BLOCK_SIZE);
  for (let j = 0; j < n; j++) {
    let s;
    const iText = i < nPrefixBlocks;
    const jText = j < nPrefixBlocks;
    if (iText || jText) {
      s = iText && jText ? -Math.abs(i - j) : -0.5 * diag;
    } else {
      let d2 = 0;
      for (let d = 0; d < nd; d++) {
        const x = centroid[i * nd + d] - centroid[j * nd + d];
        d2 += x * x;
      }
      s = -Math.sqrt(d2);
      if (knobs.variant === "pwt") s += Math.min(0.02 * spread[j], lnB);
      if (knobs.covBias) s += Math.log(spread[j] + 1e-6) * 0.5;
    }
    score[j] = s;
  }
  const cat = new Uint8Array(n);
  const forced = [];
  const rest = [];
  for (let j = 0; j < n; j++) {
    if (Math.abs(i - j) <= knobs.band || j < knobs.nSink) forced.push(j);
    else rest.push(j);
  }
  const k = budget(knobs.density, n);
  rest.sort((a, b) => score[b] - score[a] || a - b);
  const extra = Math.max(0, k - forced.length);
  for (let r = 0; r < extra && r < rest.length; r++) cat[rest[r]] = CAT.TOPK;
  for (const j of forced) cat[j] = j < knobs.nSink ? CAT.SINK : CAT.BAND;
  cat[i] = CAT.QUERY;
  return cat;
}

// Estimated attention speedup at exact fraction f: linear interpolation of a recorded curve
// {"points": [[density, speedup], ...]} inside its measured range, else the bound 1 / (f + 1/64)
// (one virtual token per 64-token block still costs a dot product).
export function validCurve(curve) {
  if (!curve || !Array.isArray(curve.points)) return null;
  const pts = curve.points
    .filter((p) => Array.isArray(p) && p.length >= 2 && Number.isFinite(p[0]) && Number.isFinite(p[1]) && p[0] > 0 && p[1] > 0)
    .map((p) => [Number(p[0]), Number(p[1])])
    .sort((a, b) => a[0] - b[0]);
  return pts.length ? { ...curve, points: pts } : null;
}

export function estimateSpeedup(f, curve) {
  const c = validCurve(curve);
  if (c) {
    const pts = c.points;
    const lo = pts[0][0];
    const hi = pts[pts.length - 1][0];
    if (f >= lo - 1e-9 && f <= hi + 1e-9) {
      let value = pts[0][1];
      for (let a = 0; a + 1 < pts.length; a++) {
        const [x0, y0] = pts[a];
        const [x1, y1] = pts[a + 1];
        if (f >= x0 && f <= x1) {
          value = x1 > x0 ? y0 + ((y1 - y0) * (f - x0)) / (x1 - x0) : y0;
          break;
        }
      }
      if (pts.length === 1) value = pts[0][1];
      return { value, kind: "measured", label: `${c.gpu || "H200"} measured` };
    }
  }
  return { value: 1 / (f + 1 / BLOCK_SIZE), kind: "bound", label: "bound 1/(f+1/64)" };
}

export function formatPercent(f) {
  return `${(Math.round(f * 1000) / 10).toFixed(1)}%`;
}

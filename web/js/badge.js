// Badge above the "Piecewise Sparse Attention" node title: variant and density ("PWT 12.5%"), "PSA off"
// when the variant is off. Uses the frontend's node badge list when it has one; otherwise no badge.
import { app } from "../../../scripts/app.js";

const EXT = "piecewise_sparse.badge";
const NODE = "PiecewiseSparseAttention";

const COLORS = { pwt: "#2f7d46", pisa: "#2f5f8f", drop: "#8a5a1f", off: "#555" };

export function badgeText(variant, density) {
  const v = String(variant ?? "pwt").toLowerCase();
  if (v === "off") return "PSA off";
  const pct = Math.round(Number(density) * 1000) / 10;
  return `${v.toUpperCase()} ${Number.isFinite(pct) ? `${pct}%` : "?"}`;
}

// Same drawing contract as the frontend's LGraphBadge (height, getWidth(ctx), draw(ctx, x, y)).
class DensityBadge {
  constructor(node) {
    this.node = node;
    this.height = 20;
    this.padding = 6;
    this.fontSize = 12;
    this.piecewiseSparse = true;
  }

  get text() {
    const w = (name) => this.node.widgets?.find((x) => x.name === name)?.value;
    return badgeText(w("variant"), w("density"));
  }

  get visible() {
    return true;
  }

  getWidth(ctx) {
    const { font } = ctx;
    ctx.font = `bold ${this.fontSize}px sans-serif`;
    const width = ctx.measureText(this.text).width + 2 * this.padding;
    ctx.font = font;
    return width;
  }

  draw(ctx, x, y) {
    const text = this.text;
    const variant = String(this.node.widgets?.find((w) => w.name === "variant")?.value ?? "pwt");
    const { font, fillStyle, textAlign, textBaseline } = ctx;
    ctx.font = `bold ${this.fontSize}px sans-serif`;
    const width = ctx.measureText(text).width + 2 * this.padding;
    ctx.fillStyle = COLORS[variant] ?? COLORS.pwt;
    ctx.beginPath();
    if (ctx.roundRect) ctx.roundRect(x, y, width, this.height, 5);
    else ctx.rect(x, y, width, this.height);
    ctx.fill();
    ctx.fillStyle = "#fff";
    ctx.textAlign = "left";
    ctx.textBaseline = "middle";
    ctx.fillText(text, x + this.padding, y + this.height / 2 + 1);
    Object.assign(ctx, { font, fillStyle, textAlign, textBaseline });
    this.node.psaBadgeText = text;
  }
}

try {
  if (typeof app?.registerExtension === "function") {
    app.registerExtension({
      name: EXT,
      nodeCreated(node) {
        try {
          if (node?.comfyClass !== NODE && node?.type !== NODE) return;
          // feature test: the badge list is drawn by LGraphNode.drawBadges in frontends >= 1.3
          if (!Array.isArray(node.badges) || typeof node.drawBadges !== "function") return;
          if (node.badges.some((b) => b?.piecewiseSparse)) return;
          const badge = new DensityBadge(node);
          const entry = () => badge;
          entry.piecewiseSparse = true;
          node.badges.push(entry);
        } catch (e) {
          console.warn(`[${EXT}] no badge on this frontend: ${e?.message ?? e}`);
        }
      },
    });
  }
} catch (e) {
  console.warn(`[${EXT}] disabled: ${e?.message ?? e}`);
}

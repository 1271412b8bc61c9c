// Badge on the "Piecewise Sparse Attention" node: variant and density ("PWT 12.5%"), "PSA off" when the
// variant is off. The node's badge list is read by both renderers: the classic canvas calls each entry and
// draws what it returns (height, getWidth(ctx), draw(ctx, x, y), as LGraphBadge); Nodes 2.0 (Vue) calls each
// entry inside a computed value and binds the returned object's own enumerable fields (text, fgColor,
// bgColor) to its badge element. So the entry is a function that refreshes `text` from the widgets on every
// call; reading the widget values there is what lets Nodes 2.0 recompute the badge when a value changes.
// Without a badge list the node simply has no badge.
import { app } from "../../../scripts/app.js";

const EXT = "piecewise_sparse.badge";
const NODE = "PiecewiseSparseAttention";

const COLORS = { pwt: "#2f7d46", pisa: "#2f5f8f", drop: "#8a5a1f", off: "#555" };
const HEIGHT = 20;
const PADDING = 6;
const FONT = "bold 12px sans-serif";

export function badgeText(variant, density) {
  const v = String(variant ?? "pwt").toLowerCase();
  if (v === "off") return "PSA off";
  const pct = Math.round(Number(density) * 1000) / 10;
  return `${v.toUpperCase()} ${Number.isFinite(pct) ? `${pct}%` : "?"}`;
}

function widgetValue(node, name) {
  return node.widgets?.find((x) => x.name === name)?.value;
}

// Only text, fgColor and bgColor are own enumerable fields: Nodes 2.0 binds every one of them to an element.
function makeBadge(node) {
  const badge = { text: "", fgColor: "#fff", bgColor: COLORS.pwt };
  const hidden = {
    piecewiseSparse: true,
    height: HEIGHT,
    getWidth(ctx) {
      const { font } = ctx;
      ctx.font = FONT;
      const width = ctx.measureText(this.text).width + 2 * PADDING;
      ctx.font = font;
      return width;
    },
    draw(ctx, x, y) {
      const { font, fillStyle, textAlign, textBaseline } = ctx;
      ctx.font = FONT;
      const width = ctx.measureText(this.text).width + 2 * PADDING;
      ctx.fillStyle = this.bgColor;
      ctx.beginPath();
      if (ctx.roundRect) ctx.roundRect(x, y, width, HEIGHT, 5);
      else ctx.rect(x, y, width, HEIGHT);
      ctx.fill();
      ctx.fillStyle = this.fgColor;
      ctx.textAlign = "left";
      ctx.textBaseline = "middle";
      ctx.fillText(this.text, x + PADDING, y + HEIGHT / 2 + 1);
      Object.assign(ctx, { font, fillStyle, textAlign, textBaseline });
      // what the canvas drew, for scripts and tests (not serialised)
      node.psaBadgeText = this.text;
    },
  };
  for (const [k, v] of Object.entries(hidden)) Object.defineProperty(badge, k, { value: v, enumerable: false });
  const entry = () => {
    const variant = String(widgetValue(node, "variant") ?? "pwt").toLowerCase();
    badge.text = badgeText(variant, widgetValue(node, "density"));
    badge.bgColor = COLORS[variant] ?? COLORS.pwt;
    return badge;
  };
  entry.piecewiseSparse = true;
  entry();
  return entry;
}

try {
  if (typeof app?.registerExtension === "function") {
    app.registerExtension({
      name: EXT,
      nodeCreated(node) {
        try {
          if (node?.comfyClass !== NODE && node?.type !== NODE) return;
          // feature test: a badge list that the frontend draws (LGraphNode.drawBadges, frontends >= 1.3)
          if (!Array.isArray(node.badges) || typeof node.drawBadges !== "function") return;
          if (node.badges.some((b) => b?.piecewiseSparse)) return;
          node.badges.push(makeBadge(node));
        } catch (e) {
          console.warn(`[${EXT}] no badge on this frontend: ${e?.message ?? e}`);
        }
      },
    });
  }
} catch (e) {
  console.warn(`[${EXT}] disabled: ${e?.message ?? e}`);
}

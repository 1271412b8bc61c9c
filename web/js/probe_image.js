// Shows the heat map of "Piecewise Sparse Probe Report" large: the node returns it as a ui image, which
// the frontend already draws inside the node; this grows the node so the map is readable at a glance.
import { app } from "../../../scripts/app.js";

const EXT = "piecewise_sparse.probe_image";
const NODE = "PiecewiseSparseProbeReport";
const MIN_W = 520;
const MAX_IMAGE_H = 640;
const CAPTION_H = 24;

// The frontend's canvas image preview fills the node's free space and letterboxes the image in it: size
// the node so that this space has the image's aspect ratio at a readable width.
function growForImage(node, img) {
  const w = Math.max(node.size[0], MIN_W);
  const aspect = img?.naturalWidth > 0 ? img.naturalHeight / img.naturalWidth : 0.75;
  const imageH = Math.min(MAX_IMAGE_H, Math.round((w - 20) * aspect));
  const preview = node.widgets?.find((x) => typeof x?.name === "string" && x.name.includes("image-preview"));
  const top = preview ? (preview.y ?? preview.last_y) : undefined;
  // with the preview widget: its top + the image + the size caption; else the node's own minimum + the image
  const h = Number.isFinite(top) && top > 0
    ? top + imageH + CAPTION_H
    : Math.max(node.size[1], (node.computeSize?.()?.[1] ?? 100) + imageH);
  if (w !== node.size[0] || h !== node.size[1]) node.setSize?.([w, h]);
  node.setDirtyCanvas?.(true, true);
}

try {
  if (typeof app?.registerExtension === "function") {
    app.registerExtension({
      name: EXT,
      async beforeRegisterNodeDef(nodeType, nodeData) {
        try {
          if (nodeData?.name !== NODE || typeof nodeType?.prototype !== "object") return;
          const onExecuted = nodeType.prototype.onExecuted;
          nodeType.prototype.onExecuted = function (output) {
            const r = onExecuted?.apply(this, arguments);
            try {
              if (Array.isArray(output?.images) && output.images.length) {
                const node = this;
                growForImage(node, null);
                // the frontend loads the image into node.imgs; size to its aspect once it is there
                let tries = 0;
                const poll = () => {
                  const img = node.imgs?.[0];
                  if (img?.complete && img.naturalWidth > 0) growForImage(node, img);
                  else if (tries++ < 50) setTimeout(poll, 100);
                };
                setTimeout(poll, 0);
              }
            } catch (e) {
              console.warn(`[${EXT}] ${e?.message ?? e}`);
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

"""Helpers for the browser tests: find Chromium/Playwright/ComfyUI, start ComfyUI with this pack, open the
frontend in headless Chromium with the known console noise answered, and map graph coordinates to the
screen. See ../shared/TESTING.md for the facts these rely on."""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from comfy_server import SKIP_REASON, comfy_server, comfyui_path

ROOT = Path(__file__).resolve().parent.parent
# the pack ComfyUI loads: this repo (PSA_BROWSER_PACK points elsewhere, e.g. an installed copy)
PACK = Path(os.environ.get("PSA_BROWSER_PACK") or ROOT)
ARTIFACTS = ROOT / "artifacts" / "browser"
NODE = "PiecewiseSparseAttention"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
# a fresh user directory shows a template pop-up and trips a frontend 1.27 page error; these avoid both
SETTINGS = {
    "Comfy.TutorialCompleted": True,
    "Comfy.Canvas.LeftMouseClickBehavior": "panning",
    "Comfy.Canvas.MouseWheelScroll": "zoom",
    "Comfy.Minimap.Visible": False,
}
READY_JS = (
    "() => !!(window.app && app.vueAppReady && app.graph && app.canvas && window.LiteGraph"
    f" && LiteGraph.registered_node_types['{NODE}'])"
)


def chromium_path() -> str | None:
    for p in (os.environ.get("PSA_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if p and os.path.exists(p):
            return p
    return None


def missing_reason() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Python package `playwright` is not installed (pip install playwright; never `playwright install`)"
    if chromium_path() is None:
        return "Chromium not found at /usr/bin/chromium (apt-get install -y chromium)"
    if comfyui_path() is None:
        return SKIP_REASON
    try:
        import comfyui_frontend_package  # noqa: F401
    except ImportError:
        return "comfyui-frontend-package is not installed (pip install comfyui-frontend-package==1.27.10)"
    if not (PACK / "__init__.py").is_file():
        return f"the pack at {PACK} has no __init__.py (ComfyUI entry point)"
    return None


@contextlib.contextmanager
def comfy_with_pack(pack_dir: Path = PACK):
    """ComfyUI (CPU) on a free local port with the pack loaded and the settings above; yields
    (base_url, tmp) where tmp holds the server's output/, temp/, input/ and server.log."""
    with comfy_server(user_settings=SETTINGS, pack_dir=pack_dir) as url:
        yield str(url), Path(url.tmp)


def answer_known_noise(context) -> None:
    """Requests that fail even with no extension loaded (TESTING.md), answered so that the console can be
    required to hold no error at all."""
    context.route("**/user.css", lambda r: r.fulfill(status=200, content_type="text/css", body=""))
    context.route("**/favicon.ico", lambda r: r.fulfill(status=204, body=""))
    context.route("**/api/userdata/comfy.templates.json",
                  lambda r: r.fulfill(status=200, content_type="application/json", body="[]"))
    context.route("**/api/userdata?dir=*", lambda r: r.fulfill(status=200, content_type="application/json", body="[]"))
    context.route("https://api.comfy.org/**", lambda r: r.fulfill(status=200, content_type="application/json", body="[]"))


class Console:
    """Console messages and page errors of one page."""

    def __init__(self, page):
        self.messages: list[tuple[str, str]] = []
        page.on("console", lambda m: self.messages.append((m.type, m.text)))
        page.on("pageerror", lambda e: self.messages.append(("pageerror", str(e))))

    def errors(self) -> list[str]:
        return [f"{t}: {x}" for t, x in self.messages if t in ("error", "pageerror")]

    def ours(self, since: int = 0) -> list[str]:
        """Anything our extensions said from message `since` on (they only speak when they fall back)."""
        return [f"{t}: {x}" for t, x in self.messages[since:] if "piecewise_sparse" in x]


def node_screen_box(page, node_id: int, local: list[float]) -> dict:
    """Screen rectangle (page pixels) of a node-local rectangle [x, y, w, h]."""
    return page.evaluate(
        """([id, r]) => {
          const n = app.graph.getNodeById(id);
          const ds = app.canvas.ds;
          const c = app.canvas.canvas.getBoundingClientRect();
          const s = ds.scale;
          return {x: c.left + (n.pos[0] + r[0] + ds.offset[0]) * s, y: c.top + (n.pos[1] + r[1] + ds.offset[1]) * s,
                  width: r[2] * s, height: r[3] * s};
        }""",
        [node_id, local],
    )


def redraw(page) -> None:
    page.evaluate("() => { app.canvas.setDirty(true, true); app.canvas.draw(true, true); }")

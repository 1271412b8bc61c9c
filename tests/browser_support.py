"""Helpers for the browser tests: the pinned frontends, a ComfyUI server per frontend with this pack and one
without it, headless Chromium with the frontend's own noise requests answered, console errors reduced to
comparable lines, and node rectangles / screen positions in both renderers (classic canvas, Nodes 2.0).

Facts these rely on (seen on ComfyUI 0.3.64 with frontends 1.27.10, 1.49.6 and 1.58.1, CPU only):
- any server serves another frontend with `--front-end-root <dir>/comfyui_frontend_package/static`;
  `.ci/run` installs the pinned ones with `pip install --no-deps --target .venv/frontends/<version>`;
- Nodes 2.0 (the Vue renderer) is the setting `Comfy.VueNodes.Enabled`; there nodes are DOM elements
  `[data-node-id]` and a canvas widget is drawn on a <canvas> inside its node's element;
- with no pack at all the frontends log errors of their own (404s of a 0.3.64 server for newer routes,
  `ComfyApp graph accessed before initialization` on 1.49.6, blocked requests to outside hosts): the tests
  answer the requests they can and compare the rest with a server without the pack, in the same run."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path

from comfy_server import PACK_DIR_NAME, SKIP_REASON, comfy_server, comfyui_path, post_json

ROOT = Path(__file__).resolve().parent.parent
# the pack ComfyUI loads: this repo (PSA_BROWSER_PACK points elsewhere, e.g. an installed copy)
PACK = Path(os.environ.get("PSA_BROWSER_PACK") or ROOT)
ARTIFACTS = ROOT / "artifacts" / "browser"
NODE = "PiecewiseSparseAttention"
# pinned frontends: the one ComfyUI 0.3.64 pins, the one 0.33.0 pins, PyPI's newest (2026-10); .ci/run
# installs the same list
FRONTENDS = ("1.27.10", "1.49.6", "1.58.1")
FRONTENDS_DIR = Path(os.environ.get("PSA_FRONTENDS_DIR") or ROOT / ".venv" / "frontends")
RENDERERS = ("classic", "vue")
VUE_SETTING = "Comfy.VueNodes.Enabled"
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
APP_READY_JS = "() => !!(window.app && app.vueAppReady && app.graph && app.canvas && window.LiteGraph)"
READY_JS = APP_READY_JS[:-1] + f" && LiteGraph.registered_node_types['{NODE}'])"


def chromium_path() -> str | None:
    for p in (os.environ.get("PSA_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if p and os.path.exists(p):
            return p
    return None


def frontend_root(version: str) -> Path | None:
    p = FRONTENDS_DIR / version / "comfyui_frontend_package" / "static"
    return p if (p / "index.html").is_file() else None


def missing_reason() -> str | None:
    """Why no browser test can run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Python package `playwright` is not installed (pip install playwright; never `playwright install`)"
    if chromium_path() is None:
        return "Chromium not found at /usr/bin/chromium (apt-get install -y chromium)"
    if comfyui_path() is None:
        return SKIP_REASON
    if not (PACK / "__init__.py").is_file():
        return f"the pack at {PACK} has no __init__.py (ComfyUI entry point)"
    return None


def frontend_missing_reason(version: str) -> str | None:
    if frontend_root(version) is None:
        return (f"frontend {version} not found under {FRONTENDS_DIR} (bash .ci/run installs it: pip install --no-deps "
                f"--target {FRONTENDS_DIR}/{version} comfyui-frontend-package=={version})")
    return None


@contextlib.contextmanager
def servers_for(version: str):
    """Two ComfyUI servers (CPU) serving frontend `version`: one with the pack, one with an empty custom node
    folder in its place; started side by side. Yields (pack_url, bare_url); each URL has .tmp and .log."""
    root = str(frontend_root(version))
    with tempfile.TemporaryDirectory(prefix="psa_nopack_") as empty, contextlib.ExitStack() as stack:
        (Path(empty) / "__init__.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
        cms = [comfy_server(user_settings=SETTINGS, pack_dir=d, extra_args=("--front-end-root", root))
               for d in (PACK, Path(empty))]
        urls: list = [None, None]
        errors: list[BaseException] = []

        def enter(i):
            try:
                urls[i] = cms[i].__enter__()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=enter, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, cm in enumerate(cms):
            if urls[i] is not None:
                stack.push(cm.__exit__)
        if errors:
            raise errors[0]
        yield urls[0], urls[1]


def set_renderer(base: str, renderer: str) -> None:
    """Store the renderer setting on the server, so that the next page opens in it."""
    status, _ = post_json(f"{base}/api/settings/{VUE_SETTING}", renderer == "vue")
    assert status == 200, f"could not store {VUE_SETTING}: HTTP {status}"


def _json(route, body) -> None:
    route.fulfill(status=200, content_type="application/json", body=json.dumps(body))


def answer_known_noise(context) -> None:
    """Requests that fail with no pack loaded (a 0.3.64 server lacks newer routes; the network is closed),
    answered so that what is left of the console can be compared with a server without the pack."""
    context.route("**/user.css", lambda r: r.fulfill(status=200, content_type="text/css", body=""))
    context.route("**/favicon.ico", lambda r: r.fulfill(status=204, body=""))
    context.route("**/api/userdata/comfy.templates.json", lambda r: _json(r, []))
    context.route("**/api/userdata?dir=*", lambda r: _json(r, []))
    context.route(re.compile(r".*/api/jobs(\?.*)?$"),
                  lambda r: _json(r, {"jobs": [], "pagination": {"total": 0, "offset": 0, "limit": 0, "has_more": False}}))
    context.route("**/api/global_subgraphs", lambda r: _json(r, {}))
    context.route("https://api.comfy.org/**", lambda r: _json(r, []))
    context.route("https://huggingface.co/**", lambda r: r.fulfill(status=200, headers={"content-length": "0"}, body=""))


_PORT = re.compile(r"127\.0\.0\.1:\d+")
_QUERY = re.compile(r"\?[^\s)]*")


class Console:
    """Console messages and page errors of one page. `errors()` gives each error as one comparable line:
    the first line of its text, the port and query strings removed, and the resource for a failed load."""

    def __init__(self, page):
        self.messages: list[tuple[str, str, str]] = []
        page.on("console", lambda m: self.messages.append((m.type, m.text, (m.location or {}).get("url", ""))))
        page.on("pageerror", lambda e: self.messages.append(("pageerror", str(e), "")))

    def mark(self) -> int:
        return len(self.messages)

    def errors(self, since: int = 0) -> list[str]:
        out = []
        for t, text, url in self.messages[since:]:
            if t not in ("error", "pageerror"):
                continue
            line = text.strip().splitlines()[0] if text.strip() else ""
            if line.startswith("Failed to load resource"):
                line += f" [{url}]"
            out.append(f"{t}: {_QUERY.sub('', _PORT.sub('HOST', line))}")
        return out

    def ours(self, since: int = 0) -> list[str]:
        """Anything our extensions said from message `since` on (they only speak when they fall back)."""
        return [f"{t}: {x}" for t, x, _ in self.messages[since:] if "piecewise_sparse" in x]


def open_page(browser, base: str, renderer: str, ready_js: str = READY_JS, routes=None):
    """A new browser context on `base` in `renderer`, the known noise answered; returns (context, page,
    console) once the app is up."""
    set_renderer(base, renderer)
    context = browser.new_context(viewport={"width": 1600, "height": 1000}, device_scale_factor=1)
    answer_known_noise(context)
    for pattern, handler in routes or ():
        context.route(pattern, handler)
    page = context.new_page()
    console = Console(page)
    page.goto(base + "/")
    page.wait_for_function(ready_js, timeout=90_000)
    return context, page, console


def settle(page, frames: int = 3) -> None:
    """Let the frontend finish a few animation frames (Nodes 2.0 lays nodes out after a graph change)."""
    page.evaluate("""(n) => new Promise((done) => { const step = (k) => k ? requestAnimationFrame(() => step(k - 1)) : done();
                                                   step(n); })""", frames)


def redraw(page) -> None:
    page.evaluate("() => { app.canvas.setDirty(true, true); app.canvas.draw(true, true); }")


def node_rects(page, renderer: str) -> dict:
    """{node id: [x, y, w, h]} in graph units, title bar included: the canvas layout in the classic renderer,
    the nodes' DOM elements in Nodes 2.0."""
    return page.evaluate(
        """(vue) => {
          const out = {};
          if (!vue) {
            const th = LiteGraph.NODE_TITLE_HEIGHT ?? 30;
            for (const n of app.graph.nodes) out[n.id] = [n.pos[0], n.pos[1] - th, n.size[0], n.size[1] + th];
            return out;
          }
          const ds = app.canvas.ds;
          const c = app.canvas.canvas.getBoundingClientRect();
          for (const el of document.querySelectorAll('[data-node-id]')) {
            const r = el.getBoundingClientRect();
            if (!r.width || !r.height) continue;
            out[el.dataset.nodeId] = [(r.left - c.left) / ds.scale - ds.offset[0], (r.top - c.top) / ds.scale - ds.offset[1],
                                      r.width / ds.scale, r.height / ds.scale];
          }
          return out;
        }""", renderer == "vue")


def overlaps(rects: dict) -> list[tuple[str, str]]:
    ids = sorted(rects, key=str)
    out = []
    for i, a in enumerate(ids):
        ax, ay, aw, ah = rects[a]
        for b in ids[i + 1:]:
            bx, by, bw, bh = rects[b]
            if ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah:
                out.append((str(a), str(b)))
    return out


def graph_to_screen(page, x: float, y: float) -> dict:
    return page.evaluate(
        """([x, y]) => { const ds = app.canvas.ds; const c = app.canvas.canvas.getBoundingClientRect();
                         return {x: c.left + (x + ds.offset[0]) * ds.scale, y: c.top + (y + ds.offset[1]) * ds.scale}; }""",
        [x, y])


def node_screen_box(page, node_id: int, local: list[float]) -> dict:
    """Screen rectangle (page pixels) of a node-local rectangle [x, y, w, h] on the classic canvas."""
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


TITLE_H_JS = "(LiteGraph.NODE_TITLE_HEIGHT ?? 30)"
BADGE_RE = r"^(PWT|PISA|DROP) -?[\d.]+%$|^PSA off$|^[A-Z]+ \?$"
DEPRECATION_HOOK_JS = """(pack) => {
  window.__psaDeprecations = []; window.__psaAllDeprecations = 0;
  const LG = window.LiteGraph;
  if (!Array.isArray(LG?.onDeprecationWarning)) return false;
  LG.alwaysRepeatWarnings = true;  // the frontend reports each message once per page otherwise
  LG.onDeprecationWarning.push((msg) => {
    window.__psaAllDeprecations += 1;
    const line = (new Error().stack ?? '').split('\\n').find((l) => l.includes(pack));
    if (line) window.__psaDeprecations.push(`${msg} | ${line.trim()}`);
  });
  return true;
}"""


class UI:
    """One page of one frontend in one renderer, driven as a user would: the same calls work in the classic
    renderer (canvas coordinates) and in Nodes 2.0 (the node's DOM elements)."""

    def __init__(self, page, console, version, renderer, baseline, shots, object_info):
        self.page, self.console, self.version, self.renderer = page, console, version, renderer
        self.baseline, self.shots, self.object_info = baseline, Path(shots), object_info
        self.vue = renderer == "vue"
        self.mark = 0
        self.preview_drawn = True
        self.no_preview = ""
        self.deprecation_hook = False
        self.badges_drawn = True
        self.no_badge = ""

    def start(self) -> None:
        """After the same settling time as the no-pack baseline: hook deprecation reports, see whether this
        renderer draws the preview at all (the classic one must)."""
        self.page.wait_for_timeout(1000)
        self.deprecation_hook = self.page.evaluate(DEPRECATION_HOOK_JS, f"/extensions/{PACK_DIR_NAME}/")
        node_id = self.new_node(wait_preview=False)
        if self.vue:
            # a renderer that shows no badge row at all (not even the frontend's own "source" badge of a custom
            # node) shows ours neither
            texts = self.page.evaluate(
                """(id) => [...(document.querySelector(`[data-node-id="${id}"]`)?.querySelectorAll('*') ?? [])]
                     .filter((e) => e.childElementCount === 0 && e.offsetParent !== null).map((e) => e.textContent.trim())""",
                node_id)
            self.badges_drawn = PACK_DIR_NAME in texts or any(re.match(BADGE_RE, t) for t in texts)
            if not self.badges_drawn:
                self.no_badge = (f"frontend {self.version}'s Nodes 2.0 shows no node badges (not even its own source "
                                 f"badge '{PACK_DIR_NAME}')")
        try:
            self.wait_drawn(node_id, timeout=5_000)
        except Exception:  # noqa: BLE001 - playwright's TimeoutError; the classic renderer must draw it
            if not self.vue:
                raise
            self.preview_drawn = False
            canvases = self.page.evaluate("(id) => document.querySelectorAll(`[data-node-id=\"${id}\"] canvas`).length", node_id)
            self.no_preview = (f"frontend {self.version}'s Nodes 2.0 draws no canvas widget ({canvases} canvas elements "
                               f"in the node): no preview there, the node stays plain (test_knobs_work_and_serialise)")

    def need_preview(self) -> None:
        if not self.preview_drawn:
            import pytest

            pytest.skip(self.no_preview)

    # ---- graph ----------------------------------------------------------------------------------------
    def settle(self) -> None:
        settle(self.page)

    def redraw(self) -> None:
        redraw(self.page)
        settle(self.page)

    def new_node(self, wait_preview: bool = True) -> int:
        node_id = self.page.evaluate(
            # the old nodes are removed, not cleared: a fresh id each time (Nodes 2.0 of 1.58 leaves a new node
            # with a reused id without its badge row)
            """(type) => { for (const o of [...app.graph.nodes]) app.graph.remove(o);
                           const n = LiteGraph.createNode(type); n.pos = [0, 0]; app.graph.add(n);
                           const ds = app.canvas.ds; ds.scale = 1; ds.offset = [500, 130]; app.canvas.deselectAll?.();
                           app.canvas.setDirty(true, true); return n.id; }""", NODE)
        self.redraw()
        if wait_preview and self.preview_drawn:
            self.wait_drawn(node_id)
        return node_id

    def load(self, wf: dict) -> None:
        self.page.evaluate("() => document.querySelectorAll('.p-toast-message').forEach((e) => e.remove())")
        self.page.evaluate("async (wf) => { await app.loadGraphData(wf); }", wf)
        # the frontend validates the file against its schema and says so in a toast, not in the console
        self.page.wait_for_timeout(300)
        # a dialog the load opened (e.g. missing models or nodes) would cover the canvas for every later test
        if self.page.evaluate("() => document.querySelectorAll('.p-dialog').length") > 0:
            self.page.keyboard.press("Escape")
            self.page.wait_for_timeout(100)
        self.redraw()

    def toasts(self) -> list[str]:
        return self.page.evaluate("() => [...document.querySelectorAll('.p-toast-message')].map((e) => e.innerText)")

    def preview(self, node_id: int) -> dict | None:
        return self.page.evaluate("(id) => app.graph.getNodeById(id).psaPreview ?? null", node_id)

    def wait_drawn(self, node_id: int, timeout: float = 15_000) -> None:
        self.redraw()
        self.page.wait_for_function("(id) => (app.graph.getNodeById(id)?.psaPreview?.draws ?? 0) > 0", arg=node_id,
                                    timeout=timeout)

    def wait_redrawn(self, node_id: int, draws: int) -> dict:
        """The preview once it has been drawn again after `draws` draws (the renderer did it by itself: in Nodes
        2.0 nothing here draws it)."""
        if not self.vue:
            self.redraw()
        self.page.wait_for_function("([id, d]) => (app.graph.getNodeById(id)?.psaPreview?.draws ?? 0) > d",
                                    arg=[node_id, draws], timeout=5_000)
        self.settle()
        return self.preview(node_id)

    def widget_value(self, node_id: int, name: str):
        return self.page.evaluate("([id, name]) => app.graph.getNodeById(id).widgets.find((x) => x.name === name).value",
                                  [node_id, name])

    def properties(self, node_id: int) -> dict:
        return self.page.evaluate("(id) => ({...app.graph.getNodeById(id).properties})", node_id)

    def layout_mismatch(self, wf: dict) -> str | None:
        """Why this renderer's node rectangles do not describe workflow `wf`'s layout, or None: node elements
        away from node.pos, or narrower than the saved size (a renderer may grow a node, not shrink it)."""
        if not self.vue:
            return None
        rects = node_rects(self.page, "vue")
        saved = {str(n["id"]): n["size"][0] for n in wf["nodes"]}
        nodes = self.page.evaluate(f"() => app.graph.nodes.map((n) => [String(n.id), n.type, n.pos[0], n.pos[1] - {TITLE_H_JS}])")
        off = max((max(abs(rects[k][0] - x), abs(rects[k][1] - y)), t) for k, t, x, y in nodes if k in rects)
        narrow = max((saved[k] - rects[k][2], t, rects[k][2], saved[k]) for k, t, _, _ in nodes if k in rects and k in saved)
        if off[0] > 4:
            return f"node elements up to {off[0]:.0f} graph units from node.pos ({off[1]})"
        if narrow[0] > 4:
            return f"node elements narrower than saved ({narrow[1]}: {narrow[2]:.0f} wide, saved {narrow[3]:.0f})"
        return None

    # ---- input --------------------------------------------------------------------------------------------
    def set_from_code(self, node_id: int, name: str, value) -> None:
        """What a script, a loader or another extension does: `widget.value = v` and the widget's callback."""
        self.page.evaluate(
            """([id, name, value]) => { const n = app.graph.getNodeById(id); const w = n.widgets.find((x) => x.name === name);
                 w.value = value; w.callback?.(value, app.canvas, n); }""", [node_id, name, value])

    def drag_density(self, node_id: int, target: float) -> float:
        """Drag the density slider with the mouse to `target`; returns the value the widget took."""
        page = self.page
        opts = page.evaluate("""(id) => { const w = app.graph.getNodeById(id).widgets.find((x) => x.name === 'density');
                                           return {type: w.type, y: w.y, value: w.value, min: w.options.min, max: w.options.max}; }""",
                             node_id)
        lo, hi = opts["min"], opts["max"]
        if self.vue:
            root = page.locator(f'[data-node-id="{node_id}"] [data-slot="slider"][aria-label="density"]')
            track, thumb = root.bounding_box(), root.locator('[data-slot="slider-thumb"]').bounding_box()
            start = {"x": thumb["x"] + thumb["width"] / 2, "y": thumb["y"] + thumb["height"] / 2}
            end = {"x": track["x"] + (target - lo) / (hi - lo) * track["width"], "y": start["y"]}
            # measured on 1.49.6 and 1.58.1: the Nodes 2.0 slider lands up to ~0.03 from the linear position
            # of the drop point (its thumb sits inset from the track ends)
            px = (hi - lo) / track["width"] + 0.02
        else:
            assert opts["type"] == "slider", opts
            width = page.evaluate("(id) => app.graph.getNodeById(id).size[0]", node_id)

            def local_x(v: float) -> float:
                # the canvas slider maps value = min + (max - min) * (x - 15) / (width - 30)
                return 15 + (v - lo) / (hi - lo) * (width - 30)

            start = node_screen_box(page, node_id, [local_x(opts["value"]), opts["y"] + 10, 0, 0])
            end = node_screen_box(page, node_id, [local_x(target), opts["y"] + 10, 0, 0])
            px = (hi - lo) / (width - 30)
        page.mouse.move(start["x"], start["y"])
        page.mouse.down()
        page.mouse.move(end["x"], end["y"], steps=12)
        page.mouse.up()
        self.settle()
        value = self.widget_value(node_id, "density")
        # within two screen pixels of the slider, plus the widget's rounding step
        assert abs(value - target) <= 2 * px + 0.01, (value, target)
        return value

    def type_into(self, node_id: int, name: str, text: str) -> None:
        """Edit a text widget with the keyboard: the canvas opens a prompt on a click, Nodes 2.0 has an input."""
        page = self.page
        if self.vue:
            page.locator(f'[data-node-id="{node_id}"] input[aria-label="{name}"]').click()
        else:
            y = page.evaluate("([id, name]) => app.graph.getNodeById(id).widgets.find((x) => x.name === name).y", [node_id, name])
            width = page.evaluate("(id) => app.graph.getNodeById(id).size[0]", node_id)
            at = node_screen_box(page, node_id, [width / 2, y + 10, 0, 0])
            page.mouse.click(at["x"], at["y"])
            page.locator("input.value").last.wait_for(state="visible", timeout=5_000)
        page.keyboard.press("Control+A")
        page.keyboard.type(text)
        page.keyboard.press("Enter")
        self.settle()

    def click_toggle(self, node_id: int) -> None:
        """A real click on the preview's "show FLUX / show Wan" button (right end of its header)."""
        if self.vue:
            box = self.page.locator(f'[data-node-id="{node_id}"] canvas').first.bounding_box()
            x, y = box["x"] + box["width"] - 10 - 46, box["y"] + 9
        else:
            r = self.preview(node_id)["rect"]
            at = node_screen_box(self.page, node_id, [r[0] + r[2] - 46, r[1] + 8, 0, 0])
            x, y = at["x"], at["y"]
        self.page.mouse.click(x, y)
        self.settle()

    # ---- what is drawn ------------------------------------------------------------------------------------
    def need_badge(self) -> None:
        if not self.badges_drawn:
            import pytest

            pytest.skip(self.no_badge)

    def badge(self, node_id: int, expect: str | None = None, timeout: float = 3.0) -> str | None:
        """The badge text the renderer shows: drawn on the canvas (recorded by the badge's draw) or a DOM element;
        with `expect`, waits up to `timeout` s for it (Nodes 2.0 re-renders asynchronously)."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self._badge(node_id)
            if expect is None or seen == expect or time.monotonic() > deadline:
                return seen
            self.page.wait_for_timeout(100)

    def _badge(self, node_id: int):
        if not self.vue:
            self.page.evaluate("(id) => { app.graph.getNodeById(id).psaBadgeText = null; }", node_id)
            self.redraw()
            return self.page.evaluate("(id) => app.graph.getNodeById(id).psaBadgeText ?? null", node_id)
        self.settle()
        found = self.page.evaluate(
            """([id, re]) => { const el = document.querySelector(`[data-node-id="${id}"]`); if (!el) return [];
                 const rx = new RegExp(re);
                 return [...el.querySelectorAll('*')].filter((e) => e.childElementCount === 0 && e.offsetParent !== null)
                   .map((e) => e.textContent.trim()).filter((t) => rx.test(t)); }""", [node_id, BADGE_RE])
        return found[0] if len(found) == 1 else (None if not found else found)

    def preview_box(self, node_id: int) -> dict:
        if self.vue:
            return self.page.locator(f'[data-node-id="{node_id}"] canvas').first.bounding_box()
        return node_screen_box(self.page, node_id, self.preview(node_id)["rect"])

    def node_box(self, node_id: int) -> dict:
        if self.vue:
            b = self.page.locator(f'[data-node-id="{node_id}"]').bounding_box()
            return {"x": b["x"] - 8, "y": b["y"] - 8, "width": b["width"] + 16, "height": b["height"] + 16}
        size = self.page.evaluate("(id) => { const n = app.graph.getNodeById(id); return [n.size[0], n.size[1]]; }", node_id)
        return node_screen_box(self.page, node_id, [-8, -64, size[0] + 16, size[1] + 72])

    def shot(self, name: str, clip: dict | None = None) -> bytes:
        self.shots.mkdir(parents=True, exist_ok=True)
        png = self.page.screenshot(clip=clip) if clip else self.page.screenshot()
        (self.shots / f"{name}.png").write_bytes(png)
        return png

    def preview_png(self, node_id: int, name: str) -> bytes:
        return self.shot(name, self.preview_box(node_id))

    def shot_node(self, node_id: int, name: str) -> bytes:
        return self.shot(name, self.node_box(node_id))

    # ---- console ------------------------------------------------------------------------------------------
    def deprecations(self) -> list[str]:
        return self.page.evaluate("() => window.__psaDeprecations ?? []")

    def check_console(self, allow_ours: int = 0) -> None:
        """No console error beyond the no-pack baseline (over the page's life), nothing from our extensions
        but `allow_ours` messages since the test began, no deprecated frontend API read by our files."""
        extra = [e for e in self.console.errors() if e not in self.baseline]
        assert extra == [], f"console errors that frontend {self.version} ({self.renderer}) does not log without the pack: {extra}"
        ours = self.console.ours(self.mark)
        assert len(ours) == allow_ours, ours
        dep = self.deprecations()
        assert dep == [], f"deprecated frontend API read by the pack: {dep}"


def _thumbnails(only_missing: bool) -> None:
    """Write workflows/<name>.jpg (what the template browser shows for <name>.json): the workflow as it
    opens, a square around our node, 512 px, from the newest frontend found, classic renderer."""
    import io

    from PIL import Image
    from playwright.sync_api import sync_playwright

    version = next(v for v in reversed(FRONTENDS) if frontend_root(v))
    files = [p for p in sorted((ROOT / "workflows").glob("*.json")) if not (only_missing and p.with_suffix(".jpg").exists())]
    with servers_for(version) as (base, _), sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS, headless=True)
        context, page, _console = open_page(b, base, "classic")
        for f in files:
            wf = json.loads(f.read_text())
            page.evaluate("async (wf) => { await app.loadGraphData(wf); }", wf)
            ours = [n for n in wf["nodes"] if n.get("type") == NODE]
            centre = page.evaluate(
                """(id) => { const ds = app.canvas.ds; let cx = 0, cy = 0;
                     const n = id === null ? null : app.graph.getNodeById(id);
                     if (n) { cx = n.pos[0] + n.size[0] / 2; cy = n.pos[1] + n.size[1] / 2 - 40; }
                     ds.scale = 0.7; ds.offset = [800 / 0.7 - cx, 500 / 0.7 - cy]; app.canvas.setDirty(true, true);
                     app.canvas.draw(true, true); return [cx, cy]; }""", ours[0]["id"] if ours else None)
            settle(page)
            png = page.screenshot(clip={"x": 800 - 380, "y": 500 - 380, "width": 760, "height": 760})
            Image.open(io.BytesIO(png)).convert("RGB").resize((512, 512), Image.LANCZOS).save(
                f.with_suffix(".jpg"), "JPEG", quality=85, optimize=True)
            print(f"wrote {f.with_suffix('.jpg').relative_to(ROOT)} (centre {centre})")
        context.close()
        b.close()


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] != ["thumbnails"]:
        raise SystemExit("usage: python tests/browser_support.py thumbnails [--all]   (needs a ComfyUI checkout, "
                         "Chromium, playwright and a frontend under .venv/frontends)")
    _thumbnails(only_missing="--all" not in sys.argv)

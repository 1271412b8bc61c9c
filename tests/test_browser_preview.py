"""The node preview and badge in real ComfyUI frontends: a real server with this pack, headless Chromium, real
mouse and keyboard input, for each pinned frontend (1.27.10, 1.49.6, 1.58.1) in both renderers (the classic
canvas and Nodes 2.0, the Vue renderer). Claims checked, per frontend and renderer: every shipped workflow
loads with the preview and the badge drawn and no two node rectangles overlapping; a density drag, a value set
from code (`widget.value = v` plus its callback), a keyboard edit and a loaded workflow each redraw the
preview (its pixels change) and the badge; the "show FLUX" toggle redraws it; the printed exact fraction is
MATH.md's |S_i| = max(ceil(density*N), #forced) averaged over query blocks, computed here with kernels/; a
failure inside the preview degrades to a plain node; the knobs work and serialise where the preview is not
drawn; the console holds no error beyond those the same frontend logs with no pack loaded (a second server,
same run, same steps) and the pack reads no deprecated frontend API. Once: the JS Morton order and exact
fraction equal kernels/, the speedup comes from the recorded curve, the probe report image is shown large, the
workflows and their thumbnails are served to the template browser. Screenshots: artifacts/browser/."""
from __future__ import annotations

import io
import json
import math

import pytest

from browser_support import (APP_READY_JS, ARTIFACTS, CHROMIUM_FLAGS, FRONTENDS, NODE, RENDERERS, ROOT, UI,
                             chromium_path, frontend_missing_reason, frontend_root, missing_reason, node_rects,
                             node_screen_box, open_page, overlaps, redraw, servers_for, settle)

_REASON = missing_reason()
if _REASON:
    pytest.skip(f"BROWSER TESTS SKIPPED: {_REASON}", allow_module_level=True)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from comfy_server import PACK_DIR_NAME, host_install, http_json  # noqa: E402
from workflow_api import not_made_for  # noqa: E402
from kernels.config import SparseConfig  # noqa: E402
from kernels.reorder import morton_order  # noqa: E402
from kernels.routing import forced_mask  # noqa: E402

pytestmark = pytest.mark.browser

WORKFLOW_FILES = sorted((ROOT / "workflows").glob("*.json"))
COMBOS = [(fe, r) for fe in FRONTENDS for r in RENDERERS]


def _with_node(wf: dict) -> bool:
    return any(isinstance(n, dict) and n.get("type") == NODE for n in wf.get("nodes", []))


def _without_node(wf: dict) -> dict:
    """The workflow with our node and its links taken out: what the no-pack baseline loads."""
    wf = json.loads(json.dumps(wf))
    ours = {n["id"] for n in wf["nodes"] if n.get("type") == NODE}
    gone = {lk[0] for lk in wf.get("links", []) if lk[1] in ours or lk[3] in ours}
    wf["nodes"] = [n for n in wf["nodes"] if n["id"] not in ours]
    wf["links"] = [lk for lk in wf.get("links", []) if lk[0] not in gone]
    for n in wf["nodes"]:
        for i in n.get("inputs") or []:
            if i.get("link") in gone:
                i["link"] = None
        for o in n.get("outputs") or []:
            if o.get("links"):
                o["links"] = [x for x in o["links"] if x not in gone]
    return wf


class Servers:
    """The pack server and the no-pack server of one frontend at a time, and the console errors each renderer
    of that frontend logs with no pack (the baseline), recorded once."""

    def __init__(self):
        self.version = None
        self._cm = None
        self.pack = self.bare = None
        self.baselines: dict[str, set[str]] = {}

    def get(self, version: str) -> "Servers":
        if version != self.version:
            self.close()
            self._cm = servers_for(version)
            self.pack, self.bare = self._cm.__enter__()
            self.version = version
            self.object_info = http_json(self.pack + "/object_info", timeout=60)
        return self

    def baseline(self, browser, renderer: str) -> set[str]:
        if renderer not in self.baselines:
            context, page, console = open_page(browser, self.bare, renderer, APP_READY_JS)
            try:
                page.wait_for_timeout(1000)
                page.evaluate("() => app.graph.clear()")
                for p in WORKFLOW_FILES:
                    page.evaluate("async (wf) => { await app.loadGraphData(wf); }", _without_node(json.loads(p.read_text())))
                    settle(page)
                page.wait_for_timeout(300)
                self.baselines[renderer] = set(console.errors())
            finally:
                context.close()
        return self.baselines[renderer]

    def close(self):
        if self._cm is not None:
            cm, self._cm, self.version = self._cm, None, None
            self.baselines = {}
            cm.__exit__(None, None, None)


_servers = Servers()


@pytest.fixture(scope="module", autouse=True)
def _stop_servers():
    yield
    _servers.close()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module", params=COMBOS, ids=[f"{fe}-{r}" for fe, r in COMBOS])
def ui(request, browser):
    version, renderer = request.param
    reason = frontend_missing_reason(version)
    if reason:
        pytest.skip(reason)
    srv = _servers.get(version)
    baseline = srv.baseline(browser, renderer)
    context, page, console = open_page(browser, srv.pack, renderer)
    try:
        u = UI(page, console, version, renderer, baseline, ARTIFACTS / f"{version}-{renderer}", srv.object_info)
        u.start()
        yield u
    finally:
        context.close()


@pytest.fixture(autouse=True)
def _test_mark(request):
    """Where the current test's console messages start (check_console counts our extensions' words from here)."""
    if "ui" in request.fixturenames:
        u = request.getfixturevalue("ui")
        u.mark = u.console.mark()
    yield


def _shot_array(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(np.int16)


def _changed_fraction(a: bytes, b: bytes) -> float:
    x, y = _shot_array(a), _shot_array(b)
    assert x.shape == y.shape
    return float((np.abs(x - y).sum(-1) > 24).mean())


def _expected_fraction(n: int, density: float, band: int, n_sink: int) -> float:
    """MATH.md through kernels/: k = SparseConfig.budget(N), forced = routing.forced_mask."""
    k = SparseConfig(density=density).budget(n)
    forced = forced_mask(n, n, band, n_sink, "cpu").sum(-1)
    return float(torch.clamp(forced, min=k).double().mean() / n)


def _percent_text(f: float) -> str:
    # JS: (Math.round(f * 1000) / 10).toFixed(1); Math.round rounds halves up
    return f"{math.floor(f * 1000 + 0.5) / 10:.1f}%"


def _grid_blocks(grid_id: str) -> int:
    prefix, grid = {"wan480p": (0, (21, 30, 52)), "flux1024": (256, (64, 64))}[grid_id]
    return -(-prefix // 64) + -(-math.prod(grid) // 64)


def _check_printed_numbers(p: dict, density: float) -> None:
    assert p["density"] == pytest.approx(density, abs=1e-12)
    assert p["nBlocks"] == _grid_blocks(p["grid"])
    want = _expected_fraction(p["nBlocks"], density, p["band"], p["nSink"])
    assert p["formulaFraction"] == pytest.approx(want, abs=1e-12)
    dense = p["variant"] == "off" or p["tokens"] < p["minTokens"]
    assert p["sparse"] is not dense
    if dense:
        assert p["fraction"] == 1 and p["speedupKind"] == "dense" and "100% exact" in p["lines"][0]
    else:
        assert p["fraction"] == pytest.approx(want, abs=1e-12)
        assert p["fractionText"] == _percent_text(want)
        assert f"exact {_percent_text(want)} of KV blocks" in p["lines"][0]
        if p["speedupKind"] == "bound":
            assert p["speedup"] == pytest.approx(1 / (want + 1 / 64))
            assert f"≈ {p['speedup']:.1f}× faster (bound 1/(f+1/64))" in p["lines"][1]


def _badge_text(variant: str, density: float) -> str:
    if variant == "off":
        return "PSA off"
    pct = math.floor(density * 1000 + 0.5) / 10
    return f"{variant.upper()} {pct:g}%"


@pytest.mark.parametrize("wf_file", WORKFLOW_FILES, ids=[p.stem for p in WORKFLOW_FILES])
def test_workflow_loads_with_preview_and_badge_and_no_overlap(ui, wf_file):
    wf = json.loads(wf_file.read_text())
    install = host_install()
    why = not_made_for(wf, install.version if install is not None else None)
    if why:
        # its core nodes are another ComfyUI's: loading it would only open the frontend's missing-nodes dialog
        pytest.skip(f"{wf_file.name}: {why} (the browser tests' server)")
    ui.load(wf)
    ui.shot(f"workflow_{wf_file.stem}")
    assert ui.toasts() == [], f"{wf_file.name}: the frontend complained while loading it"
    ours = [n for n in wf["nodes"] if n.get("type") == NODE]
    for n in ours:
        if ui.preview_drawn:
            ui.wait_drawn(n["id"])
            p = ui.preview(n["id"])
            assert p["density"] == pytest.approx(n["widgets_values"][1]) and p["variant"] == n["widgets_values"][0]
            _check_printed_numbers(p, p["density"])
        want = _badge_text(n["widgets_values"][0], n["widgets_values"][1])
        assert not ui.badges_drawn or ui.badge(n["id"], want) == want
    mismatch = ui.layout_mismatch(wf)
    if mismatch:
        pytest.skip(f"frontend {ui.version}'s {ui.renderer} renderer does not lay nodes out by the workflow ({mismatch}; "
                    f"core nodes overlap there whatever the layout); the node stays plain (test_knobs_work_and_serialise)")
    rects = node_rects(ui.page, ui.renderer)
    assert len(rects) == len(wf["nodes"]), f"{len(rects)} node rectangles for {len(wf['nodes'])} nodes"
    types = {str(n["id"]): n["type"] for n in wf["nodes"]}
    bad = [(types[a], types[b], [round(v) for v in rects[a]], [round(v) for v in rects[b]]) for a, b in overlaps(rects)]
    assert bad == [], f"{wf_file.name}: overlapping nodes after the preview is added: {bad}"
    ui.check_console()


def test_density_drag_redraws_preview_and_badge(ui):
    ui.need_preview()
    node_id = ui.new_node()
    p0 = ui.preview(node_id)
    _check_printed_numbers(p0, p0["density"])
    before = ui.preview_png(node_id, "drag_before")
    target = 0.5
    value = ui.drag_density(node_id, target)
    p1 = ui.wait_redrawn(node_id, p0["draws"])
    _check_printed_numbers(p1, value)
    assert p1["fraction"] != p0["fraction"]
    changed = _changed_fraction(before, ui.preview_png(node_id, "drag_after"))
    assert changed > 0.02, f"only {changed:.2%} of the preview's pixels changed"
    want = _badge_text(p1["variant"], value)
    assert ui.badge(node_id, want) == want
    ui.shot_node(node_id, "drag_node")
    ui.check_console()


KNOB_STEPS = [
    ("density", 0.3), ("band", 4), ("sink_blocks", "3"), ("reorder", "none"), ("variant", "drop"), ("cov_bias", True),
    ("dense_blocks", "0-9,-1"), ("dense_steps", 0), ("end_percent", 0.5), ("variant", "pisa"),
    ("min_tokens", 100000), ("min_tokens", 4096), ("variant", "off"),
]


def test_value_set_from_code_redraws_preview_and_badge(ui):
    ui.need_preview()
    node_id = ui.new_node()
    p = ui.preview(node_id)
    # the shipped H200 curve covers density 0.125: the speed-up is the measured one
    assert p["speedupKind"] == "measured", p["lines"]
    prev = ui.preview_png(node_id, "code_0")
    for i, (name, value) in enumerate(KNOB_STEPS, 1):
        draws = ui.preview(node_id)["draws"]
        ui.set_from_code(node_id, name, value)
        p = ui.wait_redrawn(node_id, draws)
        cur = ui.preview_png(node_id, f"code_{i}_{name}")
        assert _changed_fraction(prev, cur) > 0.0005, f"setting {name}={value!r} did not change the preview"
        _check_printed_numbers(p, p["density"])
        want = _badge_text(p["variant"], p["density"])
        assert ui.badge(node_id, want) == want
        prev = cur
    assert p["variant"] == "off" and p["fraction"] == 1 and p["speedupKind"] == "dense"
    assert p["band"] == 4 and p["nSink"] == 3 and p["reorder"] == "none"
    ui.check_console()


def test_keyboard_edit_redraws_preview(ui):
    ui.need_preview()
    node_id = ui.new_node()
    p0 = ui.preview(node_id)
    before = ui.preview_png(node_id, "keys_before")
    ui.type_into(node_id, "dense_blocks", "0-9,-1")
    p1 = ui.wait_redrawn(node_id, p0["draws"])
    assert ui.widget_value(node_id, "dense_blocks") == "0-9,-1"
    assert "× 19/30 blocks" in p1["lines"][2] and "× 28/30 blocks" in p0["lines"][2]
    assert _changed_fraction(before, ui.preview_png(node_id, "keys_after")) > 0.0005
    ui.check_console()


def test_grid_toggle_click_redraws_preview(ui):
    ui.need_preview()
    node_id = ui.new_node()
    p0 = ui.preview(node_id)
    assert p0["grid"] == "wan480p" and p0["gridAuto"]
    keys = set(ui.properties(node_id))
    before = ui.preview_png(node_id, "toggle_before")
    ui.click_toggle(node_id)
    p1 = ui.wait_redrawn(node_id, p0["draws"])
    assert p1["grid"] == "flux1024" and not p1["gridAuto"]
    assert p1["nBlocks"] == 68 and p1["nSink"] == 4  # "auto" sinks = the 256 text tokens
    _check_printed_numbers(p1, p1["density"])
    assert _changed_fraction(before, ui.preview_png(node_id, "toggle_after")) > 0.02
    props = ui.properties(node_id)
    assert props["piecewise_sparse.preview_grid"] == "flux1024" and keys <= set(props)
    ui.click_toggle(node_id)
    assert ui.wait_redrawn(node_id, p1["draws"])["grid"] == "wan480p"
    ui.shot_node(node_id, "toggle_node")
    ui.check_console()


def test_loaded_workflow_redraws_preview_and_badge(ui):
    ui.need_preview()
    src = next(p for p in WORKFLOW_FILES if _with_node(json.loads(p.read_text())))
    wf = json.loads(src.read_text())
    (node,) = [n for n in wf["nodes"] if n["type"] == NODE]
    ui.load(wf)
    ui.wait_drawn(node["id"])
    before = ui.preview_png(node["id"], "load_before")
    changed = json.loads(json.dumps(wf))
    (ours,) = [n for n in changed["nodes"] if n["type"] == NODE]
    ours["widgets_values"][0:2] = ["pisa", 0.3]
    ours["widgets_values"][8] = "none"
    ui.load(changed)
    ui.wait_drawn(node["id"])
    p = ui.preview(node["id"])
    assert (p["variant"], p["density"], p["reorder"]) == ("pisa", 0.3, "none")
    _check_printed_numbers(p, 0.3)
    assert ui.badge(node["id"], "PISA 30%") == "PISA 30%"
    assert _changed_fraction(before, ui.preview_png(node["id"], "load_after")) > 0.02
    ui.check_console()


def test_failure_inside_preview_degrades_to_plain_node(ui):
    ui.need_preview()
    node_id = ui.new_node()
    mark = ui.console.mark()
    # a getter that throws stands in for a frontend whose node objects the preview does not understand (an own
    # field of the node, not of node.properties, which is a Vue reactive object in 1.58)
    ui.page.evaluate("""(id) => { const n = app.graph.getNodeById(id);
        Object.defineProperty(n, '__psaPreviewState', { get() { throw new Error('unexpected frontend'); }, configurable: true }); }""",
                     node_id)
    ui.set_from_code(node_id, "band", 2)
    ui.redraw()
    state = ui.page.evaluate(
        """(id) => { const n = app.graph.getNodeById(id); const w = n.widgets.find((x) => x.name === 'piecewise_sparse.preview');
             delete n.__psaPreviewState;
             return {failed: w.failed, height: w.computeSize()[1], widgets: n.widgets.map((x) => x.name)}; }""", node_id)
    assert state["failed"] is True and state["height"] == 0, state
    assert state["widgets"][-1] == "piecewise_sparse.preview" and len(state["widgets"]) == 13, state
    ours = [m for m in ui.console.messages[mark:] if "piecewise_sparse" in m[1]]
    assert len(ours) == 1 and ours[0][0] == "warning", ours
    # the rest of the node still works
    ui.set_from_code(node_id, "band", 3)
    ui.redraw()
    assert ui.widget_value(node_id, "band") == 3
    ui.shot_node(node_id, "degraded_node")
    ui.check_console(allow_ours=1)


def test_knobs_work_and_serialise(ui):
    """Everywhere, also where the renderer draws no preview (frontend 1.27.10's Nodes 2.0): the knobs are plain
    widgets whose values reach the prompt and the saved workflow, and the preview reaches neither."""
    node_id = ui.new_node(wait_preview=False)
    ui.set_from_code(node_id, "density", 0.25)
    ui.set_from_code(node_id, "variant", "pisa")
    saved = ui.page.evaluate("(id) => app.graph.getNodeById(id).serialize().widgets_values", node_id)
    assert len(saved) == 12 and saved[:2] == ["pisa", 0.25]
    prompt = ui.page.evaluate("async () => (await app.graphToPrompt()).output")
    (inputs,) = [v["inputs"] for v in prompt.values() if v["class_type"] == NODE]
    assert "piecewise_sparse.preview" not in inputs and inputs["density"] == 0.25 and inputs["variant"] == "pisa"
    if ui.renderer == "vue":
        labels = ui.page.evaluate("(id) => document.querySelector(`[data-node-id=\"${id}\"]`)?.innerText ?? ''", node_id)
        assert "density" in labels and "variant" in labels, labels
    ui.shot_node(node_id, "plain_node")
    ui.check_console()


def test_no_deprecated_frontend_api(ui):
    if not ui.deprecation_hook:
        pytest.skip(f"frontend {ui.version} reports no deprecations (no LiteGraph.onDeprecationWarning)")
    src = next(p for p in WORKFLOW_FILES if _with_node(json.loads(p.read_text())))
    wf = json.loads(src.read_text())
    (node,) = [n for n in wf["nodes"] if n["type"] == NODE]
    ui.load(wf)
    if ui.preview_drawn:
        ui.wait_drawn(node["id"])
        assert ui.preview(node["id"])["grid"] == ("flux1024" if "flux" in src.name else "wan480p")  # walked upstream
    # the hook sees the frontend's reports: where input.link is deprecated, a read from here is reported
    seen = ui.page.evaluate(
        """(id) => { const input = app.graph.getNodeById(id).inputs[0];
             const d = Object.getOwnPropertyDescriptor(Object.getPrototypeOf(input), 'link');
             const deprecated = !!d?.get && String(d.get).includes('deprecated');
             const before = window.__psaAllDeprecations; void input.link;
             return {deprecated, reported: window.__psaAllDeprecations > before}; }""", node["id"])
    assert seen["reported"] == seen["deprecated"], seen
    ui.set_from_code(node["id"], "density", 0.25)
    ui.redraw()
    assert ui.deprecations() == []
    ui.check_console()


# ---- once, frontend-independent --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lib(browser):
    """web/js/lib/sparsity_model.js in a page of its own (no ComfyUI): the module's exports by URL."""
    context = browser.new_context()
    web = ROOT / "web" / "js"

    def serve(route):
        rel = route.request.url.split("psa.test/", 1)[1].split("?")[0]
        if rel == "":
            return route.fulfill(status=200, content_type="text/html", body="<!doctype html><title>lib</title>")
        path = (web / rel).resolve()
        if web.resolve() not in path.parents or not path.is_file():
            return route.fulfill(status=404, body="")
        ctype = "text/javascript" if path.suffix == ".js" else "application/json"
        return route.fulfill(status=200, content_type=ctype, body=path.read_bytes())

    context.route("http://psa.test/**", serve)
    page = context.new_page()
    page.goto("http://psa.test/")
    yield page, "http://psa.test/lib/sparsity_model.js"
    context.close()


@pytest.mark.parametrize("grid", [(21, 30, 52), (64, 64), (3, 9, 6), (5, 7), (1, 1, 1)])
def test_js_morton_matches_kernels(lib, grid):
    page, url = lib
    perm = page.evaluate("async ([url, g]) => Array.from((await import(url)).mortonOrder(g))", [url, list(grid)])
    assert perm == morton_order(grid).tolist()


def test_js_exact_fraction_matches_kernels_formula(lib):
    page, url = lib
    cases = [(n, d, band, sink) for n in (1, 7, 72, 512) for d in (0.02, 0.1, 0.125, 0.333, 1.0)
             for band in (0, 1, 8) for sink in (0, 3, 8, 100)]
    got = page.evaluate("async ([url, cases]) => { const m = await import(url); return cases.map(([n, d, b, s]) => m.exactFraction(n, d, b, s).fraction); }",
                        [url, cases])
    for (n, d, band, sink), f in zip(cases, got):
        assert f == pytest.approx(_expected_fraction(n, d, band, sink), abs=1e-12), (n, d, band, sink)


def _current_servers() -> Servers:
    """Whatever frontend's servers are up (the tests above leave the last one running), else the first found."""
    if _servers.version is None:
        found = [v for v in FRONTENDS if frontend_root(v)]
        if not found:
            pytest.skip(frontend_missing_reason(FRONTENDS[-1]))
        _servers.get(found[-1])
    return _servers


def test_speedup_comes_from_recorded_curve(browser):
    srv = _current_servers()
    curve = {"gpu": "NVIDIA H200", "date": "2025-01-01", "shape": "test", "variant": "pwt",
             "points": [[0.05, 9.0], [0.125, 5.0], [0.5, 1.8], [1.0, 0.9]]}
    route = ("**/js/speedup_h200.json",
             lambda r: r.fulfill(status=200, content_type="application/json", body=json.dumps(curve)))
    context, page, console = open_page(browser, srv.pack, "classic", routes=[route])
    try:
        u = UI(page, console, srv.version, "classic", srv.baseline(browser, "classic"), ARTIFACTS / "curve", srv.object_info)
        node_id = u.new_node()
        page.wait_for_function("(id) => app.graph.getNodeById(id).psaPreview?.speedupKind === 'measured'", arg=node_id)
        p = u.preview(node_id)
        assert p["fraction"] == pytest.approx(0.125) and p["speedup"] == pytest.approx(5.0)
        u.set_from_code(node_id, "density", 0.3)
        p = u.wait_redrawn(node_id, p["draws"])
        f = _expected_fraction(512, 0.3, 1, 0)  # ceil(0.3 * 512) = 154 of 512 blocks
        assert p["fraction"] == pytest.approx(f, abs=1e-12)
        assert p["speedup"] == pytest.approx(5.0 + (1.8 - 5.0) * (f - 0.125) / (0.5 - 0.125))
        assert "NVIDIA H200 measured" in p["lines"][1]
        # below the measured range the preview says it shows the bound
        u.set_from_code(node_id, "density", 0.02)
        p = u.wait_redrawn(node_id, p["draws"])
        assert p["speedupKind"] == "bound" and "bound" in p["lines"][1]
        u.shot_node(node_id, "curve_measured")
        u.check_console()
    finally:
        context.close()


def test_probe_report_image_shown_large(browser):
    srv = _current_servers()
    report = "PiecewiseSparseProbeReport"
    if report not in srv.object_info:
        pytest.skip(f"{report} is not registered by the pack")
    context, page, console = open_page(browser, srv.pack, "classic")
    try:
        u = UI(page, console, srv.version, "classic", srv.baseline(browser, "classic"), ARTIFACTS / "probe", srv.object_info)
        Image.new("RGB", (640, 400), (200, 40, 40)).save(srv.pack.tmp / "output" / "psa_probe_test.png")
        node_id = page.evaluate(
            """(type) => { app.graph.clear(); const n = LiteGraph.createNode(type); n.pos = [0, 0];
                           // an id of its own: the frontend keeps outputs per node id for later nodes of that id
                           n.id = 7001; app.graph.add(n);
                           const ds = app.canvas.ds; ds.scale = 1; ds.offset = [300, 100]; return n.id; }""", report)
        page.evaluate(
            """(id) => window.comfyAPI.api.api.dispatchCustomEvent('executed', {node: String(id), display_node: String(id),
                 output: {images: [{filename: 'psa_probe_test.png', subfolder: '', type: 'output'}]}})""", node_id)
        page.wait_for_function(
            """(id) => { const n = app.graph.getNodeById(id); return n.imgs?.[0]?.naturalWidth > 0 && n.size[0] >= 520; }""",
            arg=node_id, timeout=15_000)
        redraw(page)
        size = page.evaluate("(id) => app.graph.getNodeById(id).size", node_id)
        assert size[0] >= 520 and size[1] >= 300
        u.shot("probe_report", node_screen_box(page, node_id, [-8, -40, size[0] + 16, size[1] + 48]))
        u.check_console()
    finally:
        context.close()


def test_workflows_and_thumbnails_served_to_template_browser():
    srv = _current_servers()
    listed = http_json(srv.pack + "/workflow_templates")
    assert sorted(listed.get(PACK_DIR_NAME, [])) == sorted(p.stem for p in WORKFLOW_FILES)
    import urllib.request
    for p in WORKFLOW_FILES:
        thumb = p.with_suffix(".jpg")
        assert thumb.is_file(), (f"{p.name} has no thumbnail {thumb.name}: the template browser asks for <name>.jpg "
                                 f"(make it with: python tests/browser_support.py thumbnails)")
        with urllib.request.urlopen(f"{srv.pack}/api/workflow_templates/{PACK_DIR_NAME}/{thumb.name}", timeout=30) as r:
            body = r.read()
            assert r.status == 200 and r.headers.get("Content-Type", "").startswith("image/jpeg")
        img = Image.open(io.BytesIO(body))
        assert img.format == "JPEG" and min(img.size) >= 256, (img.format, img.size)

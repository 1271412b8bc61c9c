"""Helpers for the browser tests: find Chromium/Playwright/ComfyUI, start ComfyUI with this pack, open the
frontend in headless Chromium with the known console noise answered, and map graph coordinates to the
screen. See ../shared/TESTING.md for the facts these rely on."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

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


def comfyui_path() -> Path | None:
    p = Path(os.environ.get("COMFYUI_PATH") or Path.home() / "comfy" / "ComfyUI").expanduser()
    return p if (p / "main.py").is_file() else None


def missing_reason() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Python package `playwright` is not installed (pip install playwright; never `playwright install`)"
    if chromium_path() is None:
        return "Chromium not found at /usr/bin/chromium (apt-get install -y chromium)"
    if comfyui_path() is None:
        return "no ComfyUI checkout at $COMFYUI_PATH or ~/comfy/ComfyUI"
    try:
        import comfyui_frontend_package  # noqa: F401
    except ImportError:
        return "comfyui-frontend-package is not installed (pip install comfyui-frontend-package==1.27.10)"
    if not (PACK / "__init__.py").is_file():
        return f"the pack at {PACK} has no __init__.py (ComfyUI entry point)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


@contextlib.contextmanager
def comfy_with_pack(pack_dir: Path = PACK, timeout: float = 180.0):
    """Start ComfyUI (CPU) on a free local port with `pack_dir` as a custom node under a folder name of
    its own; yield (base_url, workdir). Everything it writes stays in a temporary directory."""
    comfy = comfyui_path()
    assert comfy is not None
    work = Path(tempfile.mkdtemp(prefix="psa_browser_"))
    nodes_dir = work / "custom_nodes"
    nodes_dir.mkdir()
    # CI clones under another name: the folder name must not matter
    (nodes_dir / "psa_pack_under_test").symlink_to(pack_dir.resolve(), target_is_directory=True)
    user = work / "user"
    (user / "default").mkdir(parents=True)
    (user / "default" / "comfy.settings.json").write_text(json.dumps(SETTINGS))
    for d in ("output", "temp"):
        (work / d).mkdir()
    (work / "extra.yaml").write_text(f"psa_browser:\n  custom_nodes: {nodes_dir}\n")
    port = _free_port()
    log = open(work / "server.log", "wb")
    cmd = [sys.executable, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
           "--extra-model-paths-config", str(work / "extra.yaml"), "--output-directory", str(work / "output"),
           "--user-directory", str(user), "--temp-directory", str(work / "temp"),
           "--database-url", "sqlite:///:memory:", "--disable-auto-launch"]
    proc = subprocess.Popen(cmd, cwd=comfy, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with {proc.returncode}:\n{_tail(work / 'server.log')}")
            try:
                _get(base + "/system_stats")
                break
            except OSError:
                if time.monotonic() - t0 > timeout:
                    raise RuntimeError(f"ComfyUI did not answer in {timeout:.0f} s:\n{_tail(work / 'server.log')}")
                time.sleep(0.5)
        yield base, work
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


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

    def ours(self) -> list[str]:
        """Anything our extensions said (they only speak when they fall back)."""
        return [f"{t}: {x}" for t, x in self.messages if "piecewise_sparse" in x]


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

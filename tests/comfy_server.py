"""A real ComfyUI server for tests, with this pack loaded as a custom node.

    with comfy_server(extra_custom_nodes={"test_nodes.py": SOURCE}, diffusion_models=dir) as base_url:
        requests.get(base_url + "/object_info")

ComfyUI is found at $COMFYUI_PATH, else ~/comfy/ComfyUI (`comfyui_path()`); `SKIP_REASON` is the one loud
line tests skip with when it is absent. Everything the server writes (output, user, temp, database)
stays in a temporary directory; the server is started with `exec` semantics (our Popen is the server's
PID) and stopped by that PID. See ../shared/TESTING.md for the facts this relies on.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACK_DIR_NAME = "piecewise_sparse_attention_pack"  # any name works; CI clones under another one


def comfyui_path() -> Path | None:
    p = Path(os.environ.get("COMFYUI_PATH") or Path.home() / "comfy" / "ComfyUI").expanduser()
    return p if (p / "main.py").is_file() and (p / "comfy").is_dir() else None


SKIP_REASON = ("ComfyUI NOT FOUND: set COMFYUI_PATH or put a checkout at ~/comfy/ComfyUI "
               "(bash .ci/comfy_setup.sh); the real-ComfyUI tests are SKIPPED")


def skip_without_comfyui() -> None:
    """Module-level skip of a ComfyUI test module, raised here so that pytest -ra folds every module's skip
    into one line."""
    if comfyui_path() is None:
        import pytest

        pytest.skip(SKIP_REASON, allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, data=None, timeout: float = 30.0):
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"} if body else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode() or "null")


def post_json(url: str, data, timeout: float = 30.0) -> tuple[int, object]:
    """(status, parsed body) also for 4xx answers (ComfyUI reports validation errors as 400)."""
    req = urllib.request.Request(url, data=json.dumps(data).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read().decode() or "null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode() or "null")


def tail(path: Path, n: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class ServerFailed(RuntimeError):
    pass


class ServerURL(str):
    """The base URL (a str), plus `.tmp` (the server's temporary root: output/, temp/, input/) and `.log`."""

    tmp: Path
    log: Path


@contextlib.contextmanager
def comfy_server(extra_custom_nodes: dict[str, str] | None = None, user_settings: dict | None = None, *,
                 diffusion_models: Path | None = None, model_dirs: dict[str, Path] | None = None,
                 env: dict[str, str] | None = None, extra_args: tuple[str, ...] = (),
                 pack_dir: Path = ROOT, timeout: float = 180.0, log_path: Path | None = None):
    """Start `main.py --cpu` with this pack (and `extra_custom_nodes`: file name -> Python source) as custom
    nodes; yield the base URL; stop the server by its PID.

    user_settings: written to the default user's comfy.settings.json (the browser tests pre-fill it).
    diffusion_models / model_dirs: folders for the loaders (model_dirs maps a ComfyUI folder name such as
    "text_encoders" or "vae" to a path). env: extra environment for the server. The server log is at
    `<tmp>/server.log`, or `log_path`; its tail is in the error when the server does not come up."""
    comfy = comfyui_path()
    if comfy is None:
        raise ServerFailed(SKIP_REASON)
    with tempfile.TemporaryDirectory(prefix="psa_comfy_") as tmp:
        tmp = Path(tmp)
        nodes_dir = tmp / "custom_nodes"
        nodes_dir.mkdir()
        (nodes_dir / PACK_DIR_NAME).symlink_to(Path(pack_dir).resolve(), target_is_directory=True)
        for name, source in (extra_custom_nodes or {}).items():
            (nodes_dir / name).write_text(source)
        folders = {"custom_nodes": nodes_dir}
        if diffusion_models is not None:
            folders["diffusion_models"] = Path(diffusion_models)
        folders.update(model_dirs or {})
        yaml_lines = ["psa_test:", f"    base_path: {tmp}"]
        yaml_lines += [f"    {k}: {Path(v).resolve()}" for k, v in folders.items()]
        (tmp / "extra.yaml").write_text("\n".join(yaml_lines) + "\n")
        user = tmp / "user"
        (user / "default").mkdir(parents=True)
        if user_settings is not None:
            (user / "default" / "comfy.settings.json").write_text(json.dumps(user_settings))
        for d in ("output", "temp", "input"):
            (tmp / d).mkdir()
        port = free_port()
        cmd = [sys.executable, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
               "--extra-model-paths-config", str(tmp / "extra.yaml"), "--output-directory", str(tmp / "output"),
               "--input-directory", str(tmp / "input"), "--user-directory", str(user),
               "--temp-directory", str(tmp / "temp"), "--database-url", "sqlite:///:memory:",
               "--disable-auto-launch", *extra_args]
        log_file = Path(log_path) if log_path else tmp / "server.log"
        penv = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        with open(log_file, "w") as logf:
            proc = subprocess.Popen(cmd, cwd=comfy, stdout=logf, stderr=subprocess.STDOUT, env=penv,
                                    stdin=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise ServerFailed(f"ComfyUI exited with {proc.returncode}:\n{tail(log_file)}")
                try:
                    http_json(base + "/system_stats", timeout=2.0)
                    break
                except (OSError, ValueError):
                    if time.monotonic() > deadline:
                        raise ServerFailed(f"ComfyUI did not answer within {timeout:.0f} s:\n{tail(log_file)}")
                    time.sleep(0.5)
            url = ServerURL(base)
            url.tmp, url.log = tmp, log_file
            yield url
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=20)


def wait_history(base: str, prompt_id: str, timeout: float = 240.0) -> dict:
    """The history entry of a prompt once it finished (success or error)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = http_json(f"{base}/history/{prompt_id}")
        if prompt_id in h and h[prompt_id].get("status", {}).get("completed") is not None:
            st = h[prompt_id]["status"]
            if st.get("completed") or st.get("status_str") == "error":
                return h[prompt_id]
        time.sleep(0.3)
    raise TimeoutError(f"prompt {prompt_id} did not finish within {timeout:.0f} s")

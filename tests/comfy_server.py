"""A real ComfyUI server for tests, with this pack loaded as a custom node.

    with comfy_server(extra_custom_nodes={"test_nodes.py": SOURCE}, diffusion_models=dir) as base_url:
        requests.get(base_url + "/object_info")

ComfyUI is found at $COMFYUI_PATH (one checkout or several, os.pathsep-separated), else ~/comfy/ComfyUI and
its siblings ~/comfy/ComfyUI-<version> (`comfy_installs()`, newest first; `comfyui_path()` is the newest);
`SKIP_REASON` is the one loud line tests skip with when there is none. tests/conftest.py runs the tests of
modules that set COMFY_VERSIONED over every version (in-process modules: the newest here, the others in a
pytest child). Everything the server writes (output, user, temp, database)
stays in a temporary directory; the server is started with `exec` semantics (our Popen is the server's
PID) and stopped by that PID. See ../shared/TESTING.md for the facts this relies on.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACK_DIR_NAME = "piecewise_sparse_attention_pack"  # any name works; CI clones under another one


# the ComfyUI versions the tests are meant to run against (.ci/comfy_setup.sh materialises each); a known
# version that is not found gets one loud skip line instead of silently shrinking the matrix
KNOWN_VERSIONS = ("0.3.64", "0.33.0")
SITE_DIR = ".psa-site-packages"  # inside a checkout: that version's own UI pins (frontend, templates, docs)
CHILD_ENV = "PSA_COMFY_CHILD"  # set in a pytest child that runs one version's in-process tests


@dataclass(frozen=True)
class ComfyInstall:
    """One ComfyUI checkout: its folder, its version, and the folder of its own pins (put on PYTHONPATH in
    front of the shared venv when its server runs), if it has one."""

    path: Path
    version: str

    @property
    def id(self) -> str:
        return f"comfy{self.version}"

    @property
    def site(self) -> Path | None:
        d = self.path / SITE_DIR
        return d if d.is_dir() else None


def _version_of(path: Path) -> str:
    try:
        return (path / "comfyui_version.py").read_text().split('"')[1]
    except (OSError, IndexError):
        return "unknown"


def _is_checkout(p: Path) -> bool:
    return (p / "main.py").is_file() and (p / "comfy").is_dir()


def _vkey(v: str):
    return tuple(int(x) if x.isdigit() else -1 for x in v.split("."))


@functools.lru_cache(maxsize=None)
def _installs(env_value: str | None, exact: bool) -> tuple[ComfyInstall, ...]:
    # each path and its siblings <path>-<version> (what comfy_setup.sh makes); a pytest child: exactly its one
    bases = [Path(x).expanduser() for x in (env_value or str(Path.home() / "comfy" / "ComfyUI")).split(os.pathsep) if x]
    cands = []
    for base in bases:
        cands += [base] if exact else [base] + sorted(base.parent.glob(base.name + "-*"))
    found, seen = [], set()
    for c in cands:
        if _is_checkout(c) and c.resolve() not in seen:
            seen.add(c.resolve())
            found.append(ComfyInstall(c, _version_of(c)))
    return tuple(sorted(found, key=lambda i: _vkey(i.version), reverse=True))


def comfy_installs() -> tuple[ComfyInstall, ...]:
    """Every ComfyUI checkout found, newest first: each of $COMFYUI_PATH (one path or several, os.pathsep-
    separated; default ~/comfy/ComfyUI) with its siblings <path>-* (e.g. ~/comfy/ComfyUI-0.33.0)."""
    return _installs(os.environ.get("COMFYUI_PATH"), bool(os.environ.get(CHILD_ENV)))


def host_install() -> ComfyInstall | None:
    """The checkout this pytest process imports in-process (the newest); the others run in a child."""
    found = comfy_installs()
    return found[0] if found else None


def version_ids() -> list[str]:
    """Test ids of the version matrix: every version found (test_comfy_versions.py skips loudly, once, for each
    known version that is not)."""
    return [i.id for i in comfy_installs()]


def install_by_id(vid: str) -> ComfyInstall | None:
    return next((i for i in comfy_installs() if i.id == vid), None)


def missing_version_reason(vid: str) -> str:
    return (f"ComfyUI {vid[len('comfy'):]} NOT FOUND (bash .ci/comfy_setup.sh materialises it, or list it in "
            f"COMFYUI_PATH): its real-ComfyUI tests are SKIPPED")


def comfyui_path() -> Path | None:
    host = host_install()
    return None if host is None else host.path


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
                 pack_dir: Path = ROOT, timeout: float = 180.0, log_path: Path | None = None,
                 install: ComfyInstall | None = None):
    """Start `main.py --cpu` with this pack (and `extra_custom_nodes`: file name -> Python source) as custom
    nodes; yield the base URL; stop the server by its PID.

    user_settings: written to the default user's comfy.settings.json (the browser tests pre-fill it).
    diffusion_models / model_dirs: folders for the loaders (model_dirs maps a ComfyUI folder name such as
    "text_encoders" or "vae" to a path). env: extra environment for the server. The server log is at
    `<tmp>/server.log`, or `log_path`; its tail is in the error when the server does not come up.
    install: which ComfyUI (default: host_install(), the newest found); its own pins go on PYTHONPATH."""
    install = install or host_install()
    if install is None:
        raise ServerFailed(SKIP_REASON)
    comfy = install.path
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
        if install.site is not None:
            penv["PYTHONPATH"] = os.pathsep.join(x for x in (str(install.site), penv.get("PYTHONPATH")) if x)
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

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

# the repo root makes `kernels` importable as a top-level package (as users and CI do); tests/ itself
# holds shared test helpers (bruteforce.py, comfy_server.py) that test modules import by name
ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import comfy_server  # noqa: E402

# ---------------------------------------------------------------------------------------------------
# the ComfyUI version matrix. A module with COMFY_VERSIONED = True runs each of its tests once per version
# (ids comfy<version>; fixture `comfy_version` gives the ComfyInstall). With COMFY_INPROC = True as well, its
# tests import ComfyUI into this process, which can hold one ComfyUI only: the newest version found runs
# here, every other version's tests run in one pytest child per (module, version) and each item reports its
# twin's outcome from the child's junit XML.


def pytest_generate_tests(metafunc):
    if getattr(metafunc.module, "COMFY_VERSIONED", False) and "comfy_version" in metafunc.fixturenames:
        metafunc.parametrize("comfy_version", comfy_server.version_ids(), indirect=True, scope="module")


@pytest.fixture(scope="module", autouse=True)
def comfy_version(request):
    vid = getattr(request, "param", None)
    if vid is None:
        return None
    inst = comfy_server.install_by_id(vid)
    if inst is None:
        pytest.skip(comfy_server.missing_version_reason(vid))
    return inst


def _delegated(item) -> str | None:
    """The version id of an in-process item that must run in a child, else None."""
    if not getattr(item.module, "COMFY_INPROC", False):
        return None
    cs = getattr(item, "callspec", None)
    vid = cs.params.get("comfy_version") if cs is not None else None
    host = comfy_server.host_install()
    if vid is None or host is None or vid == host.id:
        return None
    return vid


_CHILD: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}


def _child_results(module_path: Path, vid: str) -> dict[str, tuple[str, str]]:
    """{test name: (outcome, message)} of `module_path` run in a pytest child against version `vid`."""
    key = (str(module_path), vid)
    if key in _CHILD:
        return _CHILD[key]
    inst = comfy_server.install_by_id(vid)
    xml = Path(os.environ.get("TMPDIR", "/tmp")) / f"psa_child_{os.getpid()}_{module_path.stem}_{vid}.xml"
    env = dict(os.environ, COMFYUI_PATH=str(inst.path), **{comfy_server.CHILD_ENV: "1"})
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
           f"--junitxml={xml}", str(module_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    results: dict[str, tuple[str, str]] = {}
    try:
        for case in ET.parse(xml).getroot().iter("testcase"):
            outcome, msg = "passed", ""
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome = tag
                    msg = (el.get("message") or "") + "\n" + (el.text or "")
                    break
            results[case.get("name")] = (outcome, msg)
        xml.unlink()
    except (OSError, ET.ParseError):
        pass
    if not results:
        tail = (proc.stdout + proc.stderr)[-4000:]
        results["<child>"] = ("error", f"the pytest child for ComfyUI {vid} reported nothing (rc {proc.returncode}):"
                                       f"\n{tail}")
    _CHILD[key] = results
    return results


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    vid = _delegated(pyfuncitem)
    if vid is None:
        return None
    results = _child_results(Path(pyfuncitem.fspath), vid)
    outcome, msg = results.get(pyfuncitem.name, results.get("<child>", ("error", "not run in the child")))
    if outcome == "passed":
        return True
    if outcome == "skipped":
        pytest.skip(msg.strip().splitlines()[0] if msg.strip() else "skipped in the child")
    pytest.fail(f"on ComfyUI {vid[len('comfy'):]} (pytest child):\n{msg}", pytrace=False)

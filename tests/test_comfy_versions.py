"""Which ComfyUI versions the real-ComfyUI tests run against: each known version is found, is the version
its folder says, and imports with its own UI pins in front of the shared venv; one loud skip line for each
known version that is not there (the other ComfyUI tests then run against the versions that are)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from comfy_server import KNOWN_VERSIONS, comfy_installs, missing_version_reason

pytestmark = pytest.mark.comfy

CHECK = """
import sys
sys.path.insert(0, sys.argv[1])
from importlib.metadata import version
import comfy_api.latest  # noqa: F401
print(version("comfyui-frontend-package"))
"""


@pytest.mark.parametrize("ver", KNOWN_VERSIONS)
def test_known_comfyui_version_is_available_with_its_own_frontend_pin(ver):
    inst = next((i for i in comfy_installs() if i.version == ver), None)
    if inst is None:
        pytest.skip(missing_version_reason(f"comfy{ver}"))
    pins = dict(line.strip().split("==") for line in (inst.path / "requirements.txt").read_text().splitlines()
                if line.startswith("comfyui-frontend-package=="))
    env = dict(os.environ)
    if inst.site is not None:
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(inst.site), env.get("PYTHONPATH")) if x)
    out = subprocess.run([sys.executable, "-c", CHECK, str(inst.path)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-1] == pins["comfyui-frontend-package"]

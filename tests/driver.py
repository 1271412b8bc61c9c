"""Run a test driver script in a subprocess and read the one `RESULTS_JSON {...}` line it prints.

Drivers run apart because their environment must be set before an import (TRITON_INTERPRET before Triton,
CUTE_DSL_ARCH before cutlass) and must not leak into the other test files of the session."""
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_driver(script: str, *args: str, env: dict | None = None, drop_env: tuple = (), timeout: int = 1200) -> dict:
    """The results dict of `python tests/<script> <args>` run from the repository root with os.environ updated by
    `env` and without the variables in `drop_env`; fails with the driver's output when it exits non-zero or
    prints no results line."""
    e = {k: v for k, v in os.environ.items() if k not in drop_env}
    e.update(env or {})
    p = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True, env=e,
                       timeout=timeout, cwd=str(HERE.parent))
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULTS_JSON ")]
    assert p.returncode == 0 and line, f"{script} failed (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return json.loads(line[0][len("RESULTS_JSON "):])

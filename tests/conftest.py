import os
import sys
from pathlib import Path

# the repo root makes `kernels` importable as a top-level package (as users and CI do); tests/ itself
# holds shared test helpers (bruteforce.py, comfy_server.py) that test modules import by name
ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

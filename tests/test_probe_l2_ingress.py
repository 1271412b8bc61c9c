"""bench/probes/l2_ingress.py's kernel on the CPU (Triton interpreter, a subprocess so TRITON_INTERPRET is set before
triton loads): each program's sum equals the sum of the boxes its walk reads, for whole 64-row tiles and for the
16 boxes of 4 rows per tile that PROBE_BOX_ROWS=4 times (bench/gpu_round.sh G31), and for one 4-D box per tile over a
latent-grid view, rows contiguous and two heads apart, that PROBE_BOX_CUBE=1 times (G33)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parents[1] / "bench" / "probes" / "l2_ingress.py"


def test_l2_ingress_smoke_sums_every_box_it_reads():
    env = dict(os.environ, TRITON_INTERPRET="1", PROBE_SMOKE="1")
    r = subprocess.run([sys.executable, str(PROBE)], env=env, capture_output=True, text=True, timeout=300)
    if "has no triton.tools.tensor_descriptor" in r.stderr:
        pytest.skip("this Triton has no tensor descriptors (the probe needs them)")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")][-1]
    res = json.loads(line[len("RESULT "):])
    assert res["smoke"] == "ok" and res["box_rows"] == [64, 4] and res["cube"] == [1, 2]

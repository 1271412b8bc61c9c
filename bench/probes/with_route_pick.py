"""Run a script (bench/pieces.py) with the routing build that bench/probes/route_sweep.py measured fastest at Wan2.1-14B
720p among the builds that differ from the defaults only in speed knobs (the same lists: register caps, offset
tiles), so a round can time every piece with it before the pick is committed. Prints the pick.

    python bench/probes/with_route_pick.py ROUTE_SWEEP_OUTPUT script.py [args...]"""
import json
import runpy
import sys

sys.path.insert(0, ".")
sys.path.insert(0, "bench/probes")
from kernels.triton import route as kr  # noqa: E402
from kernels.triton import select as ks  # noqa: E402

lines = [ln for ln in open(sys.argv[1]) if ln.startswith("RESULT ")]
res = json.loads(lines[-1][7:]) if lines else {}
d = res.get("wan14_720", {})
cands = {"bf16x3": {}, "bf16x3_off64": {"SCORE_OFF64": True}, "bf16x3_sr80": {"SELECT_MAXNREG": 80},
         "bf16x3_sr96": {"SELECT_MAXNREG": 96}, "bf16x3_off64_sr80": {"SCORE_OFF64": True, "SELECT_MAXNREG": 80}}
timed = {n: d[n + "_route_ms"] for n in cands if isinstance(d.get(n + "_route_ms"), (int, float))}
pick = min(timed, key=timed.get) if timed else "bf16x3"
for name, val in cands[pick].items():
    setattr(ks if name.startswith("SELECT") else kr, name, val)
print(f"route pick: {pick} ({timed.get(pick)} ms at 720p; {timed})", flush=True)
sys.argv = sys.argv[2:]
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(sys.argv[0])))  # the script's imports
runpy.run_path(sys.argv[0], run_name="__main__")

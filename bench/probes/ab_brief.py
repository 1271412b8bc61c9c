"""One line per row of bench/probes/vt_peel_kernel.py's output (stdin: its `size backend switch {json}` lines): the
medians with the switch off and on, the rounds it was faster, the output difference, and the drop kernel's
medians where PROBE_DROP timed them. For gpu_round.sh's log lines.

    grep -v RESULT probe.txt | python bench/probes/ab_brief.py
"""
import json
import sys

for line in sys.stdin:
    parts = line.split(" ", 3)
    if len(parts) < 4 or not parts[3].startswith("{"):
        print(line.strip()[:300])
        continue
    d = json.loads(parts[3])
    if "error" in d:
        print(*parts[:3], d["error"])
        continue
    out = [*parts[:3], f"pwt {d.get('op0_median_ms', 0):.3f}->{d.get('op1_median_ms', 0):.3f}",
           f"faster {d.get('op1_faster_rounds')}/{sum(k.startswith('op1_r') for k in d)}",
           f"maxdiff {d.get('maxdiff')}", f"rel_l2 {d.get('rel_l2', 0):.1e}"]
    if "drop_op0_median_ms" in d:
        out += [f"drop {d['drop_op0_median_ms']:.3f}->{d['drop_op1_median_ms']:.3f}",
                f"faster {d['drop_op1_faster_rounds']}", f"drop_maxdiff {d['drop_maxdiff']}"]
    if "novt_median_ms" in d:
        out.append(f"novt {d['novt_median_ms']:.3f}" + (f"->{d['novt1_median_ms']:.3f}" if "novt1_median_ms" in d
                                                         else ""))
    print(" | ".join(out))

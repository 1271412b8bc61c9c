"""SASS helpers for the compile probes (stats_gl_compile.py, cute_sass_loops.py)."""
import re


def loop_report(sass):
    """Instruction counts of the SASS between each backward branch and its target (the loops)."""
    lines = [l for l in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", l)]
    addr = [int(re.match(r"\s+/\*([0-9a-f]+)\*/", l).group(1), 16) for l in lines]
    out = []
    for i, l in enumerate(lines):
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|\S*?)\s*(0x[0-9a-f]+)?", l)
        t = re.search(r"\.L_x_(\d+)", l)
        if "BRA" in l and t:
            lab = f".L_x_{t.group(1)}:"
            j = next((k for k, s in enumerate(sass.splitlines()) if s.strip().startswith(lab)), None)
            if j is None:
                continue
            # the first instruction after the label
            after = [s for s in sass.splitlines()[j:] if re.match(r"\s+/\*[0-9a-f]{4,}\*/", s)]
            if not after:
                continue
            a0 = int(re.match(r"\s+/\*([0-9a-f]+)\*/", after[0]).group(1), 16)
            if a0 < addr[i]:
                body = [s for s, a in zip(lines, addr) if a0 <= a <= addr[i]]
                ops = {}
                for s in body:
                    op = re.sub(r"^\s+/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?", "", s).split()[0].split(".")[0]
                    ops[op] = ops.get(op, 0) + 1
                out.append((len(body), dict(sorted(ops.items(), key=lambda kv: -kv[1])[:14])))
    return out

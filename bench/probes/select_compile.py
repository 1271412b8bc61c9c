"""Compile the routing select kernels for sm_90a without a GPU (ptxas -v: registers, spills; SASS counts).

PYTHONPATH=/tmp/tri36site python bench/probes/select_compile.py [--sass NAME]  (Triton 3.6 as on the H200)
"""
import inspect, os, re, subprocess, sys, tempfile
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGET = GPUTarget("cuda", 90, 32)
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def comp(fn, types, constexprs, warps, stages=1, sass=False):
    params = inspect.signature(fn.fn).parameters
    sig = {p: ("constexpr" if p in constexprs else types.get(p, "i32")) for p in params}
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs), target=TARGET,
                       options={"num_warps": warps, "num_stages": stages})
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    cub = f.name + ".cubin"
    p = subprocess.run([os.path.join(BIN, "ptxas"), "-v", "--gpu-name", "sm_90a", f.name, "-o", cub],
                       capture_output=True, text=True)
    regs = re.findall(r"Used (\d+) registers", p.stderr)
    sp = re.findall(r"(\d+) bytes spill stores", p.stderr)
    stack = re.findall(r"(\d+) bytes stack frame", p.stderr)
    out = dict(regs=regs, spill=sp, stack=stack, shared=k.metadata.shared)
    s = subprocess.run([os.path.join(BIN, "nvdisasm"), "-c", cub], capture_output=True, text=True).stdout
    ins = [l for l in s.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,5}\*/", l)]
    out["sass"] = len(ins)
    out["bar"] = sum("BAR" in l for l in ins)
    out["shfl"] = sum("SHFL" in l for l in ins)
    if sass:
        open(sass, "w").write(s)
        open(sass + ".ttgir", "w").write(k.asm["ttgir"])
    return out

# One H200 round of everything that is pending a GPU, in five device calls to the same warm machine (it goes cold
# ~30 s after a call: start each call right after the previous one returns). Run from the repo root:
#   call A: carry [".carry/cs_a"]                     command: bash bench/gpu_round.sh A
#   call B: carry [".carry/cs_b"]                     command: bash bench/gpu_round.sh B
#   call C: carry [".carry/old"]                      command: bash bench/gpu_round.sh C
#   call D: carry [".carry/old"]                      command: bash bench/gpu_round.sh D
#   call E: carry [".carry/comfy"]                    command: bash bench/gpu_round.sh E
# A stashes the first half of the cutlass-dsl site (bench/install_cute_site.sh) and runs the Triton-only GPU tests;
# B unpacks the site, measures the CuTe bias-row L2 prefetch (bench/probes/bias_l2.py) and runs the CuTe and CUDA-graph
# GPU tests with it on where it measured faster at 720p; C times every piece (bench/pieces.py) at Wan2.1-14B 480p and
# FLUX.1 1024^2 against the kernels in .carry/old (a copy of the previous kernels as the package kernels_old), with
# Morton and FLUX as the node calls them; D the same at 720p and re-measures the break-even table
# (nodes/breakeven_h200.json); E the whole DiT step (bench/dit_step.py, ComfyUI's comfy/ in .carry/comfy).
# Every result lands under $OUT; a step that runs past its timeout is cut and the next one still runs.
set -u
PHASE=${1:?usage: bash bench/gpu_round.sh A|B|C|D|E}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
. bench/install_cute_site.sh
log() { echo "[gpu_round $PHASE $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/round.log"; }
run_tests() {  # name, timeout, pytest args...
    local name=$1 t=$2; shift 2
    log "pytest $name"
    timeout "$t" python -m pytest -q -p no:cacheprovider -m gpu "$@" > "$OUT/tests_$name.log" 2>&1
    log "pytest $name rc=$? $(tail -1 "$OUT/tests_$name.log")"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/round.log" 2>&1
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/round.log" 2>&1
case "$PHASE" in
A)
    run_tests triton 330 tests/test_triton_gpu.py tests/test_api_errors.py
    run_tests backward 200 tests/test_backward_gpu.py
    ;;
B)
    python -c "import cutlass" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable: run A then B back to back"; exit 1; }
    log "bias_l2 probe"
    timeout 240 python bench/probes/bias_l2.py > "$OUT/bias_l2.txt" 2>&1
    # on where it was faster at 720p in both rounds and not slower at 480p (both rounds' means)
    L2=$(python - "$OUT/bias_l2.txt" <<'EOF'
import json, sys
lines = [ln for ln in open(sys.argv[1]) if ln.startswith("RESULT ")]
if not lines:
    print(0); sys.exit()
r = json.loads(lines[0][7:])
def mean(d, on):
    return sum(d[f"pwt_l2{'on' if on else 'off'}_r{i}_ms"] for i in range(2)) / 2
big, small = r["wan14_720"], r["wan14"]
faster = all(big[f"pwt_l2on_r{i}_ms"] < big[f"pwt_l2off_r{i}_ms"] for i in range(2))
print(int(faster and mean(small, True) <= 1.01 * mean(small, False) and big["rel_on_vs_off"] < 1e-6))
EOF
)
    log "bias_l2 decision: PSA_CUTE_BIAS_L2=$L2 ($(tail -1 "$OUT/bias_l2.txt" | cut -c1-400))"
    export PSA_CUTE_BIAS_L2=$L2
    run_tests cute 240 tests/test_cute_gpu.py tests/test_nonfinite.py
    run_tests graphs 120 tests/test_graphs_gpu.py
    ;;
C)
    python -c "import cutlass" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: pieces runs Triton only"
    log "pieces 480p + flux"
    timeout 560 python bench/pieces.py --out "$OUT/pieces_c" --old .carry/old --morton --flux-node \
        --shapes wan14,flux > "$OUT/pieces_c.log" 2>&1
    log "pieces rc=$?"
    ;;
D)
    python -c "import cutlass" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: pieces runs Triton only"
    log "pieces 720p + break-even"
    timeout 560 python bench/pieces.py --out "$OUT/pieces_d" --old .carry/old --morton --breakeven \
        --shapes wan14_720 > "$OUT/pieces_d.log" 2>&1
    log "pieces rc=$?"
    ;;
E)
    log "dit_step"
    timeout 560 python bench/dit_step.py --comfy .carry/comfy --out "$OUT/dit" --repeats 2 > "$OUT/dit.log" 2>&1
    log "dit_step rc=$?"
    ;;
*)
    echo "unknown phase $PHASE"; exit 2 ;;
esac
log "done"

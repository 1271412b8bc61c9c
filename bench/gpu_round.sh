# One H200 round of everything that is pending a GPU, in five device calls to the same warm machine (it goes cold
# ~30 s after a call: start each call right after the previous one returns). Run from the repo root:
#   call A: carry [".carry/cs_a", ".carry/old"]       command: bash bench/gpu_round.sh A
#   call B: carry [".carry/cs_b"]                     command: bash bench/gpu_round.sh B
#   call C: carry [".carry/old"]                      command: bash bench/gpu_round.sh C
#   call D: carry [".carry/old"]                      command: bash bench/gpu_round.sh D
#   call E: carry [".carry/comfy"]                    command: bash bench/gpu_round.sh E
# session 6's round, after A-E: F (carry [".carry/cs_a"]), G (carry [".carry/cs_b"]), E; P (no carry, after A and B):
# Nsight Compute on the CuTe attention, drop vs pwt. Session 7: H (carry [".carry/cs_a"]), I / J (carry
# [".carry/cs_b"]), L (pieces), E. Next: a stash call (carry [".carry/cs_a"], command `. bench/install_cute_site.sh`),
# then M (carry [".carry/cs_b"]: the folded bias rows; run once in session 8 and removed with that option), L (no
# carry needed once the site is unpacked), E. Session 9: N with the one-call site (carry [".carry/cs1"]: the
# cutlass-dsl site in one xz archive with a 256 MiB dictionary, bench/install_cute_site.sh, and ComfyUI's comfy/ .py
# files for E; the two-call stash found a cold machine on its second call twice). Next: R, L, E, each carrying
# [".carry/cs1"] (each call may land on a fresh machine). Session 10: R, then S, L, X back to back (X also carries
# [".carry/pisa_official"], the official PISA file, for the peers). Session 11: O and W, each carrying
# [".carry/cs1"]. Session 12: Y twice (the one-pass statistics, kernels/triton/stats_h.py, against the two passes),
# then Z (every GPU test, then L) and Z2 (the fixes Z found, the backward tests, E), each carrying [".carry/cs1"].
# Session 13: A13, B13, C13 (the routing builds, zero-copy graph outputs), then L and E, each carrying [".carry/cs1"].
# Session 14: A14 (no carry; the statistics loop), then C14 (carry [".carry/cs1"]); a third call got no time.
# Session 15: A15 (carry [".carry/cs1"]: every GPU test on session 14's final commit, the statistics, L), B15 (the
# same carry: three builds behind switches, all slower, removed), C15 (the same carry: break-even table, DiT step), D15 (the node's speed-up curve), E15 (the
# backward GPU tests). Session 16 (no device time) added A16 and B16 (the same carry: the rolled Morton head chunks, the peeled
# virtual loop, the Morton budget on both backends, the backward tests). Session 17: A16, A17 (the peels in the kernels
# alone, where the roll's output moves, the fixed tests, every forward test on the defaults), A17b (the roll's stages,
# the backward tests), P17 (Nsight Compute on the pair kernel), a pieces run, PP (the ping-pong consumers), each
# carrying [".carry/cs1"]; B16 is superseded (the roll stays off; its backward tests ran in A17b; its Triton budget
# question is in A18). Session 18: A18, P18 (per-instruction stall sampling), T18 (the tree reductions), F18 (the pair
# kernel split: no GEMMs / no softmax / neither; two calls were taken back before they finished, so F18 ran with
# F18_END=270 and its Triton tests were cut). Session 19: A19 (carry [".carry/cs1"], rules in its header), then B19
# (pieces on A19's picks, the Triton and backward tests), C15 (break-even table, DiT step), D15 (the node's curve),
# each carrying [".carry/cs1"]. Session 21: A20, A21 (S_AHEAD_VT again, its tests), A22 (after the bias fix, the
# pieces), C21 (D15, C15, E), each carrying [".carry/cs1"]. Session 22: A23 (the exact pipeline's
# depth under S_AHEAD), A24 (the select's interpolation search),
# A25 (exact slots 4 -> 3, PAIR_Q_PERM as the node calls it), A26 and A27 (PAIR_OUT_PERM), A28 (the epilogue's
# stores), A29 and A30 (the TMA-store epilogue). Session 23: A31 (the forward tests on TMA_STORE, TMA_STORE_ONE at
# FLUX.1, the pieces), C23 (TMA_STORE_ONE on: the one-block tests, then C21), A32 (cute vs Triton graphed), A33
# (auto takes cute for graphed calls: its tests, the break-even table), A34 (the new test again; graphs to 20000
# tokens, exploratory), A35 (the break-even table, each cell the median of 3 rounds), A36 (where Morton's cost goes).
# Session 24: A37 (Nsight Compute on the statistics, raster and gathered; PSA_STATS_TMA_COPY's test and A/B: slower,
# off), B37 (PSA_STATS_PERM_DEEP: the gathered statistics' pipeline depth), C37 (its confirmation at 720p, every
# forward GPU test, the pieces), D37 (the pieces, the node's curve, the break-even table, the DiT step), E37 (the pair
# kernel below 512 KV blocks), F37 (the forward tests on PAIR_MIN_BLOCKS = 72, FLUX.1's A/B). Next: G38 (the clocks
# inside and outside a DiT-like loop).
# A stashes the first half of the cutlass-dsl site (bench/install_cute_site.sh), runs the Triton-only GPU tests and
# times the Triton Morton path against the previous kernels (bench/probes/triton_morton.py);
# B unpacks the site, measures the CuTe virtual-tile bias loads (bench/probes/bias_l2.py: L2 prefetch, loads one
# softmax earlier, both) and the kernel's own output permutation on the Morton path (bench/probes/cute_out_perm.py),
# then runs the CuTe and CUDA-graph GPU tests with what measured faster (C and D then run with it too); C times every
# piece (bench/pieces.py) at Wan2.1-14B 480p and FLUX.1 1024^2 against the kernels in .carry/old (a copy of the
# previous kernels as the package kernels_old), with Morton and FLUX as the node calls them and the knob sweeps
# (bench/pieces_sweep.py: the statistics kernel at 1-2 warps among them); D the same at 720p and
# re-measures the break-even table (nodes/breakeven_h200.json); E the whole DiT step (bench/dit_step.py, ComfyUI's
# comfy/ in .carry/comfy).
# Tests run in 4 pytest-xdist workers (PSA_XDIST; the image has pytest-xdist): they are bound by compiles.
# Every result lands under $OUT; a step that runs past its timeout is cut and the next one still runs.
set -u
PHASE=${1:?usage: bash bench/gpu_round.sh PHASE (A-T, see above)}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
pack_out() {  # on exit of the outer call: the device returns at most 8 files, none more than 2 folders down ($OUT/a/b/
    # file); past that (C21 lost D15's JSON files), everything but round.log goes into one archive, out.tar.xz
    local rc=$? n deep
    n=$(find "$OUT" -type f | wc -l)
    deep=$(find "$OUT" -mindepth 4 -type f | head -1)
    if [ "$n" -gt 8 ] || [ -n "$deep" ]; then
        (cd "$OUT" && find . -type f ! -name round.log ! -name out.tar.xz -print0 | tar --null -T - -cJf out.tar.xz \
            && find . -type f ! -name round.log ! -name out.tar.xz -delete && find . -mindepth 1 -type d -empty -delete)
        echo "[gpu_round] $n files under \$OUT: all but round.log packed into out.tar.xz" >> "$OUT/round.log"
    fi
    exit $rc
}
if [ -z "${GPU_ROUND_NESTED:-}" ]; then export GPU_ROUND_NESTED=1; trap pack_out EXIT; fi
. bench/install_cute_site.sh
[ -f "$STASH/bias_env" ] && . "$STASH/bias_env"  # B's pick of the CuTe bias-load build
[ -f "$STASH/hsum_env" ] && . "$STASH/hsum_env"  # F's pick of the H-sum setting
[ -f "$STASH/pair_env" ] && . "$STASH/pair_env"  # I's pick of the CuTe pair build
log() { echo "[gpu_round $PHASE $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/round.log"; }
share_smoke() {  # the shared pipeline's crafted-list tests alone, stopping at the first failure; a pipeline that
    # hangs is cut at 120 s. Sets SMOKE (0: passed)
    log "pytest share smoke"
    timeout -k 10 120 python -m pytest -q -x -p no:cacheprovider -m gpu tests/test_cute_pair_gpu.py -k "crafted" \
        > "$OUT/tests_share_smoke.log" 2>&1
    SMOKE=$?
    log "pytest share smoke rc=$SMOKE $(tail -1 "$OUT/tests_share_smoke.log")"
}
share_pick() {  # the shared exact pipeline's rule on a cute_pair.py --share output: faster than the own-list
    # pipelines in both rounds on both DiT-like shapes, not slower than 1% on the random ones (means of the two
    # rounds), and the same output (the same tiles in the same order); prints 1 or 0
    python - "$1" <<'PYEOF'
import json, sys
lines = [ln for ln in open(sys.argv[1]) if ln.startswith("RESULT ")]
r = json.loads(lines[0][7:]) if lines else {}
mean = lambda d, b: sum(d.get(f"pwt_{b}_r{i}_ms", 1e9) for i in range(2)) / 2  # noqa: E731
dit = [d for s, d in r.items() if "ditlike" in s]
rnd = [d for s, d in r.items() if "ditlike" not in s]
ok = (len(dit) == 2 and len(rnd) == 2
      and all(d.get(f"pwt_p3share_r{i}_ms", 1e9) < d.get(f"pwt_p3_r{i}_ms", 0) for d in dit for i in range(2))
      and all(mean(d, "p3share") <= 1.01 * mean(d, "p3") for d in rnd)
      and all(d.get("p3share_maxdiff_vs_p3", 1) == 0.0 for d in r.values()))
print(int(ok))
PYEOF
}
run_tests() {  # name, timeout, pytest args...
    local name=$1 t=$2; shift 2
    log "pytest $name"
    timeout "$t" python -m pytest -q -p no:cacheprovider -n "${PSA_XDIST:-4}" -m gpu "$@" > "$OUT/tests_$name.log" 2>&1
    log "pytest $name rc=$? $(tail -1 "$OUT/tests_$name.log")"
}
savt_round() {  # A21 / A22 (session 21): S_AHEAD_VT against the default in the kernels alone (7 rounds), then every
    # forward GPU test with it on, the tests cut at END seconds into the call
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    log "S_AHEAD_VT vs the default, 7 rounds"
    PROBE_ROUNDS=7 timeout -k 10 170 python bench/probes/vt_peel_kernel.py PSA_CUTE_S_AHEAD_VT > "$OUT/savt_kernel.txt" 2>&1
    log "savt rc=$? $(grep -v RESULT "$OUT/savt_kernel.txt" | python bench/probes/ab_brief.py 2>&1 | cut -c1-1500)"
    PSA_CUTE_S_AHEAD_VT=1 run_tests fwd_savt $(($1 - SECONDS)) \
        tests/test_cute_pair_gpu.py tests/test_cute_gpu.py tests/test_nonfinite.py tests/test_graphs_gpu.py
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/round.log" 2>&1
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/round.log" 2>&1
case "$PHASE" in
B39)  # next session's first call (carry .carry/cs1; ~9 min). Session 26: A39 found the Gluon statistics (raster kernel)
    # faster in every round at every shape (480p raster 0.354 -> 0.273 ms, 720p 0.792 -> 0.592, FLUX.1 0.038 -> 0.038)
    # and 20 of its 21 tests passing (the 21st on its own sigma^2 tolerance, since widened); its first B39 call was
    # lost (the machine stopped answering) and no machine was lent after. Since then: the Morton gather kernel
    # (_stats_gl_gather_kernel, never run on a GPU) and redo_flagged. PSA_STATS_GLUON is off by default. (1) every
    # stats_gl test (raster, node, gather, non-finite), no -x; (2) the statistics A/B (op1 = Gluon) at 480p, 720p,
    # FLUX.1 in all four layouts. Prediction for the gather: the q / k / v copy call 0.598 -> 0.50-0.53 ms at 480p
    # (its bound, 2 GB at the copy rate, 0.47), 1.340 -> 1.10-1.18 at 720p; (3) every forward GPU test with
    # PSA_STATS_GLUON=1 (the statistics feed every path). Rule set now: on by default where its tests and the forward
    # suite pass and C39 finds the node's call no slower
    log "pytest stats_gl"
    timeout -k 10 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_stats_gl_gpu.py \
        > "$OUT/tests_stats_gl.log" 2>&1
    log "pytest stats_gl rc=$? $(tail -3 "$OUT/tests_stats_gl.log" | tr '\n' ' ' | cut -c1-600)"
    grep -B5 -A30 "^E  " "$OUT/tests_stats_gl.log" | head -60 >> "$OUT/round.log"
    PROBE_SWITCH=PSA_STATS_GLUON PROBE_ROUNDS=3 timeout -k 10 150 python bench/probes/stats_h.py \
        --shapes wan14,wan14_720,flux --no-sweep > "$OUT/stats_gl_ab.txt" 2>&1
    log "stats_gl A/B rc=$? $(grep -v RESULT "$OUT/stats_gl_ab.txt" | grep -o "^[a-z0-9_]* [a-z_]* {[^}]*}" | cut -c1-2500)"
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable"
    PSA_STATS_GLUON=1 run_tests fwd $((560 - SECONDS)) tests/test_triton_gpu.py tests/test_cute_gpu.py \
        tests/test_cute_pair_gpu.py tests/test_nonfinite.py tests/test_graphs_gpu.py tests/test_api_errors.py
    grep -B3 -A25 "^E  " "$OUT/tests_fwd.log" | head -80 >> "$OUT/round.log"
    ;;
C39)  # after B39 (carry .carry/cs1; ~8 min): the node's call with the Gluon statistics against without
    # (switch_ab.py PSA_STATS_GLUON, Morton as the node calls it, 480p / 720p / FLUX.1, 5 rounds), then the pieces
    # with PSA_STATS_GLUON=1 (L). Rule (B39's): on by default if no shape's median is slower
    PROBE_ROUNDS=5 timeout -k 10 200 python bench/probes/switch_ab.py PSA_STATS_GLUON > "$OUT/switch_stats_gl.txt" 2>&1
    log "switch_ab rc=$? $(grep -v RESULT "$OUT/switch_stats_gl.txt" | cut -c1-2500)"
    PSA_STATS_GLUON=1 PIECES_TIMEOUT=$((560 - SECONDS)) bash bench/gpu_round.sh L
    ;;
E39)  # (carry .carry/cs1; ~7 min) the two virtual-loop builds made on the CPU, both off, both untimed: PSA_CUTE_BIAS_SLACK
    # (fwd_pair.py bias_slack, session 26: the virtual tiles' bias loads without the per-column clamp, where route()'s
    # bias has 64 elements of storage past its end; the shipped S_AHEAD_VT virtual loop 546 -> 513 SASS instructions per
    # tile, bitwise the same output) and PSA_CUTE_VT_FULL (session 27: that loop's whole-block tiles with log2(64) in
    # the bias, no count multiplies and no second sum; 546 -> 485, both together 452; 168 registers, no spills; not
    # bitwise: within half an ulp's rel L2). At the power cap a kernel's time follows its joules (session 25), and a
    # virtual tile issues about twice an exact tile's instructions. (1) their GPU tests; (2) the kernel alone
    # (vt_peel_kernel.py, one routing, 7 alternated rounds, with the build without virtual tiles): each switch on the
    # defaults, then VT_FULL on top of BIAS_SLACK. Predictions: the virtual part (pwt - novt) 4-6% faster with the
    # slack (0.86 -> ~0.82 ms at 480p, 4.1 -> ~3.95 at 720p), 6-10% with VT_FULL (-> ~0.79 / ~3.9), ~12% with both
    # (-> ~0.76 / ~3.7); the exact part unchanged. Rule set now, per switch: on if its tests pass and pwt is faster in
    # >= 6 of 7 rounds at both sizes (BIAS_SLACK: outputs bitwise equal; VT_FULL: its run on top of the slack decides
    # it where the slack goes on)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    timeout -k 10 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_cute_pair_gpu.py \
        -k "bias_loads_unclamped or vt_full or tma_store" > "$OUT/tests_vt_builds.log" 2>&1
    log "pytest bias_slack / vt_full rc=$? $(tail -1 "$OUT/tests_vt_builds.log")"
    grep -B3 -A25 "^E  " "$OUT/tests_vt_builds.log" | head -60 >> "$OUT/round.log"
    PROBE_ROUNDS=7 PROBE_NOVT1=1 timeout -k 10 200 python bench/probes/vt_peel_kernel.py PSA_CUTE_BIAS_SLACK \
        PSA_CUTE_VT_FULL > "$OUT/vt_builds_kernel.txt" 2>&1
    log "vt builds rc=$? $(grep -v RESULT "$OUT/vt_builds_kernel.txt" | python bench/probes/ab_brief.py 2>&1 | cut -c1-1500)"
    PROBE_ROUNDS=7 PROBE_NOVT1=1 PROBE_BASE="PSA_CUTE_BIAS_SLACK=1" timeout -k 10 150 python \
        bench/probes/vt_peel_kernel.py PSA_CUTE_VT_FULL > "$OUT/vt_full_on_slack_kernel.txt" 2>&1
    log "vt_full on slack rc=$? $(grep -v RESULT "$OUT/vt_full_on_slack_kernel.txt" | python bench/probes/ab_brief.py 2>&1 | cut -c1-1500)"
    ;;
D39)  # after C39 (carry .carry/cs1; ~8 min): the backward GPU tests with PSA_STATS_GLUON=1 (training reads the same
    # statistics; 2 workers, as that file needs), then the DiT step (E) with it
    PSA_STATS_GLUON=1 PSA_XDIST=2 run_tests bwd_gluon 330 tests/test_backward_gpu.py
    grep -B3 -A25 "^E  " "$OUT/tests_bwd_gluon.log" | head -60 >> "$OUT/round.log"
    PSA_STATS_GLUON=1 DIT_TIMEOUT=$((570 - SECONDS)) bash bench/gpu_round.sh E
    ;;
A39)  # session 26's first call (carry .carry/cs1; ~7 min): the Gluon statistics kernel (kernels/triton/stats_gl.py,
    # PSA_STATS_GLUON=1; built on the CPU this session: TMA loads by a loader warp into a 4-deep ring, column sums in
    # float32 inside each warp, K^T V on wgmma, persistent over (head, partial) items; sm_90a 168 registers, no
    # spills, 632 SASS instructions per block in its consumer loop against stats_h's 731 and no mma.sync), never run
    # on a GPU before. (1) its GPU tests, stopping at the first failure (a hang is a barrier bug: cut at 240 s);
    # (2) if they pass, bench/probes/stats_h.py with PROBE_SWITCH=PSA_STATS_GLUON (op0 = stats_h, op1 = Gluon; raster,
    # node layout; the gathered layouts run stats_h both ways), 3 alternated rounds, 480p, 720p, FLUX.1.
    # Prediction: raster 480p 0.354 -> 0.27-0.29 ms (85-90% of the one-read bound at the copy rate), 720p 0.826 ->
    # 0.62-0.66, FLUX.1 about even (five items per head, the ring's fill not hidden). Rule set now: PSA_STATS_GLUON
    # becomes the default on SM90 if the tests pass and it is faster at 480p and 720p in every round
    log "pytest stats_gl"
    timeout -k 10 240 python -m pytest -q -x -p no:cacheprovider -m gpu tests/test_stats_gl_gpu.py \
        > "$OUT/tests_stats_gl.log" 2>&1
    RC=$?
    log "pytest stats_gl rc=$RC $(tail -3 "$OUT/tests_stats_gl.log" | tr '\n' ' ' | cut -c1-600)"
    [ "$RC" = 0 ] || grep -B5 -A40 "Error\|FAILED\|assert" "$OUT/tests_stats_gl.log" | head -80 >> "$OUT/round.log"
    PROBE_SWITCH=PSA_STATS_GLUON PROBE_ROUNDS=3 timeout -k 10 200 python bench/probes/stats_h.py \
        --shapes wan14,wan14_720,flux --no-sweep > "$OUT/stats_gl_ab.txt" 2>&1
    log "stats_gl A/B rc=$? $(grep -v RESULT "$OUT/stats_gl_ab.txt" | cut -c1-3000)"
    ;;
A)
    run_tests triton 300 tests/test_triton_gpu.py tests/test_api_errors.py tests/test_backward_gpu.py
    log "triton_morton probe"
    timeout 120 python bench/probes/triton_morton.py .carry/old > "$OUT/triton_morton.txt" 2>&1
    log "triton_morton $(tail -1 "$OUT/triton_morton.txt" | cut -c1-600)"
    ;;
B)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable: run A then B back to back"; exit 1; }
    log "bias_l2 probe"
    timeout 240 python bench/probes/bias_l2.py > "$OUT/bias_l2.txt" 2>&1
    # the build (off, l2, pf, l2pf) fastest at 720p over both rounds, if faster than off in each round there, not
    # slower than off at 480p (both rounds' means, 1% slack) and with the same output
    PICK=$(python - "$OUT/bias_l2.txt" <<'EOF'
import json, sys
lines = [ln for ln in open(sys.argv[1]) if ln.startswith("RESULT ")]
if not lines:
    print("0 0"); sys.exit()
r = json.loads(lines[0][7:])
big, small = r["wan14_720"], r["wan14"]
mean = lambda d, b: sum(d[f"pwt_{b}_r{i}_ms"] for i in range(2)) / 2  # noqa: E731
ok = [b for b in ("l2", "pf", "l2pf")
      if all(big[f"pwt_{b}_r{i}_ms"] < big[f"pwt_off_r{i}_ms"] for i in range(2))
      and mean(small, b) <= 1.01 * mean(small, "off") and big[f"{b}_maxdiff_vs_off"] == 0.0
      and small[f"{b}_maxdiff_vs_off"] == 0.0]
best = min(ok, key=lambda b: mean(big, b)) if ok else "off"
print(int(best in ("l2", "l2pf")), int(best in ("pf", "l2pf")))
EOF
)
    read -r L2 PF <<< "$PICK"
    log "bias decision: PSA_CUTE_BIAS_L2=$L2 PSA_CUTE_BIAS_PF=$PF ($(tail -1 "$OUT/bias_l2.txt" | cut -c1-600))"
    export PSA_CUTE_BIAS_L2=$L2 PSA_CUTE_BIAS_PF=$PF
    log "cute_out_perm probe"
    timeout 200 python bench/probes/cute_out_perm.py > "$OUT/cute_out_perm.txt" 2>&1
    # the kernel's own output permutation where it was faster in each round at both sizes, with the same output
    OP=$(python - "$OUT/cute_out_perm.txt" <<'EOF'
import json, sys
lines = [ln for ln in open(sys.argv[1]) if ln.startswith("RESULT ")]
if not lines:
    print(0); sys.exit()
r = json.loads(lines[0][7:])
print(int(all(d["maxdiff"] == 0.0 and all(d[f"op1_r{i}_ms"] < d[f"op0_r{i}_ms"] for i in range(2))
              for d in r.values() if isinstance(d, dict))))
EOF
)
    log "out_perm decision: PSA_CUTE_OUT_PERM=$OP ($(tail -1 "$OUT/cute_out_perm.txt" | cut -c1-600))"
    export PSA_CUTE_OUT_PERM=$OP
    echo "export PSA_CUTE_BIAS_L2=$L2 PSA_CUTE_BIAS_PF=$PF PSA_CUTE_OUT_PERM=$OP" > "$STASH/bias_env"
    log "cute Morton copies: one chunk (0) against the head chunks (1)"
    timeout 200 python bench/probes/cute_out_perm.py PSA_MORTON_SCRATCH 0 1 > "$OUT/cute_morton_chunks.txt" 2>&1
    log "cute_morton_chunks $(tail -1 "$OUT/cute_morton_chunks.txt" | cut -c1-600)"
    run_tests cute 240 tests/test_cute_gpu.py tests/test_nonfinite.py tests/test_graphs_gpu.py
    ;;
C)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: pieces runs Triton only"
    log "pieces 480p + flux"
    timeout 560 python bench/pieces.py --out "$OUT/pieces_c" --old .carry/old --morton --flux-node --sweep \
        --shapes wan14,flux > "$OUT/pieces_c.log" 2>&1
    log "pieces rc=$?"
    ;;
D)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: pieces runs Triton only"
    log "pieces 720p + break-even"
    timeout 560 python bench/pieces.py --out "$OUT/pieces_d" --old .carry/old --morton --breakeven \
        --shapes wan14_720 > "$OUT/pieces_d.log" 2>&1
    log "pieces rc=$?"
    ;;
E)
    COMFY=.carry/comfy
    if [ -f .carry/cs1/comfy_py.tar.xz ]; then  # comfy/'s .py files (0.4 MB) beside the site in one carry
        mkdir -p /tmp/comfy_py && tar xf .carry/cs1/comfy_py.tar.xz -C /tmp/comfy_py && COMFY=/tmp/comfy_py
    fi
    log "dit_step ($COMFY)"
    timeout ${DIT_TIMEOUT:-560} python bench/dit_step.py --comfy "$COMFY" --out "$OUT/dit" --repeats 2 --profile > "$OUT/dit.log" 2>&1
    log "dit_step rc=$?"
    ;;
F)  # session 6, first call (carry .carry/cs_a): the statistics / H-sum / routing sweeps at all three sizes, Triton
    log "pieces sweep (triton)"
    timeout 400 python bench/pieces.py --out "$OUT/pieces_f" --backends triton --sweep \
        --shapes wan14,wan14_720,flux > "$OUT/pieces_f.log" 2>&1
    log "pieces rc=$?"
    # the H-sum setting with the least kernel time summed over 480p and 720p, if under the default's by 2% at both
    # and H-bar within 1e-5 (G and E then run with it)
    HS=$(python - "$OUT/pieces_f/pieces.json" <<'EOF'
import json, sys
sys.path.insert(0, "bench")
from pieces_sweep import HSUM_VARIANTS
try:
    r = json.load(open(sys.argv[1]))["shapes"]
    sw = [r[s]["sweep"] for s in ("wan14", "wan14_720")]
except Exception:
    print(""); sys.exit()
ok = lambda d, n: isinstance(d.get(f"hsum_{n}_ms"), float) and d.get(f"hsum_{n}_hbar_rel", 1) < 1e-5  # noqa: E731
names = [n for n in HSUM_VARIANTS if n != "default" and "HSUM_WARPS" not in HSUM_VARIANTS[n]
         and all(ok(d, n) and ok(d, "default") and d[f"hsum_{n}_ms"] < 0.98 * d["hsum_default_ms"] for d in sw)]
best = min(names, key=lambda n: sum(d[f"hsum_{n}_ms"] for d in sw)) if names else None
kv = HSUM_VARIANTS.get(best, {})
print(" ".join(f"PSA_{k}={v}" for k, v in kv.items()))
EOF
)
    log "hsum decision: ${HS:-default}"
    echo "${HS:+export $HS}" > "$STASH/hsum_env"
    [ -n "$HS" ] && export $HS
    run_tests triton 200 tests/test_triton_gpu.py tests/test_graphs_gpu.py
    ;;
G)  # second call (carry .carry/cs_b): every piece with the new defaults, both backends, Morton, FLUX as the node
    # calls it, the break-even table
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: pieces runs Triton only"
    log "pieces (new defaults)"
    timeout 500 python bench/pieces.py --out "$OUT/pieces_g" --morton --flux-node --breakeven \
        --shapes wan14,wan14_720,flux > "$OUT/pieces_g.log" 2>&1
    log "pieces rc=$?"
    ;;
P)  # after A and B (the cutlass-dsl site unpacked): Nsight Compute on the CuTe attention kernel, drop and pwt at
    # 480p (bench/probes/virtual_ncu.py), for where the virtual tiles' time goes
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable: run A, B, then P"; exit 1; }
    for var in drop pwt; do
        log "ncu $var"
        timeout 280 ncu --kernel-name regex:cutlass --launch-skip 1 --launch-count 1 --section WarpStateStats \
            --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
            --section LaunchStats --section Occupancy --csv python bench/probes/virtual_ncu.py $var \
            > "$OUT/ncu_$var.csv" 2> "$OUT/ncu_$var.err"
        log "ncu $var rc=$? $(wc -l < "$OUT/ncu_$var.csv") lines"
    done
    ;;
H)  # session 7, first call (carry .carry/cs_a): stash the first half of the site, the Triton and graph GPU tests
    run_tests triton 240 tests/test_triton_gpu.py tests/test_api_errors.py tests/test_graphs_gpu.py
    ;;
I)  # second call (carry .carry/cs_b): the pair kernel (kernels/cute/fwd_pair.py) against the one-block kernel, its
    # tests, then every CuTe test with the faster build; the CuTe Morton copies in one chunk vs head chunks
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable: run H then I"; exit 1; }
    run_tests pair 200 tests/test_cute_pair_gpu.py
    log "cute_pair probe"
    timeout 240 python bench/probes/cute_pair.py > "$OUT/cute_pair.txt" 2>&1
    # the pair build (p4, p3, p2, p3e3) fastest summed over both rounds at both sizes, if faster than the one-block
    # kernel in every round at both sizes and within 1e-2 of its output (bf16 rounding of the same operations)
    PICK=$(python - "$OUT/cute_pair.txt" <<'PYEOF'
import json, sys
lines = [ln for ln in open(sys.argv[1]) if ln.startswith("RESULT ")]
if not lines:
    print("0 4 4"); sys.exit()
r = json.loads(lines[0][7:])
cfg = {"p4": (4, 4), "p3": (4, 3), "p2": (4, 2), "p3e3": (3, 4)}
ok = [b for b in cfg
      if all(isinstance(d.get(f"pwt_{b}_r{i}_ms"), float) and d[f"pwt_{b}_r{i}_ms"] < d[f"pwt_one_r{i}_ms"]
             and d.get(f"{b}_maxdiff_vs_one", 1) <= 1e-2 for d in r.values() for i in range(2))]
best = min(ok, key=lambda b: sum(d[f"pwt_{b}_r{i}_ms"] for d in r.values() for i in range(2))) if ok else None
print(*((1,) + cfg[best] if best else (0, 4, 4)))
PYEOF
)
    read -r PAIR KVS VTS <<< "$PICK"
    if grep -qE "failed|error" "$OUT/tests_pair.log" || ! grep -q "passed" "$OUT/tests_pair.log"; then
        log "pair tests not all green: the one-block kernel stays"; PAIR=0
    fi
    log "pair decision: PSA_CUTE_PAIR=$PAIR PSA_CUTE_STAGES=$KVS PSA_CUTE_VT_STAGES=$VTS ($(tail -1 "$OUT/cute_pair.txt" | cut -c1-900))"
    export PSA_CUTE_PAIR=$PAIR PSA_CUTE_VT_STAGES=$VTS
    KV_ENV=""
    [ "$PAIR" = 1 ] && KV_ENV=" PSA_CUTE_STAGES=$KVS" && export PSA_CUTE_STAGES=$KVS
    echo "export PSA_CUTE_PAIR=$PAIR PSA_CUTE_VT_STAGES=$VTS$KV_ENV" > "$STASH/pair_env"
    run_tests cute 240 tests/test_cute_gpu.py tests/test_nonfinite.py tests/test_graphs_gpu.py
    log "cute Morton copies: one chunk (0) against the head chunks (1)"
    timeout 150 python bench/probes/cute_out_perm.py PSA_MORTON_SCRATCH 0 1 > "$OUT/cute_morton_chunks.txt" 2>&1
    log "cute_morton_chunks $(tail -1 "$OUT/cute_morton_chunks.txt" | cut -c1-600)"
    ;;
J)  # session 7, after a call that stashed .carry/cs_a (carry .carry/cs_b): the persistent pair kernel's tests, the
    # build comparison and the virtual-work split
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    run_tests pair 240 tests/test_cute_pair_gpu.py
    log "cute_pair probe"
    timeout 200 python bench/probes/cute_pair.py > "$OUT/cute_pair.txt" 2>&1
    log "cute_pair $(tail -1 "$OUT/cute_pair.txt" | cut -c1-300)"
    timeout 200 python bench/probes/cute_pair.py --split > "$OUT/cute_pair_split.txt" 2>&1
    log "cute_pair --split rc=$?"
    ;;
N)  # session 8, after a stash call (carry .carry/cs_b): the pair kernel with one exact pipeline over the union of
    # both lists (PSA_CUTE_PAIR_SHARE) - its tests, the probe on random and DiT-like inputs, the pick L and E then
    # run with, and every CuTe GPU test with that pick
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    share_smoke
    # the Triton GPU tests (the token-major output among them) while the pair kernel's picks are pending
    run_tests triton 150 tests/test_triton_gpu.py tests/test_api_errors.py
    if [ "$SMOKE" != 0 ]; then
        log "shared exact pipeline failed its smoke test: PSA_CUTE_PAIR_SHARE=0, the other tests only"
        echo "export PSA_CUTE_PAIR_SHARE=0" > "$STASH/pair_env"
        run_tests pair 240 tests/test_cute_pair_gpu.py -k "not share and not crafted"
        run_tests cute 240 tests/test_cute_gpu.py tests/test_nonfinite.py tests/test_graphs_gpu.py
        log "done"; exit 0
    fi
    run_tests pair 200 tests/test_cute_pair_gpu.py
    log "cute_pair --share"
    timeout -k 10 ${SHARE_PROBE_TIMEOUT:-240} python bench/probes/cute_pair.py --share > "$OUT/cute_pair_share.txt" 2>&1
    SHARE=$(share_pick "$OUT/cute_pair_share.txt")
    if grep -qE "failed|error" "$OUT/tests_pair.log" || ! grep -q "passed" "$OUT/tests_pair.log"; then SHARE=0; fi
    log "decision: PSA_CUTE_PAIR_SHARE=${SHARE:-0} ($(tail -1 "$OUT/cute_pair_share.txt" | cut -c1-2500))"
    export PSA_CUTE_PAIR_SHARE=${SHARE:-0}
    # the query rows through the permutation (PSA_CUTE_Q_PERM: no q copy, no scatter; the one-block kernel, so
    # only below the pair kernel's 512 blocks) against the default Morton path, as the node calls it, at FLUX.1
    # (480p / 720p, where the pair kernel runs, come out unchanged: a check): on if faster there in both rounds
    # with the same output
    log "cute_out_perm PSA_CUTE_Q_PERM"
    timeout -k 10 100 python bench/probes/cute_out_perm.py PSA_CUTE_Q_PERM 0 1 --flux-only > "$OUT/cute_q_perm.txt" 2>&1
    QP=$(python - "$OUT/cute_q_perm.txt" <<'PYEOF'
import json, sys
lines = [ln for ln in open(sys.argv[1]) if ln.startswith("RESULT ")]
r = json.loads(lines[0][7:]) if lines else {}
x = r.get("flux", {})
print(int(x.get("maxdiff", 1) <= 1e-3 and all(x.get(f"op1_r{i}_ms", 1e9) < x.get(f"op0_r{i}_ms", 0) for i in range(2))))
PYEOF
)
    log "decision: PSA_CUTE_Q_PERM=${QP:-0} ($(tail -1 "$OUT/cute_q_perm.txt" | cut -c1-1500))"
    echo "export PSA_CUTE_PAIR_SHARE=${SHARE:-0} PSA_CUTE_Q_PERM=${QP:-0}" > "$STASH/pair_env"
    export PSA_CUTE_Q_PERM=${QP:-0}
    # the CuTe tests in what is left of a 600 s call (else in the next call: bash bench/gpu_round.sh T)
    LEFT=$((570 - SECONDS))
    if [ "$LEFT" -gt 90 ]; then
        run_tests cute "$LEFT" tests/test_cute_gpu.py tests/test_nonfinite.py tests/test_graphs_gpu.py
    else
        log "no time left for the CuTe tests in this call: run phase T next"
    fi
    ;;
R)  # session 10 (carry .carry/cs1): the shared exact pipeline with its lists in shared memory and the pair kernel
    # reading the query rows through the Morton permutation (PSA_CUTE_PAIR_Q_PERM): tests, probes, picks
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    share_smoke
    run_tests pair 200 tests/test_cute_pair_gpu.py
    PAIR_OK=1
    if grep -qE "failed|error" "$OUT/tests_pair.log" || ! grep -q "passed" "$OUT/tests_pair.log"; then PAIR_OK=0; fi
    SHARE=0
    if [ "$SMOKE" = 0 ]; then
        log "cute_pair --share"
        timeout -k 10 ${SHARE_PROBE_TIMEOUT:-240} python bench/probes/cute_pair.py --share > "$OUT/cute_pair_share.txt" 2>&1
        SHARE=$(share_pick "$OUT/cute_pair_share.txt")
        [ "$PAIR_OK" = 1 ] || SHARE=0
        log "decision: PSA_CUTE_PAIR_SHARE=${SHARE:-0} ($(tail -1 "$OUT/cute_pair_share.txt" | cut -c1-2500))"
    fi
    export PSA_CUTE_PAIR_SHARE=${SHARE:-0}
    # the pair kernel reading q through the permutation against the block-order copies, as the node calls it at
    # 480p and 720p: on if not slower (1%, means of both rounds) at both, with the same output (it always saves one
    # copy of q in the peak: op*_peak_extra_x_q)
    log "cute_out_perm PSA_CUTE_PAIR_Q_PERM"
    timeout -k 10 200 python bench/probes/cute_out_perm.py PSA_CUTE_PAIR_Q_PERM 0 1 > "$OUT/cute_pair_q_perm.txt" 2>&1
    PQ=$(python - "$OUT/cute_pair_q_perm.txt" <<'PYEOF'
import json, sys
lines = [ln for ln in open(sys.argv[1]) if ln.startswith("RESULT ")]
r = json.loads(lines[0][7:]) if lines else {}
mean = lambda x, o: sum(x.get(f"op{o}_r{i}_ms", 1e9) for i in range(2)) / 2  # noqa: E731
xs = [r.get(s, {}) for s in ("wan14", "wan14_720")]
print(int(all(x.get("maxdiff", 1) <= 1e-3 and mean(x, 1) <= 1.01 * mean(x, 0) for x in xs)))
PYEOF
)
    [ "$PAIR_OK" = 1 ] || PQ=0
    log "decision: PSA_CUTE_PAIR_Q_PERM=${PQ:-0} ($(tail -1 "$OUT/cute_pair_q_perm.txt" | cut -c1-1500))"
    echo "export PSA_CUTE_PAIR_SHARE=${SHARE:-0} PSA_CUTE_PAIR_Q_PERM=${PQ:-0}" > "$STASH/pair_env"
    export PSA_CUTE_PAIR_Q_PERM=${PQ:-0}
    LEFT=$((570 - SECONDS))
    if [ "$LEFT" -gt 90 ]; then
        run_tests cute "$LEFT" tests/test_cute_gpu.py tests/test_nonfinite.py tests/test_graphs_gpu.py
    fi
    ;;
S)  # session 10, first call (carry .carry/cs1): the pair tests (R's one failure was the test reading the process's
    # compile cache: fixed), then the pair kernel reading q through the permutation re-timed over PROBE_ROUNDS (4)
    # rounds, since R's two split (480p: one round equal, one 8% slower; 720p faster in both), picked on the medians:
    # on if not slower than 1% at 480p and 720p with the same output; then the CuTe tests with that pick
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    run_tests pair 200 tests/test_cute_pair_gpu.py
    PAIR_OK=1
    if grep -qE "failed|error" "$OUT/tests_pair.log" || ! grep -q "passed" "$OUT/tests_pair.log"; then PAIR_OK=0; fi
    log "cute_out_perm PSA_CUTE_PAIR_Q_PERM, ${PROBE_ROUNDS:=4} rounds"
    PROBE_ROUNDS=$PROBE_ROUNDS timeout -k 10 240 python bench/probes/cute_out_perm.py PSA_CUTE_PAIR_Q_PERM 0 1 \
        > "$OUT/cute_pair_q_perm.txt" 2>&1
    PQ=$(python - "$OUT/cute_pair_q_perm.txt" <<'PYEOF'
import json, statistics, sys
lines = [ln for ln in open(sys.argv[1]) if ln.startswith("RESULT ")]
r = json.loads(lines[0][7:]) if lines else {}
med = lambda x, o: statistics.median(v for k, v in x.items() if k.startswith(f"op{o}_r") and k.endswith("_ms"))  # noqa
xs = [r.get(s, {}) for s in ("wan14", "wan14_720")]
print(int(all(x.get("maxdiff", 1) <= 1e-3 and med(x, 1) <= 1.01 * med(x, 0) for x in xs)))
PYEOF
)
    [ "$PAIR_OK" = 1 ] || PQ=0
    log "decision: PSA_CUTE_PAIR_Q_PERM=${PQ:-0} ($(tail -1 "$OUT/cute_pair_q_perm.txt" | cut -c1-1500))"
    echo "export PSA_CUTE_PAIR_Q_PERM=${PQ:-0}" > "$STASH/pair_env"
    export PSA_CUTE_PAIR_Q_PERM=${PQ:-0}
    [ "${PQ:-0}" = 1 ] && run_tests cute 240 tests/test_cute_gpu.py tests/test_nonfinite.py tests/test_graphs_gpu.py
    ;;
X)  # session 10, last call (carry .carry/cs1 and .carry/pisa_official): the peers at the pieces' shapes in the same
    # session as L (cuDNN, FA4 dense, FA4 block-sparse at the exact fraction, official PISA; Sol-Attn's comfy-kitchen
    # wheel, 68 MB, does not fit beside the site), then the DiT step in the time left
    log "peers"
    timeout -k 10 ${PEERS_TIMEOUT:-200} python bench/peers.py --out "$OUT/peers.json" --shapes wan14,wan14_720,flux \
        --fractions 0.125,0.2 --pisa-densities 0.125,0.2 --sol-topk "" > "$OUT/peers.log" 2>&1
    log "peers rc=$? $(grep -c '^B1' "$OUT/peers.log") shapes"
    DIT_TIMEOUT=$((575 - SECONDS)) bash "$0" E
    exit $?
    ;;
Q)  # session 10 (carry .carry/cs1): the Morton copies' budget against the target of at most 1x q of extra memory:
    # PSA_MORTON_SCRATCH 1 (the default: 2 head chunks of 20 at Wan2.1-14B), 0.75 (3 of 14), 0.5 (4 of 10), both
    # backends, with the raster order's time as Morton's yardstick; the smallest budget not slower than 1% (medians
    # of 3 rounds) at 480p and 720p on both backends is picked, and the Morton GPU tests run with it
    log "cute_out_perm PSA_MORTON_SCRATCH 1 0.75 0.5 (cute, triton; raster too)"
    PROBE_ROUNDS=3 PROBE_BACKENDS=cute,triton PROBE_RASTER=1 timeout -k 10 ${MORTON_PROBE_TIMEOUT:-260} \
        python bench/probes/cute_out_perm.py PSA_MORTON_SCRATCH 1 0.75 0.5 > "$OUT/morton_budget.txt" 2>&1
    MS=$(python - "$OUT/morton_budget.txt" <<'PYEOF'
import json, statistics, sys
lines = [ln for ln in open(sys.argv[1]) if ln.startswith("RESULT ")]
r = json.loads(lines[0][7:]) if lines else {}
med = lambda x, o: statistics.median(v for k, v in x.items() if k.startswith(f"op{o}_r") and k.endswith("_ms"))  # noqa
xs = [r.get(s, {}) for s in ("wan14", "wan14_720", "wan14_triton", "wan14_720_triton")]
ok = [f for f in ("0.5", "0.75") if all(x.get("maxdiff", 1) <= 1e-3 and med(x, f) <= 1.01 * med(x, "1") for x in xs)]
print(ok[0] if ok else "1")
PYEOF
)
    log "decision: PSA_MORTON_SCRATCH=${MS:-1} ($(tail -1 "$OUT/morton_budget.txt" | cut -c1-3000))"
    export PSA_MORTON_SCRATCH=${MS:-1}
    run_tests morton 200 tests/test_triton_gpu.py tests/test_cute_gpu.py tests/test_cute_pair_gpu.py -k "orton"
    ;;
O)  # session 11, first call (carry .carry/cs1): a side-stream H pass (PSA_H_OVERLAP, since removed), its bitwise
    # tests and the graph tests, then the whole operator with it on / off (bench/probes/switch_ab.py)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: Triton only"
    run_tests streams 240 tests/test_triton_gpu.py tests/test_graphs_gpu.py -k "same_bits or graph or place"
    log "switch_ab PSA_H_OVERLAP"
    timeout -k 10 ${PROBE_TIMEOUT:-220} python bench/probes/switch_ab.py PSA_H_OVERLAP > "$OUT/h_overlap.txt" 2>&1
    log "h_overlap rc=$? $(tail -1 "$OUT/h_overlap.txt" | cut -c1-3000)"
    ;;
W)  # session 11, second call (carry .carry/cs1): the routing pipeline (PSA_ROUTE_PIPE, since removed) on / off
    # (routing alone and the whole operator), then every Triton, CuTe, non-finite and pair GPU test
    log "switch_ab PSA_ROUTE_PIPE --route"
    timeout -k 10 ${PROBE_TIMEOUT:-220} python bench/probes/switch_ab.py PSA_ROUTE_PIPE --route \
        > "$OUT/route_pipe.txt" 2>&1
    log "route_pipe rc=$? $(tail -1 "$OUT/route_pipe.txt" | cut -c1-3000)"
    run_tests all $((570 - SECONDS)) tests/test_triton_gpu.py tests/test_cute_gpu.py tests/test_nonfinite.py \
        tests/test_cute_pair_gpu.py
    ;;
Y)  # session 12 (carry .carry/cs1): the statistics in one pass (kernels/triton/stats_h.py, PSA_STATS_H) against the
    # statistics kernel + H-sum pass: the statistics alone (bench/probes/stats_h.py: layouts, float64 checks, sweeps),
    # the GPU tests that run the statistics, then the whole operator on / off (bench/probes/switch_ab.py)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: Triton only"
    log "stats_h probe"
    timeout -k 10 ${STATS_PROBE_TIMEOUT:-200} python bench/probes/stats_h.py > "$OUT/stats_h.txt" 2>&1
    log "stats_h rc=$? $(grep -c '' "$OUT/stats_h.txt") lines"
    run_tests stats_h 200 tests/test_triton_gpu.py tests/test_nonfinite.py tests/test_graphs_gpu.py
    log "switch_ab PSA_STATS_H"
    timeout -k 10 $((585 - SECONDS)) python bench/probes/switch_ab.py PSA_STATS_H > "$OUT/switch_stats_h.txt" 2>&1
    log "switch_stats_h rc=$? $(tail -1 "$OUT/switch_stats_h.txt" | cut -c1-3000)"
    ;;
Z)  # session 12, after Y (carry .carry/cs1): every Triton, CuTe, graph, non-finite and pair GPU test with the
    # one-pass statistics on, then every piece (L)
    run_tests all 330 tests/test_triton_gpu.py tests/test_graphs_gpu.py tests/test_nonfinite.py tests/test_cute_gpu.py \
        tests/test_cute_pair_gpu.py tests/test_api_errors.py
    PIECES_TIMEOUT=$((585 - SECONDS)) bash "$0" L
    exit $?
    ;;
Z2)  # session 12, last call (carry .carry/cs1): the training op's fix (its statistics outputs no longer alias) and the
    # orders made under inference mode, the backward GPU tests (two workers: their float64 references are large),
    # then the DiT step in the time left
    run_tests fix 150 tests/test_triton_gpu.py tests/test_graphs_gpu.py -k "compiled or one_pass or grad or morton"
    log "pytest backward"
    timeout 240 python -m pytest -q -p no:cacheprovider -n 2 -m gpu tests/test_backward_gpu.py > "$OUT/tests_bwd.log" 2>&1
    log "pytest backward rc=$? $(tail -1 "$OUT/tests_bwd.log")"
    DIT_TIMEOUT=$((585 - SECONDS)) bash "$0" E
    exit $?
    ;;
A13)  # session 13, first call (carry .carry/cs1): every GPU test on session 12's last kernel (the value sums in the
    # partial slot, not run on a GPU before), the routing scores builds (bench/probes/route_sweep.py), Nsight Compute
    # on the scores and select kernels at 720p (bench/probes/route_ncu.py), then the backward tests
    run_tests all 300 tests/test_triton_gpu.py tests/test_graphs_gpu.py tests/test_nonfinite.py tests/test_cute_gpu.py \
        tests/test_cute_pair_gpu.py tests/test_api_errors.py
    log "route_sweep"
    timeout -k 10 240 python bench/probes/route_sweep.py > "$OUT/route_sweep.txt" 2>&1
    log "route_sweep rc=$? $(tail -1 "$OUT/route_sweep.txt" | cut -c1-200)"
    log "ncu route"
    timeout 150 ncu --kernel-name regex:"_scores_kernel|_select" --launch-skip 2 --launch-count 2 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis --csv python bench/probes/route_ncu.py \
        > "$OUT/ncu_route.csv" 2> "$OUT/ncu_route.err"
    log "ncu route rc=$? $(wc -l < "$OUT/ncu_route.csv") lines"
    log "pytest backward"
    timeout $((580 - SECONDS)) python -m pytest -q -p no:cacheprovider -n 2 -m gpu tests/test_backward_gpu.py \
        > "$OUT/tests_bwd.log" 2>&1
    log "pytest backward rc=$? $(tail -1 "$OUT/tests_bwd.log")"
    ;;
B13)  # session 13, second call (carry .carry/cs1): the routing builds again (bfloat16 x3 score dots, the select's
    # bracket and register caps, larger score tiles, session 12 route.py as bench/probes/_route_prev.py, in commit f791e06 only), every
    # GPU test with the new defaults, then every piece (L)
    log "route_sweep"
    timeout -k 10 200 python bench/probes/route_sweep.py > "$OUT/route_sweep.txt" 2>&1
    log "route_sweep rc=$? $(tail -1 "$OUT/route_sweep.txt" | cut -c1-200)"
    run_tests all 270 tests/test_triton_gpu.py tests/test_graphs_gpu.py tests/test_nonfinite.py tests/test_cute_gpu.py \
        tests/test_cute_pair_gpu.py tests/test_api_errors.py
    PIECES_TIMEOUT=$((585 - SECONDS)) bash "$0" L
    exit $?
    ;;
C13)  # session 13, last call (carry .carry/cs1): the routing speed knobs (int64 offset tiles, the select's register
    # cap), zero-copy graph outputs at FLUX.1 as the node calls it (PSA_CUDA_GRAPH_ZERO_COPY), the GPU tests the
    # routing and the graph cache touch, then every piece with the fastest routing build (with_route_pick.py)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: Triton only"
    log "route_sweep"
    timeout -k 10 150 python bench/probes/route_sweep.py > "$OUT/route_sweep.txt" 2>&1
    log "route_sweep rc=$? $(tail -1 "$OUT/route_sweep.txt" | cut -c1-200)"
    log "switch_ab PSA_CUDA_GRAPH_ZERO_COPY"
    timeout -k 10 120 python bench/probes/switch_ab.py PSA_CUDA_GRAPH_ZERO_COPY --flux-only \
        > "$OUT/switch_zero_copy.txt" 2>&1
    log "switch_zero_copy rc=$? $(tail -1 "$OUT/switch_zero_copy.txt" | cut -c1-2000)"
    run_tests route 200 tests/test_triton_gpu.py tests/test_graphs_gpu.py tests/test_nonfinite.py tests/test_api_errors.py
    log "pieces (route pick)"
    timeout $((585 - SECONDS)) python bench/probes/with_route_pick.py "$OUT/route_sweep.txt" bench/pieces.py \
        --out "$OUT/pieces_l" --morton --flux-node --ditlike --shapes wan14,wan14_720,flux > "$OUT/pieces_l.log" 2>&1
    log "pieces rc=$? $(head -1 "$OUT/pieces_l.log")"
    ;;
A14)  # session 14, first call (no carry): the one-pass statistics with the column sums as [16, D] tiles of equal
    # rows (no reductions), the input-dtype k-bar / value means written after the loop, the q check read back,
    # against session 13's kernel (then run as a copy, PROBE_AB=1: bench/results/stats_h_s14_h200.txt; the copy and
    # that mode are gone, so this now times the two passes against the one pass), Nsight Compute on the kernel at
    # 480p, the Triton GPU tests. A second call (A14b, removed) measured a build with two programs per block range
    # over half the columns each at <= 128 registers: slower (bench/results/stats_h_split_s14_h200.txt).
    log "stats_h"
    timeout -k 10 300 python bench/probes/stats_h.py --shapes wan14,wan14_720,flux > "$OUT/stats_h_ab.txt" 2>&1
    log "stats_h rc=$? $(grep -v RESULT "$OUT/stats_h_ab.txt" | tail -12 | cut -c1-400)"
    log "ncu stats"
    timeout 120 ncu --kernel-name regex:"_stats_h_kernel" --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats --csv \
        python bench/probes/route_ncu.py --stats --T 32760 > "$OUT/ncu_stats.csv" 2> "$OUT/ncu_stats.err"
    log "ncu stats rc=$? $(wc -l < "$OUT/ncu_stats.csv") lines"
    run_tests route 200 tests/test_triton_gpu.py tests/test_graphs_gpu.py tests/test_nonfinite.py tests/test_api_errors.py
    ;;
C14)  # session 14, last call (carry .carry/cs1): a build with the squares' sums as float32 FMAs summed in-warp
    # (measured slower: bench/results/stats_h_fma_s14_h200.txt; back to A14's loop, which then had no device time
    # left for its own run), every GPU test, every piece (L), then the break-even table re-measured and installed
    # into nodes/ (on the device: that table, bench/results/breakeven_fma_s14_h200.json, is not committed there)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: Triton only"
    run_tests all 230 tests/test_triton_gpu.py tests/test_graphs_gpu.py tests/test_nonfinite.py tests/test_cute_gpu.py \
        tests/test_cute_pair_gpu.py tests/test_api_errors.py
    log "stats_h"
    timeout -k 10 150 python bench/probes/stats_h.py --shapes wan14,wan14_720,flux > "$OUT/stats_h.txt" 2>&1
    log "stats_h rc=$? $(grep -v RESULT "$OUT/stats_h.txt" | grep -E "raster|sweep" | cut -c1-300)"
    PIECES_TIMEOUT=$((430 - SECONDS)) bash "$0" L
    log "breakeven"
    timeout -k 5 $((560 - SECONDS)) python bench/pieces.py --out "$OUT/pieces_be" --shapes "" --breakeven \
        --install-breakeven > "$OUT/pieces_be.log" 2>&1
    log "breakeven rc=$?"
    cp nodes/breakeven_h200.json "$OUT/" 2>/dev/null
    ;;
A15)  # session 15, first call (carry .carry/cs1): every GPU test on session 14's final commit (fa576fa: its statistics
    # kernel had not run on a GPU), the statistics alone, then every piece (L)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: Triton only"
    run_tests all 240 tests/test_triton_gpu.py tests/test_graphs_gpu.py tests/test_nonfinite.py tests/test_cute_gpu.py \
        tests/test_cute_pair_gpu.py tests/test_api_errors.py
    log "stats_h"
    timeout -k 10 120 python bench/probes/stats_h.py --shapes wan14,wan14_720,flux --no-sweep > "$OUT/stats_h.txt" 2>&1
    log "stats_h rc=$? $(grep -v RESULT "$OUT/stats_h.txt" | grep -E "raster|sweep" | cut -c1-300)"
    PIECES_TIMEOUT=$((585 - SECONDS)) bash "$0" L
    exit $?
    ;;
B15)  # session 15, second call (carry .carry/cs1): three builds behind switches, each against the default in one
    # process: the statistics' column sums as [D, 16] warpgroup-MMA tiles (PSA_STATS_H_COLT), the Triton and the CuTe
    # virtual tiles with log2 of the token counts folded into the bias (PSA_TRITON_VT_FOLD, PSA_CUTE_VT_FOLD); then
    # every GPU test with all three on. All three measured slower and were removed (commit 09b34fd has them;
    # bench/results/stats_h_colt_s15_h200.txt, switch_*_vt_fold_s15_h200.txt): this phase no longer runs as it did
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: Triton only"
    log "stats_h COLT"
    PROBE_SWITCH=PSA_STATS_H_COLT timeout -k 10 120 python bench/probes/stats_h.py --shapes wan14,wan14_720,flux \
        --no-sweep > "$OUT/stats_h_colt.txt" 2>&1
    log "stats_h COLT rc=$? $(grep -v RESULT "$OUT/stats_h_colt.txt" | grep -E "raster" | cut -c1-200)"
    log "switch_ab PSA_TRITON_VT_FOLD"
    PROBE_BACKENDS=triton timeout -k 10 150 python bench/probes/switch_ab.py PSA_TRITON_VT_FOLD \
        > "$OUT/switch_triton_vt_fold.txt" 2>&1
    log "switch_triton_vt_fold rc=$? $(tail -1 "$OUT/switch_triton_vt_fold.txt" | cut -c1-1500)"
    log "switch_ab PSA_CUTE_VT_FOLD"
    PROBE_BACKENDS=cute timeout -k 10 150 python bench/probes/switch_ab.py PSA_CUTE_VT_FOLD \
        > "$OUT/switch_cute_vt_fold.txt" 2>&1
    log "switch_cute_vt_fold rc=$? $(tail -1 "$OUT/switch_cute_vt_fold.txt" | cut -c1-1500)"
    PSA_STATS_H_COLT=1 PSA_TRITON_VT_FOLD=1 PSA_CUTE_VT_FOLD=1 run_tests all3 $((585 - SECONDS)) \
        tests/test_triton_gpu.py tests/test_graphs_gpu.py tests/test_nonfinite.py tests/test_cute_gpu.py \
        tests/test_cute_pair_gpu.py tests/test_api_errors.py
    ;;
C15)  # session 15, last call (carry .carry/cs1): the break-even table on the shipped kernels (A15's; installed into
    # nodes/ on the device and copied back), then the DiT step (E)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: Triton only"
    log "breakeven"
    timeout -k 5 240 python bench/pieces.py --out "$OUT/pieces_be" --shapes "" --breakeven --install-breakeven \
        > "$OUT/pieces_be.log" 2>&1
    log "breakeven rc=$?"
    cp nodes/breakeven_h200.json "$OUT/" 2>/dev/null
    # C15_END: the caller's budget when C15 runs nested (a nested call's SECONDS starts at 0)
    DIT_TIMEOUT=$((${C15_END:-585} - SECONDS)) bash "$0" E
    exit $?
    ;;
D15)  # session 15 (carry .carry/cs1): the node's speed-up curve (bench_attention.py --sections web: the public API as
    # the node calls it, per density, against cuDNN SDPA) for web/js/speedup_h200.json
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: Triton only"
    log "web curve"
    timeout -k 5 ${WEB_TIMEOUT:-300} python bench/bench_attention.py --out "$OUT/web" --sections web > "$OUT/web.log" 2>&1
    log "web curve rc=$? $(grep -c density "$OUT/web.log") rows"
    ;;
E15)  # session 15, last call (carry .carry/cs1): the backward GPU tests (their forward's statistics are session 14's
    # kernel; last run in session 13). Session 15 ran them in 4 workers: 26 passed, 5 failed out of memory (the float64
    # references of four workers at T 32760 on one GPU) and the pisa peak-memory test failed after them in its worker
    # (390 vs 291 MiB: the test now warms up first). 2 workers, as every earlier session ran them
    log "pytest backward"
    timeout 240 python -m pytest -q -p no:cacheprovider -n 2 -m gpu tests/test_backward_gpu.py > "$OUT/tests_bwd.log" 2>&1
    log "pytest backward rc=$? $(tail -1 "$OUT/tests_bwd.log")"
    ;;
A16)  # session 16, first call (carry .carry/cs1): two builds of session 16, made on the CPU, each against the default in
    # one process. (1) The rolled Morton head chunks (PSA_MORTON_ROLL: CuTe's q copies in the caller's output ahead of
    # their chunk), time and peak memory at the default budget (480p: rolled in 3 chunks against 2 unrolled: what the
    # switch would change). Rule set before the run: MORTON_ROLL goes on when its 480p peak is <= 1x q, its time
    # (medians, as the node calls it) within 3% of the unrolled default's at 480p and 720p, its output within 2.4e-4
    # and its tests all pass. (2) The pair kernel's peeled virtual loop (PSA_CUTE_VT_PEEL: every virtual tile but the
    # last without per-column bounds or counts; 632 -> 448 SASS instructions per tile) and (3) the same split in the
    # Triton kernel (PSA_TRITON_VT_PEEL: two loops, 667 -> 436 per tile with Triton 3.6). Rule for each: on when it is
    # faster at 480p and 720p in the medians, raster and node layout, not slower at FLUX.1 (Triton), and its tests
    # pass. Then every forward GPU test with the roll on (A15's set: 180 s; the pair and Triton files hold the peels'
    # own tests)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: Triton only"
    log "switch_ab PSA_MORTON_ROLL"
    PROBE_BACKENDS=cute PROBE_SHAPES=wan14,wan14_720 timeout -k 10 150 \
        python bench/probes/switch_ab.py PSA_MORTON_ROLL > "$OUT/switch_morton_roll.txt" 2>&1
    log "switch_morton_roll rc=$? $(grep -v RESULT "$OUT/switch_morton_roll.txt" | cut -c1-900)"
    log "switch_ab PSA_CUTE_VT_PEEL"
    PROBE_BACKENDS=cute PROBE_SHAPES=wan14,wan14_raster,wan14_720 timeout -k 10 150 \
        python bench/probes/switch_ab.py PSA_CUTE_VT_PEEL > "$OUT/switch_vt_peel.txt" 2>&1
    log "switch_vt_peel rc=$? $(grep -v RESULT "$OUT/switch_vt_peel.txt" | cut -c1-900)"
    log "switch_ab PSA_TRITON_VT_PEEL"
    PROBE_BACKENDS=triton timeout -k 10 150 python bench/probes/switch_ab.py PSA_TRITON_VT_PEEL \
        > "$OUT/switch_triton_vt_peel.txt" 2>&1
    log "switch_triton_vt_peel rc=$? $(grep -v RESULT "$OUT/switch_triton_vt_peel.txt" | cut -c1-900)"
    PSA_MORTON_ROLL=1 run_tests roll $((585 - SECONDS)) tests/test_triton_gpu.py tests/test_graphs_gpu.py \
        tests/test_nonfinite.py tests/test_cute_gpu.py tests/test_cute_pair_gpu.py tests/test_api_errors.py
    ;;
B16)  # session 16, second call (carry .carry/cs1): the roll's own cost (3 chunks both ways at PSA_MORTON_SCRATCH=0.75),
    # the Morton budget at 1 against 0.75 as the node calls it on both backends (CuTe rolled; raster as the yardstick:
    # whether 480p's default budget should fall to 0.75 for the Triton backend too, 1.29x -> 0.93x q in session 10),
    # then E15's backward tests in 2 workers
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: Triton only"
    log "switch_ab PSA_MORTON_ROLL scratch=0.75"
    PSA_MORTON_SCRATCH=0.75 PROBE_BACKENDS=cute PROBE_SHAPES=wan14,wan14_720 timeout -k 10 150 \
        python bench/probes/switch_ab.py PSA_MORTON_ROLL > "$OUT/switch_morton_roll0.75.txt" 2>&1
    log "switch_morton_roll0.75 rc=$? $(grep -v RESULT "$OUT/switch_morton_roll0.75.txt" | cut -c1-900)"
    log "budget sweep, rolled"
    PSA_MORTON_ROLL=1 PROBE_BACKENDS=cute,triton PROBE_RASTER=1 timeout -k 10 150 \
        python bench/probes/cute_out_perm.py PSA_MORTON_SCRATCH 1 0.75 > "$OUT/morton_budget_roll.txt" 2>&1
    log "morton_budget_roll rc=$? $(tail -1 "$OUT/morton_budget_roll.txt" | cut -c1-1500)"
    log "pytest backward"
    timeout $((585 - SECONDS)) python -m pytest -q -p no:cacheprovider -n 2 -m gpu tests/test_backward_gpu.py \
        > "$OUT/tests_bwd.log" 2>&1
    log "pytest backward rc=$? $(tail -1 "$OUT/tests_bwd.log")"
    ;;
A17)  # session 17, second call (carry .carry/cs1), after A16: (1) the peeled virtual loops in the attention kernels
    # alone under one routing, 5 alternated rounds (bench/probes/vt_peel_kernel.py: A16's whole-operator rounds were
    # too noisy at 480p to read a ~1% change); (2) where the roll's output moved at 480p (bench/probes/roll_diff.py);
    # (3) the tests A16 failed, fixed (a tolerance below bf16's rounding, a cache-key index, the rolled chunks'
    # scatter count), with the roll on; (4) every forward GPU test on the defaults (A16 ran them with the roll on)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: Triton only"
    log "vt_peel_kernel probe"
    timeout -k 10 150 python bench/probes/vt_peel_kernel.py > "$OUT/vt_peel_kernel.txt" 2>&1
    log "vt_peel_kernel rc=$? $(grep -v RESULT "$OUT/vt_peel_kernel.txt" | cut -c1-1200)"
    log "roll_diff probe"
    timeout -k 10 90 python bench/probes/roll_diff.py > "$OUT/roll_diff.txt" 2>&1
    log "roll_diff rc=$? $(python -c "import json,sys; r=json.loads(open(sys.argv[1]).read().split('RESULT ')[-1]); \
print({k: r[k] for k in r if k != 'heads'}, [h for h in r['heads'] if h['max'] > 0][:6])" "$OUT/roll_diff.txt" 2>&1 | cut -c1-1500)"
    PSA_MORTON_ROLL=1 run_tests fixed_roll 150 tests/test_triton_gpu.py tests/test_cute_pair_gpu.py \
        tests/test_cute_gpu.py -k "peeled or through_the_permutation or morton_gathered"
    run_tests defaults $((585 - SECONDS)) tests/test_triton_gpu.py tests/test_graphs_gpu.py tests/test_nonfinite.py \
        tests/test_cute_gpu.py tests/test_cute_pair_gpu.py tests/test_api_errors.py
    ;;
A17b)  # session 17, third call (carry .carry/cs1): the roll's differing heads traced stage by stage
    # (bench/probes/roll_diff.py: copies, statistics, lists, attention), then the backward GPU tests in 2 workers
    # (E15's four workers ran out of memory in the float64 references), then the pieces at 480p if time is left
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: Triton only"
    log "roll_diff probe (stages)"
    timeout -k 10 120 python bench/probes/roll_diff.py > "$OUT/roll_diff_stages.txt" 2>&1
    log "roll_diff rc=$? $(python -c "import json,sys; r=json.loads(open(sys.argv[1]).read().split('RESULT ')[-1]); \
print(r['chunks'], r['stages'][:6])" "$OUT/roll_diff_stages.txt" 2>&1 | cut -c1-1500)"
    log "pytest backward"
    timeout $((480 - SECONDS)) python -m pytest -q -p no:cacheprovider -n 2 -m gpu tests/test_backward_gpu.py \
        > "$OUT/tests_bwd.log" 2>&1
    log "pytest backward rc=$? $(tail -1 "$OUT/tests_bwd.log")"
    ;;
P17)  # session 17, last call (carry .carry/cs1): Nsight Compute on the CuTe pair kernel at 480p, pwt, pwt without
    # its virtual tiles (novt) and pwt with the peeled virtual loop (PSA_CUTE_VT_PEEL=1: 632 -> 448 instructions per
    # virtual tile, no change in time): what bounds the virtual tiles if not instruction issue
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    for run in pwt novt pwt_peel; do
        [ "$SECONDS" -gt 230 ] && { log "ncu $run skipped (time)"; continue; }
        var=${run%_peel}; peel=0; [ "$run" = pwt_peel ] && peel=1
        log "ncu $run"
        PSA_CUTE_VT_PEEL=$peel timeout 120 ncu --kernel-name regex:cutlass --launch-skip 1 --launch-count 1 \
            --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
            --section MemoryWorkloadAnalysis --section InstructionStats --section LaunchStats --section Occupancy \
            --csv python bench/probes/virtual_ncu.py $var --calls 1 > "$OUT/ncu_$run.csv" 2> "$OUT/ncu_$run.err"
        log "ncu $run rc=$? $(wc -l < "$OUT/ncu_$run.csv") lines"
    done
    ;;
PP)  # session 17, last call (carry .carry/cs1; ~170 s of device time left): the pair kernel's ping-pong consumers
    # (PSA_CUTE_PINGPONG) against the plain ones in the attention kernel alone at 480p, 3 alternated rounds, then
    # its GPU tests (equal outputs; unequal lists, an odd last block, no virtual tiles: the cases a wrong turn
    # protocol would hang on, each run under a timeout)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    log "pingpong probe"
    PROBE_T=32760 PROBE_ROUNDS=3 timeout -k 5 75 python bench/probes/vt_peel_kernel.py PSA_CUTE_PINGPONG \
        > "$OUT/pingpong_kernel.txt" 2>&1
    log "pingpong rc=$? $(grep -v RESULT "$OUT/pingpong_kernel.txt" | cut -c1-1200)"
    run_tests pingpong $((160 - SECONDS)) tests/test_cute_pair_gpu.py -k pingpong
    ;;
A20)  # session 20's first call (carry .carry/cs1; ~8 min; its tests: A20T): session 19's CPU builds on top of the
    # shipped PV_FENCE, all scheduling only (equal outputs): PSA_CUTE_PV_PIN (the exact tiles' fences under a row-sum test that never holds:
    # the fence never runs, and the wait still cannot rise above the softmax), PSA_CUTE_PV_FENCE_VT (now pinned: the
    # unpinned fence held only 20-23 of the virtual tile's 34 exponentials above it, and A19 measured no gain) and
    # PSA_CUTE_S_AHEAD (now pinned: A19's unpinned build had the wait hoisted above the softmax, 7% slower; pinned,
    # the softmax of u - 1 runs under S of u and P V of u - 2, all 34 exponentials above the wait in the DSL's own
    # cubin). (1) each against the default in the kernels alone, pwt (and drop for PV_PIN), 480p and 720p, 5 rounds;
    # (2) PV_FENCE_VT and S_AHEAD on top of PV_PIN; (3) the split with all on; (4, A20T) the scheduling tests and
    # every forward GPU test with all on. Rules set now: each switch on if its pwt medians are faster at 480p and
    # 720p in >= 4 of 5 rounds each and the drop medians are not slower by more than 0.5% (outputs equal, every
    # GPU test passing); where two win, the pair goes on only if (2) shows it faster than either alone by the same
    # rule. Prediction: PV_PIN within +-0.5% (an executed fence with no loads in flight costs little); PV_FENCE_VT
    # the virtual tiles 0.96 -> ~0.85 ms at 480p, 6.8 -> ~6 at 720p; S_AHEAD the exact part -0.2 to -0.4 ms at 480p
    # (split: novt 5.66 -> ~5.3, the stream 4.76 the floor). Added in session 20 (built on the CPU, same rule):
    # PSA_CUTE_S_AHEAD_VT (the virtual loop with S of tile t issued before the softmax of t - 1, four shared stages,
    # scheduling only: outputs equal; left out where S_AHEAD is on, so in pin_stack it stacks on PV_PIN only);
    # prediction: the virtual tiles 0.96 -> ~0.8 ms at 480p, 6.8 -> ~5.5 at 720p
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    log "pin, vt fence, S ahead (exact, virtual) vs the default (PV_FENCE), kernels alone"
    PROBE_DROP=1 PROBE_ROUNDS=5 timeout -k 10 290 python bench/probes/vt_peel_kernel.py PSA_CUTE_PV_PIN \
        PSA_CUTE_PV_FENCE_VT PSA_CUTE_S_AHEAD PSA_CUTE_S_AHEAD_VT > "$OUT/pin_kernel.txt" 2>&1
    log "pin rc=$? $(grep -v RESULT "$OUT/pin_kernel.txt" | python bench/probes/ab_brief.py 2>&1 | cut -c1-3000)"
    PROBE_BASE=PSA_CUTE_PV_PIN=1 PROBE_ROUNDS=5 timeout -k 10 160 python bench/probes/vt_peel_kernel.py \
        PSA_CUTE_PV_FENCE_VT PSA_CUTE_S_AHEAD PSA_CUTE_S_AHEAD_VT > "$OUT/pin_stack.txt" 2>&1
    log "pin_stack rc=$? $(grep -v RESULT "$OUT/pin_stack.txt" | python bench/probes/ab_brief.py 2>&1 | cut -c1-2000)"
    # PSA_CUTE_PAIR_DROP (session 20): drop through the pair build (n_vt = 0, the "novt" kernel), here with S_AHEAD
    # under both arms, so the drop columns compare the one-block kernel with the pair build + S_AHEAD. Rule: on only
    # if S_AHEAD goes on and those drop medians are faster at 480p and 720p in >= 4 of 5 rounds each (its output is
    # the one-block kernel's up to the reciprocal epilogue's rounding; tests/test_cute_pair_gpu.py in A20T)
    log "pair drop with S_AHEAD vs the one-block drop"
    PROBE_DROP=1 PROBE_BASE=PSA_CUTE_S_AHEAD=1 PROBE_ROUNDS=5 timeout -k 10 110 python bench/probes/vt_peel_kernel.py \
        PSA_CUTE_PAIR_DROP > "$OUT/pair_drop.txt" 2>&1
    log "pair_drop rc=$? $(grep -v RESULT "$OUT/pair_drop.txt" | python bench/probes/ab_brief.py 2>&1 | cut -c1-1500)"
    log "pair split, all pinned"  # (S_AHEAD_VT is left out where S_AHEAD is on: this split is S_AHEAD's)
    PSA_CUTE_PV_PIN=1 PSA_CUTE_PV_FENCE_VT=1 PSA_CUTE_S_AHEAD=1 PSA_CUTE_S_AHEAD_VT=1 PROBE_ROUNDS=2 timeout -k 10 80 \
        python bench/probes/pair_split.py > "$OUT/pair_split_pin.txt" 2>&1
    log "pair_split_pin rc=$? $(grep -v RESULT "$OUT/pair_split_pin.txt" | cut -c1-1500)"
    ;;
A21)  # session 21's second call (carry .carry/cs1; ~5 min): A20 found S_AHEAD_VT the only winner, and not clearly
    # at 480p (alone 3/5 rounds, -0.6%; on PV_PIN 5/5, -2.4%; 720p 5/5 both, -0.9% / -1.1%), and its output 1.2e-4
    # (rel L2 5e-6) off the default where its tests assert bitwise. (1) S_AHEAD_VT alone vs the default, pwt, 7
    # rounds, 480p and 720p (rule as A20's: on if faster in >= 6 of 7 at each); (2) every forward GPU test with it on
    savt_round 585
    ;;
A22)  # session 21's third call (carry .carry/cs1; ~9.5 min): A21's three failures were S_AHEAD_VT's only: LLVM fused
    # the whole-block bias product into the logit's FMA for 2 of 32 columns (PTX fma.rn.f32 with LOG2E), rounding the
    # other product; _bias_whole now rounds it on its own (mul.rn: 64 FMUL, no such FFMA in the sm_90a SASS). (1) the
    # re-timing, 7 rounds (rule: faster in >= 6 of 7 at 480p and 720p each); (2) every forward GPU test with it on;
    # (3) the pieces with it on (L's shapes: wan14, wan14_720, FLUX.1 as the node calls it, Morton, DiT-like)
    savt_round 300
    log "pieces with S_AHEAD_VT"
    PSA_CUTE_S_AHEAD_VT=1 timeout -k 10 $((580 - SECONDS)) python bench/pieces.py --out "$OUT/pieces_l" --morton \
        --flux-node --ditlike --shapes wan14,wan14_720,flux > "$OUT/pieces_l.log" 2>&1
    log "pieces rc=$?"
    ;;
I38)  # (historical: the build was removed after this call; commit e770827 has it, split_clocks.py's kinds: prefix too)
    # session 25's last call (carry .carry/cs1; <= 330 s, the device time left): PSA_CUTE_SHARE_KINDS, built on the
    # CPU this session (fwd_pair.py share_kinds, pair_sched._k_*: the shared exact pipeline with a full barrier per
    # owner kind and slot; each consumer waits for and releases only its own tiles; the protocol checked down to its
    # barrier phases by tests/test_union_barrier_model.py). (1) the shared pipeline's crafted-list tests with it on,
    # stopping at the first failure, cut at 100 s (a hang is a protocol bug); (2) split_clocks.py on DiT-like Morton
    # inputs at 480p: novt per list, share:novt, kinds:novt. Prediction: kinds below share's 5.82 ms and its 4.02 J,
    # toward the ~3.2 J budget (G38b); whether it beats the per-list 5.16 ms is the question. Rule set now: nothing
    # ships this session (PAIR_SHARE stays off); SHARE_KINDS becomes the shared pipeline's default if its tests pass
    # and kinds:novt is faster than share:novt; (3) the rest of the shared pipeline's tests with it on, as time allows
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    log "pytest kinds smoke"
    PSA_CUTE_SHARE_KINDS=1 timeout -k 10 100 python -m pytest -q -x -p no:cacheprovider -m gpu \
        tests/test_cute_pair_gpu.py -k "shared_exact_tiles_crafted" > "$OUT/tests_kinds_smoke.log" 2>&1
    SMOKE=$?
    log "pytest kinds smoke rc=$SMOKE $(tail -1 "$OUT/tests_kinds_smoke.log")"
    if [ "$SMOKE" = 0 ]; then
        PROBE_INPUTS=ditlike PROBE_BUILDS=novt,share:novt,kinds:novt timeout -k 10 110 \
            python bench/probes/split_clocks.py > "$OUT/split_clocks_kinds.txt" 2>&1
        log "split_clocks rc=$? $(grep -v RESULT "$OUT/split_clocks_kinds.txt" | cut -c1-3000)"
        PSA_CUTE_SHARE_KINDS=1 run_tests kinds_share $((300 - SECONDS)) tests/test_cute_pair_gpu.py -k "share"
    fi
    ;;
H38)  # session 25's eighth call (carry .carry/cs1; ~1.5 min): the idle GPU's power (split_clocks.py's new first phase),
    # for the static share in F38's joules (assumed ~150 W), then the exact part and its stream once more at 480p.
    # Diagnostic, nothing ships
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    PROBE_BUILDS=novt,novt+stream timeout -k 10 300 python bench/probes/split_clocks.py > "$OUT/split_clocks_idle.txt" 2>&1
    log "split_clocks rc=$? $(grep -v RESULT "$OUT/split_clocks_idle.txt" | cut -c1-2000)"
    ;;
G38b)  # session 25's seventh call (carry .carry/cs1; ~4 min): split_clocks.py on DiT-like Morton-ordered inputs (480p grid;
    # adjacent query blocks' lists share ~61% of their blocks), the pair kernel with a pipeline per list against the
    # shared exact pipeline (PAIR_SHARE: each shared tile loaded once, ~30% fewer tile bytes; session 10 measured it
    # 13% slower on these inputs). Under E38 / F38's power model the question is whether the shared pipeline runs
    # below the cap (pacing-bound: higher clock, lower power) with fewer joules: then a better-paced union schedule
    # has room. Diagnostic, nothing ships. Prediction: share below the cap (>= 1800 MHz, < 650 W), its energy per call
    # ~10% below the own-list pipeline's
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    PROBE_INPUTS=ditlike PROBE_BUILDS=novt,share:novt,novt+stream,share:novt+stream,pwt,share:pwt timeout -k 10 500 \
        python bench/probes/split_clocks.py > "$OUT/split_clocks_share.txt" 2>&1
    log "split_clocks rc=$? $(grep -v RESULT "$OUT/split_clocks_share.txt" | cut -c1-4000)"
    ;;
F38)  # session 25's sixth call (carry .carry/cs1; ~2 min): E38 found the exact part (novt) at 1620 MHz / 693 W, power-capped,
    # in 8.58 M cycles, and its tile stream alone at 1980 MHz / 439 W in 8.98 M cycles: at its own clock the exact
    # part is at its stream. Where its joules go: the exact part without its GEMMs (loads + softmax) and without its
    # softmax (loads + GEMMs), at 480p and 720p, with the exact part and its stream again. Diagnostic, nothing ships
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    PROBE_T=32760,75600 PROBE_BUILDS=novt,novt+stream,novt+nogemm,novt+nosoftmax timeout -k 10 400 \
        python bench/probes/split_clocks.py > "$OUT/split_clocks_parts.txt" 2>&1
    log "split_clocks rc=$? $(grep -v RESULT "$OUT/split_clocks_parts.txt" | cut -c1-4000)"
    ;;
E38)  # session 25's fifth call (carry .carry/cs1; ~3 min): bench/probes/split_clocks.py - the pair kernel's timing
    # builds (pwt, novt = the exact part, novt+stream = its tile stream alone, stream) back to back at 480p with the SM
    # clock and power sampled. A38: the node's call runs power-capped at ~1665 MHz. Diagnostic, nothing ships.
    # Prediction: the stream-only builds run at a higher clock than the exact part (fewer joules per tile), so the
    # exact part's cycles sit closer to the stream's than its milliseconds (5.47 vs 4.75 ms)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    timeout -k 10 400 python bench/probes/split_clocks.py > "$OUT/split_clocks.txt" 2>&1
    log "split_clocks rc=$? $(grep -v RESULT "$OUT/split_clocks.txt" | cut -c1-3000)"
    ;;
D38)  # (historical: the build and its test were removed after this call; commit 88f14ae has them)
    # session 25's fourth call (carry .carry/cs1; ~4 min): PSA_SCORE_PAD (kernels/triton/route.py score_stride: the
    # routing scores' rows padded to a multiple of 64 floats, so the scores kernel's stores and the select kernels'
    # loads are aligned; sm_90a SASS of the one-warp select at 720p: 40 scalar LDG -> 10 LDG.128, 476 -> 306 SHFL, 167
    # -> 137 registers; the scores kernel 70 -> 46 STG). (1) its GPU test (bitwise the unpadded lists, bias and
    # output, both select kernels); (2) bench/probes/route_switch.py PSA_SCORE_PAD: route() at 720p / 480p / FLUX.1, 5
    # alternated rounds; (3) the Triton and non-finite GPU files with it on. Prediction: the 720p select ~0.54 ->
    # ~0.48 ms, route() ~1.07 -> ~1.0; 480p ~0.183 -> ~0.17. Rule set now: on if its lists and bias are bitwise the
    # unpadded ones on every shape, its tests pass, route() is faster in >= 4 of 5 rounds at 720p and at 480p, and
    # FLUX.1's median is not slower by more than 2%
    run_tests pad_test 100 tests/test_triton_gpu.py -k padded_score
    log "route_switch PSA_SCORE_PAD"
    timeout -k 10 150 python bench/probes/route_switch.py PSA_SCORE_PAD > "$OUT/route_pad.txt" 2>&1
    log "route_switch rc=$? $(grep -v RESULT "$OUT/route_pad.txt" | cut -c1-3000)"
    PSA_SCORE_PAD=1 run_tests tri_pad $((560 - SECONDS)) tests/test_triton_gpu.py tests/test_nonfinite.py
    ;;
C38)  # (historical: the build, its test and score_presplit.py were removed after this call; commit 4db87df has them)
    # session 25's third call (carry .carry/cs1; ~5 min): PSA_SCORE_PRESPLIT (kernels/triton/route.py: the scores'
    # bfloat16 parts split once per call by _split_kernel, not in every tile; B38's profile put 20% of the scores
    # kernel's stall samples on F2F). (1) its GPU test (bitwise the default's lists, bias and output), then the
    # Triton and non-finite GPU files with it on; (2) bench/probes/score_presplit.py: route() at 720p / 480p / FLUX.1,
    # default vs four presplit builds, 5 alternated rounds. Prediction: 720p scores ~0.50 -> ~0.30 ms, routing ~0.98
    # -> ~0.78. Rule set now: the fastest presplit build becomes the default if its lists and bias are bitwise the
    # default's on all three shapes, its tests pass, and route() is faster in >= 4 of 5 rounds at 720p and 480p and
    # not slower than 2% (medians) at FLUX.1
    run_tests presplit_test 100 tests/test_triton_gpu.py -k presplit
    log "score_presplit"
    timeout -k 10 200 python bench/probes/score_presplit.py > "$OUT/score_presplit.txt" 2>&1
    log "score_presplit rc=$? $(grep -v RESULT "$OUT/score_presplit.txt" | cut -c1-3000)"
    PSA_SCORE_PRESPLIT=1 run_tests tri_presplit $((560 - SECONDS)) tests/test_triton_gpu.py tests/test_nonfinite.py
    ;;
B38)  # session 25's second call (carry .carry/cs1; ~3 min): (1) A38's one failure again, alone: the backward test
    # test_density_one_gradients_equal_sdpa[B1_H2_T32760_D128-pwt] ran out of memory beside three other xdist workers
    # (one held 84 GiB; this file runs on 2 workers elsewhere); (2) Nsight Compute on the routing kernels at 720p on
    # today's defaults (bf16x3 scores, the "pieces" select): sections, then per-instruction stall samples
    # (bench/probes/ncu_sass.py). Session 22 found the select's time "mostly not the search"; the scores sit ~3x
    # above their L2-operand + write bound. Diagnostic, nothing ships
    timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_backward_gpu.py \
        -k "test_density_one_gradients_equal_sdpa" > "$OUT/tests_bwd_one.log" 2>&1
    log "pytest bwd_one rc=$? $(tail -1 "$OUT/tests_bwd_one.log")"
    log "ncu route"
    timeout 150 ncu --kernel-name regex:"_scores_kernel|_select" --launch-skip 2 --launch-count 2 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        --section InstructionStats --csv python bench/probes/route_ncu.py > "$OUT/ncu_route.csv" 2> "$OUT/ncu_route.err"
    log "ncu route rc=$? $(wc -l < "$OUT/ncu_route.csv") lines"
    for kn in _scores_kernel _select; do
        log "ncu source $kn"
        timeout 100 ncu --kernel-name regex:"$kn" --launch-skip 1 --launch-count 1 --section SourceCounters \
            --section WarpStateStats --import-source no -f -o "$OUT/sass$kn" \
            python bench/probes/route_ncu.py > "$OUT/sass$kn.err" 2>&1
        ncu -i "$OUT/sass$kn.ncu-rep" --page source --csv --print-source sass > "$OUT/sass$kn.csv" 2>> "$OUT/sass$kn.err"
        python bench/probes/ncu_sass.py "$OUT/sass$kn.csv" --top 40 > "$OUT/sass$kn.txt" 2>&1
        log "ncu source $kn rc=$? $(sed -n 1,12p "$OUT/sass$kn.txt" | cut -c1-300 | tr '\n' ' ')"
    done
    (cd "$OUT" && rm -f sass*.ncu-rep; tar czf sass_csv.tgz sass*.csv sass*.err && rm -f sass*.csv sass*.err)
    ;;
A38)  # session 25's first call (carry .carry/cs1; ~9 min): (1) every forward GPU test on f329e7f (kernels.api reads the
    # CUDA-graph policy once and hands it to select_backend(graphed=); dispatch inside the device context), not yet
    # run on a GPU; the Triton, API and backward files too, since every call goes through kernels.api; (2) G38
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    run_tests fwd_api 260 tests/test_cute_pair_gpu.py tests/test_cute_gpu.py tests/test_nonfinite.py \
        tests/test_graphs_gpu.py
    run_tests tri_api 170 tests/test_triton_gpu.py tests/test_api_errors.py tests/test_backward_gpu.py
    log "clocks"
    timeout -k 10 $((570 - SECONDS)) python bench/probes/clocks.py > "$OUT/clocks.txt" 2>&1
    log "clocks rc=$? $(grep -v RESULT "$OUT/clocks.txt" | cut -c1-2500)"
    ;;
G38)  # next session (carry .carry/cs1; ~1 min): bench/probes/clocks.py, built in session 24. Session 23's DiT step had
    # the pair kernel ~15% slower inside the model (6.43 ms per call against 5.45-5.53 alone). The node's Wan 480p call
    # back to back, the model's FFN GEMMs back to back, then both interleaved as a DiT block runs them, with the SM
    # clock, power and throttle reasons sampled every 20 ms. Diagnostic, nothing ships. Prediction: if clocks explain
    # it, the interleaved call is ~15% slower at an SM clock ~15% lower (power-capped during the GEMMs)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    timeout -k 10 120 python bench/probes/clocks.py > "$OUT/clocks.txt" 2>&1
    log "clocks rc=$? $(grep -v RESULT "$OUT/clocks.txt" | cut -c1-2500)"
    ;;
F37)  # session 24's last call (carry .carry/cs1; ~4 min): E37 met its rule at 72 blocks, so PAIR_MIN_BLOCKS = 72:
    # (1) every forward GPU test of the CuTe, pair, non-finite and graph files on it (FLUX-sized calls of pisa / pwt
    # now take the pair kernel); (2) FLUX.1 as the node calls it, replayed, PSA_CUTE_PAIR 0 / 1, 5 rounds (E37 timed it
    # through the graph cache, 3 rounds: 0.252 -> 0.245 ms at d 0.2)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    run_tests fwd_pair72 260 tests/test_cute_pair_gpu.py tests/test_cute_gpu.py tests/test_nonfinite.py \
        tests/test_graphs_gpu.py
    log "switch_ab PSA_CUTE_PAIR --flux-only"
    PROBE_ROUNDS=5 PROBE_BACKENDS=cute timeout -k 10 $((585 - SECONDS)) python bench/probes/switch_ab.py PSA_CUTE_PAIR \
        --flux-only > "$OUT/switch_pair_flux.txt" 2>&1
    log "switch_ab rc=$? $(grep -v RESULT "$OUT/switch_pair_flux.txt" | cut -c1-1500)"
    ;;
E37)  # session 24's fifth call (carry .carry/cs1; ~3 min): the pair kernel below PAIR_MIN_BLOCKS. Set in session 7 on the
    # attention alone at 480p / 720p while small calls were host-bound; today they replay from CUDA graphs on CuTe and
    # their GPU time counts (FLUX.1 replayed ~0.25 ms, ~0.17 of it the one-block kernel). bench/probes/pair_small.py:
    # the node's call at the break-even sizes (2816-16896 tokens, d 0.125 / 0.2 / 0.3), PSA_CUTE_PAIR 0 / 1
    # alternated, 3 rounds. Prediction: the pair kernel (virtual tiles read once per two query blocks, its TMA-store
    # epilogue, S_AHEAD_VT) faster from ~4.6K tokens on, by up to ~10% of the call. Rule set now: PAIR_MIN_BLOCKS
    # drops to the smallest size from which the pair kernel's median is lower at every density of that size and
    # every larger one, in >= 2 of 3 rounds each, outputs within 1e-2 relative L2 (the reciprocal epilogue's rounding)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    log "pair_small"
    timeout -k 10 $((585 - SECONDS)) python bench/probes/pair_small.py > "$OUT/pair_small.txt" 2>&1
    log "pair_small rc=$? $(grep -v RESULT "$OUT/pair_small.txt" | cut -c1-3000)"
    ;;
C37)  # session 24's third call (carry .carry/cs1; ~8 min): PSA_STATS_PERM_DEEP is the default from B37 (its kernel
    # 0.751 -> 0.598 ms at 480p, 1.690 -> 1.340 at 720p, every round; the node's call 4 of 5 rounds at 480p, 5 of 5 at
    # FLUX.1, but 3 of 5 at 720p, whose eager rounds spread 34.7-37.2 ms around a ~0.35 ms effect). (1) A confirmation
    # at 720p with the host taken out: the call captured by hand and replayed (PROBE_REPLAY=1), 7 alternated rounds;
    # rule set now: it stays on if the replayed call is faster in >= 5 of 7 rounds, else the rest of this call runs
    # with it off (and so does the shipped default). (2) Every forward GPU test on what ships (the pair, CuTe,
    # non-finite, graph, Triton and API-error files; the statistics are bitwise the 3-stage build's, B37's test, so
    # the backward tests' inputs do not move); D37 then times the pieces on it
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    log "switch_ab PSA_STATS_PERM_DEEP 720p replayed"
    PROBE_REPLAY=1 PROBE_ROUNDS=7 PROBE_BACKENDS=cute PROBE_SHAPES=wan14_720 timeout -k 10 150 \
        python bench/probes/switch_ab.py PSA_STATS_PERM_DEEP > "$OUT/switch_stats_perm_deep_720p.txt" 2>&1
    log "switch_ab rc=$? $(grep -v RESULT "$OUT/switch_stats_perm_deep_720p.txt" | cut -c1-2500)"
    wins=$(python - "$OUT/switch_stats_perm_deep_720p.txt" <<'PYEOF'
import json, sys
lines = [ln for ln in open(sys.argv[1]) if ln.startswith("RESULT ")]
d = json.loads(lines[0][7:]).get("wan14_720_cute", {}) if lines else {}
print(sum(d.get(f"op1_r{i}_replay_ms", 1e9) < d.get(f"op0_r{i}_replay_ms", 0) for i in range(7)))
PYEOF
)
    if [ "${wins:-0}" -ge 5 ]; then log "PERM_DEEP confirmed: $wins of 7 rounds"; else
        log "PERM_DEEP not confirmed ($wins of 7): the rest runs with it off"; export PSA_STATS_PERM_DEEP=0; fi
    run_tests fwd_deep 250 tests/test_cute_pair_gpu.py tests/test_cute_gpu.py tests/test_nonfinite.py \
        tests/test_graphs_gpu.py
    run_tests triton_deep $((580 - SECONDS)) tests/test_triton_gpu.py tests/test_api_errors.py
    ;;
D37)  # session 24's last call (carry .carry/cs1; ~8 min): on what C37 shipped, the pieces (L's shapes), the node's
    # curve (D15), the break-even table (installed) and the DiT step (C15 -> E)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    log "pieces"
    timeout -k 10 150 python bench/pieces.py --out "$OUT/pieces_l" --morton --flux-node --ditlike \
        --shapes wan14,wan14_720,flux > "$OUT/pieces_l.log" 2>&1
    log "pieces rc=$?"
    WEB_TIMEOUT=120 bash "$0" D15
    C15_END=$((585 - SECONDS)) bash "$0" C15
    ;;
B37)  # session 24's second call (carry .carry/cs1; ~5 min): PSA_STATS_PERM_DEEP (stats_h.py loop_stages, built after
    # A37): A37's profile had the gathered statistics at 8.2 cycles per issued instruction (raster 4.9) with one
    # program of 8 warps per SM, and their sm_90a TTGIR (Triton 3.6) shows why: the permuted loop's tile loads wait on
    # the row indices' load, so at 3 stages the pipeliner gives q, k, v one shared-memory buffer (the raster loop two);
    # 5 stages give two, 7 three (bench/probes/stats2_compile.py perm; 239 registers, no spills, 107,008 bytes). (1)
    # its GPU test (bitwise the 3-stage build: copies, statistics, a head chunk, the whole operator); (2) the
    # statistics alone (bench/probes/stats_h.py, PROBE_SWITCH: every layout, raster and node layouts being the
    # unchanged control; the gathered depth swept at 480p and FLUX.1), 3 rounds; (3) switch_ab.py as the node calls
    # it (Wan2.1-14B 480p / 720p, FLUX.1 replayed; CuTe), 5 rounds. Prediction: the gathered statistics 0.76 ->
    # 0.50-0.55 ms at 480p (two buffers as the raster loop, plus the copies' writes), 1.9 -> ~1.3 at 720p; the node's
    # call -0.2 / -0.5 ms. Rule set now: on if the test passes, the outputs are bitwise equal and the node's call is
    # faster in >= 4 of 5 rounds at both Wan sizes with FLUX.1's median not slower
    run_tests stats_deep 120 tests/test_triton_gpu.py -k "same_bits and morton_path"
    log "stats_h.py PSA_STATS_PERM_DEEP"
    PROBE_SWITCH=PSA_STATS_PERM_DEEP timeout -k 10 200 python bench/probes/stats_h.py --shapes wan14,wan14_720,flux \
        > "$OUT/stats_perm_deep.txt" 2>&1
    log "stats_h rc=$? $(grep -v RESULT "$OUT/stats_perm_deep.txt" | grep -v "vs float64" | cut -c1-2500)"
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    log "switch_ab PSA_STATS_PERM_DEEP"
    PROBE_ROUNDS=5 PROBE_BACKENDS=cute PROBE_SHAPES=wan14,wan14_720,flux timeout -k 10 $((585 - SECONDS)) \
        python bench/probes/switch_ab.py PSA_STATS_PERM_DEEP > "$OUT/switch_stats_perm_deep.txt" 2>&1
    log "switch_ab rc=$? $(grep -v RESULT "$OUT/switch_stats_perm_deep.txt" | cut -c1-2500)"
    ;;
A37)  # session 24's first call (carry .carry/cs1; ~5 min): why the Morton path's statistics run at ~60% of their
    # copy-rate bound (A36: 0.76 ms at 480p, 1.92 at 720p, against 0.47 / 1.09 for reading q, k, v and writing their
    # block-order copies; raster 0.40 against 0.235 for the reads alone), and PSA_STATS_TMA_COPY (stats_h.py TMA_G,
    # built on the CPU in session 23: the copies through host TMA descriptors instead of per-thread stores; sm_90a
    # with Triton 3.6: 255 registers, no spills, 73,984 bytes of shared memory, three TMA stores). (1) its GPU test
    # (bitwise the per-thread stores, rows past T clipped, a strided head-chunk view, the whole operator); (2) Nsight
    # Compute on _stats_h_kernel at 480p: raster, gathered, gathered with TMA copies (bench/probes/route_ncu.py
    # --stats [--gather]; read with bench/probes/ncu_table.py); (3) switch_ab.py PSA_STATS_TMA_COPY as the node calls
    # Wan2.1-14B (480p, 720p; CuTe), 5 rounds. Prediction: -0.05 to -0.15 ms at 480p if the per-thread stores are
    # what holds the kernel (the profile says whether they are). Rule set now: on if the test passes, the outputs are
    # bitwise equal and the call is faster in >= 4 of 5 rounds at both sizes
    run_tests stats_tma 120 tests/test_triton_gpu.py -k "tma_copies"
    for arm in plain gather gather_tma; do
        flag=""; tma=0
        [ $arm != plain ] && flag="--gather"
        [ $arm = gather_tma ] && tma=1
        PSA_STATS_TMA_COPY=$tma timeout 120 ncu --kernel-name regex:"_stats_h_kernel" --launch-skip 1 --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
            --section SchedulerStats --section MemoryWorkloadAnalysis --csv python bench/probes/route_ncu.py --stats \
            $flag --T 32760 > "$OUT/ncu_stats_$arm.csv" 2> "$OUT/ncu_stats_$arm.err"
        log "ncu stats $arm rc=$? $(wc -l < "$OUT/ncu_stats_$arm.csv") lines"
    done
    python bench/probes/ncu_table.py "$OUT"/ncu_stats_{plain,gather,gather_tma}.csv > "$OUT/ncu_stats.md" 2>&1
    log "switch_ab PSA_STATS_TMA_COPY"
    PROBE_ROUNDS=5 PROBE_BACKENDS=cute PROBE_SHAPES=wan14,wan14_720 timeout -k 10 $((585 - SECONDS)) \
        python bench/probes/switch_ab.py PSA_STATS_TMA_COPY > "$OUT/switch_stats_tma_copy.txt" 2>&1
    log "switch_ab rc=$? $(grep -v RESULT "$OUT/switch_stats_tma_copy.txt" | cut -c1-1500)"
    ;;
A36)  # session 23's last call (carry .carry/cs1; ~2.5 min, the device time left): diagnostic, nothing ships. Where the
    # Morton reorder's cost goes as the node calls Wan2.1-14B with CuTe (run 30: 480p 6.840 raster -> 7.230 ms Morton
    # in the node's layout, +5.7%; 720p +2.6%): bench/probes/morton_breakdown.py, each reorder's call alternated (3
    # rounds), its kernels from torch.profiler, adjacent query blocks' shared fraction; random inputs at 480p and 720p,
    # then DiT-like at 480p. Prediction: the statistics' block-order copies (+~0.25 ms of writes at 480p) and the
    # scatter (~0.16 ms) make most of it; the attention kernel about even on random inputs
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    timeout -k 5 $((150 - SECONDS)) python bench/probes/morton_breakdown.py > "$OUT/morton_random.txt" 2>&1
    log "morton random rc=$? $(grep -v RESULT "$OUT/morton_random.txt" | grep -v kernels: | cut -c1-900)"
    PROBE_INPUTS=ditlike PROBE_SHAPES=wan14 timeout -k 5 $((215 - SECONDS)) python bench/probes/morton_breakdown.py \
        > "$OUT/morton_ditlike.txt" 2>&1
    log "morton ditlike rc=$? $(grep -v RESULT "$OUT/morton_ditlike.txt" | grep -v kernels: | cut -c1-900)"
    ;;
A35)  # session 23's sixth call (carry .carry/cs1; ~3 min, the device time left): A33's table has one slow cell (T 2816
    # d 0.2: 0.298 ms graphed, where A32 measured 0.157-0.180 three times) that moves the node's break-even at d 0.2
    # from ~3.1K to ~4.0K tokens; bench/pieces.py --breakeven now takes each cell's median of 3 alternated rounds:
    # the table again, installed into nodes/
    log "breakeven, 3 rounds"
    timeout -k 5 $((300 - SECONDS)) python bench/pieces.py --out "$OUT/pieces_be" --shapes "" --breakeven \
        --breakeven-rounds 3 --install-breakeven > "$OUT/pieces_be.log" 2>&1
    log "breakeven rc=$?"
    cp nodes/breakeven_h200.json "$OUT/" 2>/dev/null
    ;;
A34)  # session 23's fifth call (carry .carry/cs1; ~2.5 min, the device time left): (1) A33's one failure was the new
    # test's, which held every output (a replay never overwrites an output still held, so its calls ran eagerly;
    # cute ran); it now keeps clones: that test alone; (2) exploratory, nothing ships: the break-even table with
    # PSA_CUDA_GRAPH_MAX_TOKENS=20000, so FLUX.1 at 2048^2 (16896 tokens) goes through the graph cache too (its
    # eager call costs ~0.05-0.25 ms of host time over the GPU's at 9728 tokens)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    run_tests graphed_cute2 100 tests/test_cute_gpu.py -k "graph_cache_replays or auto"
    log "breakeven, graphs up to 20000 tokens"
    PSA_CUDA_GRAPH_MAX_TOKENS=20000 timeout -k 5 $((200 - SECONDS)) python bench/pieces.py --out "$OUT/be_graph20k" \
        --shapes "" --breakeven > "$OUT/be_graph20k.log" 2>&1
    log "breakeven rc=$?"
    ;;
A33)  # session 23's fourth call (carry .carry/cs1; ~3 min): A32 met its rule at every graphed size (cute's graphed
    # median lower in >= 2 of 3 rounds at T 2816-9728, all three densities), so auto takes cute for calls the graph
    # cache replays (dispatch._graphed, PSA_CUTE_MIN_TILES_GRAPHED=0); (1) the CuTe, graph and dispatch GPU tests on
    # it (the new test_auto_takes_cute_for_small_calls_the_graph_cache_replays among them); (2) the break-even table
    # on the new default, installed into nodes/ (prediction: the graphed rows at or below A32's cute arm, the eager
    # rows Triton's as before)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    run_tests graphed_cute 170 tests/test_cute_gpu.py tests/test_graphs_gpu.py tests/test_api_errors.py \
        tests/test_nonfinite.py
    log "breakeven"
    timeout -k 5 100 python bench/pieces.py --out "$OUT/pieces_be" --shapes "" --breakeven --install-breakeven \
        > "$OUT/pieces_be.log" 2>&1
    log "breakeven rc=$?"
    cp nodes/breakeven_h200.json "$OUT/" 2>/dev/null
    ;;
A32)  # session 23's third call (carry .carry/cs1; ~3.5 min): cute vs Triton where the node's calls replay from the
    # CUDA-graph cache. Under backend auto cute skips problems below PSA_CUTE_MIN_TILES=100000 routed tiles for its
    # ~0.13 ms of host-side argument conversion per call, which a graph replay does not pay; at FLUX.1 (26K tiles)
    # A31 replayed cute in 0.268 ms against Triton's 0.287. The break-even table (the node's call, graphed and eager)
    # with the default and with PSA_CUTE_MIN_TILES=0, alternated, 3 rounds each. Rule set now: cute for graphed calls
    # at the sizes where its graphed median is lower in >= 2 of 3 rounds, outputs as the GPU tests check them
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    for r in 1 2 3; do
        for arm in tri cute; do
            mt=100000; [ $arm = cute ] && mt=0
            PSA_CUTE_MIN_TILES=$mt timeout -k 5 100 python bench/pieces.py --out "$OUT/be_${arm}_$r" --shapes "" \
                --breakeven > "$OUT/be_${arm}_$r.log" 2>&1
            log "breakeven $arm round $r rc=$?"
        done
    done
    ;;
C23)  # session 23's second call (carry .carry/cs1; ~9 min): A31 met TMA_STORE_ONE's rule (FLUX.1 replay 0.2933 ->
    # 0.2682 ms, 5 of 5), so it is the default; (1) the forward GPU tests outside the pair kernel's file on it (the
    # one-block kernel's: FLUX.1-sized calls, non-finite inputs, graphs), cut at 150 s; (2) C21 on the new defaults
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    run_tests one_tma 150 tests/test_cute_gpu.py tests/test_nonfinite.py tests/test_graphs_gpu.py
    WEB_TIMEOUT=120 bash "$0" D15
    C15_END=$((585 - SECONDS)) bash "$0" C15
    ;;
C21)  # session 21's last call (carry .carry/cs1; ~6 min): S_AHEAD_VT on (A22) through the node's speed-up curve
    # (D15), the break-even table (C15, installed into nodes/) and the DiT step (E)
    WEB_TIMEOUT=120 bash "$0" D15
    bash "$0" C15
    ;;
A31)  # next session's first call (carry .carry/cs1; ~9 min): (1) every forward GPU test on session 22's default
    # (TMA_STORE on; A30 ran the pair tests on the Morton path, crafted lists and the shared pipeline only), with the
    # one-block kernel's untimed TMA_STORE_ONE test among them; (2) PSA_CUTE_TMA_STORE_ONE at FLUX.1 as the node calls
    # it (switch_ab.py --flux-only: graph replay), 5 rounds. Rule set now: TMA_STORE_ONE on if its tests pass, the
    # outputs are equal and FLUX.1's replayed call is faster in >= 4 of 5 rounds. (3) the pieces on the new default
    # (L's shapes); then C21 (the curve, the break-even table, the DiT step) in the next call
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    run_tests fwd_tma 240 tests/test_cute_pair_gpu.py tests/test_cute_gpu.py tests/test_nonfinite.py \
        tests/test_graphs_gpu.py
    log "switch_ab PSA_CUTE_TMA_STORE_ONE --flux-only"
    PROBE_ROUNDS=5 PROBE_BACKENDS=cute timeout -k 10 90 python bench/probes/switch_ab.py PSA_CUTE_TMA_STORE_ONE \
        --flux-only > "$OUT/switch_tma_store_one.txt" 2>&1
    log "switch_ab rc=$? $(grep -v RESULT "$OUT/switch_tma_store_one.txt" | cut -c1-1500)"
    log "pieces (TMA_STORE on)"
    timeout -k 10 $((585 - SECONDS)) python bench/pieces.py --out "$OUT/pieces_l" --morton --flux-node --ditlike \
        --shapes wan14,wan14_720,flux > "$OUT/pieces_l.log" 2>&1
    log "pieces rc=$?"
    ;;
A30)  # session 22's last call (carry .carry/cs1; ~2 min, the device time left): A29 met its rule, so TMA_STORE is
    # the default; the pair GPU tests that run the Morton path, crafted lists and the shared pipeline on it
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    run_tests tma_default $((125 - SECONDS)) tests/test_cute_pair_gpu.py -k "morton or permutation or crafted or share"
    ;;
A29)  # session 22's seventh call (carry .carry/cs1; ~4 min): PSA_CUTE_TMA_STORE (fwd_pair.py tma_store, built on the
    # CPU after A28: the normalised tile into the consumer's query stage, one UTMASTG per consumer, its smem reads
    # waited for; 168 registers, no spills, 230400 bytes). A28 put the pair kernel's per-element epilogue stores at
    # 0.36 ms (480p) / 0.50 (720p). (1) its GPU tests (bitwise the per-element stores: odd / partial last blocks, both
    # epilogues, the node's [B, L, H, D] output); (2) the kernels alone with it off / on (vt_peel_kernel.py), 5
    # rounds. Prediction: pwt -0.2 to -0.3 ms at 480p, ~-0.3 at 720p. Rule set now: on if faster in >= 4 of 5 rounds
    # at both sizes, bitwise equal, tests green
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    run_tests tma_store 150 tests/test_cute_pair_gpu.py -k "tma_store"
    log "TMA_STORE in the kernels alone"
    PROBE_ROUNDS=5 timeout -k 10 $((590 - SECONDS)) python bench/probes/vt_peel_kernel.py PSA_CUTE_TMA_STORE \
        > "$OUT/tma_store_kernel.txt" 2>&1
    log "tma_store rc=$? $(grep -v RESULT "$OUT/tma_store_kernel.txt" | python bench/probes/ab_brief.py 2>&1 | cut -c1-1500)"
    ;;
A28)  # session 22's sixth call (carry .carry/cs1; ~3 min): what the pair kernel's epilogue stores cost. A27 put the
    # permuted row stores at 0.13 ms (480p) / 0.62 (720p) over the block-order ones; with one CTA per SM nothing
    # overlaps a CTA's epilogue. out_perm_kernel.py with PROBE_NOSTORE=1 adds the kernel writing the caller's
    # [B, T, H, D] layout without the permutation (the node's raster path) and the kernel with its stores skipped
    # (fwd_pair.py probe "nostore", compiled on the CPU: 168 registers, no spills). Diagnostic for an smem-staged
    # epilogue (next session); nothing ships. Prediction: block-order stores ~0.05-0.1 ms at 480p
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    log "out_perm_kernel + nostore"
    PROBE_NOSTORE=1 timeout -k 10 400 python bench/probes/out_perm_kernel.py > "$OUT/epilogue_stores.txt" 2>&1
    log "epilogue_stores rc=$? $(grep -v RESULT "$OUT/epilogue_stores.txt" | cut -c1-3000)"
    ;;
A27)  # session 22's fifth call (carry .carry/cs1; ~2.5 min): A26's whole Morton call moved by ~4% between rounds,
    # replayed or not, around the ~2% PSA_CUTE_PAIR_OUT_PERM should save (its tests passed, maxdiff 0; replayed medians
    # 480p 7.593 -> 7.649, 720p 36.680 -> 36.274, faster in 3 of 5 rounds each: the rule failed on noise). Its two
    # pieces on their own (bench/probes/out_perm_kernel.py): the pair kernel writing block order + the scatter, against
    # the pair kernel writing through the permutation, under one routing, 5 alternated rounds. Prediction: the scatter
    # ~0.16 ms at 480p and ~0.37 at 720p, the kernel's own time within 0.5%. Rule set now: PAIR_OUT_PERM on if the
    # kernel through the permutation beats kernel + scatter in >= 4 of 5 rounds at both sizes with maxdiff 0
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    log "out_perm_kernel"
    timeout -k 10 300 python bench/probes/out_perm_kernel.py > "$OUT/out_perm_kernel.txt" 2>&1
    log "out_perm_kernel rc=$? $(grep -v RESULT "$OUT/out_perm_kernel.txt" | cut -c1-3000)"
    ;;
A26)  # session 22's fourth call (carry .carry/cs1; ~6 min): PSA_CUTE_PAIR_OUT_PERM (fwd_pair.py out_perm, built on the
    # CPU in session 22: the shipped build's sm_90a SASS unchanged but for its parameter offsets; the out_perm build 168
    # registers, no spills, 230400 bytes): on the Morton path the pair kernel writes its output rows through the
    # permutation straight into the caller's layout, so the scatter pass (a read and a write of the output, ~0.16 ms
    # at 480p by arithmetic) goes. Prediction: as the node calls it, 480p 7.40 -> ~7.25 ms, 720p ~0.3 ms less; the
    # peak beyond the output unchanged. Rule set now: on if the replayed call (its GPU time, PROBE_REPLAY) is faster at
    # 480p and at 720p in >= 4 of 5 rounds each, the outputs equal (maxdiff 0) and the GPU tests below pass.
    # (1) the pair kernel's permutation tests and test_cute_gpu.py's Morton tests on the defaults; (2) switch_ab.py
    # PSA_CUTE_PAIR_OUT_PERM with PROBE_REPLAY=1, CuTe, 480p and 720p, 5 rounds
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    run_tests out_perm 260 tests/test_cute_pair_gpu.py tests/test_cute_gpu.py -k "permutation or morton"
    log "switch_ab PSA_CUTE_PAIR_OUT_PERM (replayed too)"
    PROBE_REPLAY=1 PROBE_ROUNDS=5 PROBE_BACKENDS=cute PROBE_SHAPES=wan14,wan14_720 timeout -k 10 $((585 - SECONDS)) \
        python bench/probes/switch_ab.py PSA_CUTE_PAIR_OUT_PERM > "$OUT/switch_pair_out_perm.txt" 2>&1
    log "switch_ab rc=$? $(grep -v RESULT "$OUT/switch_pair_out_perm.txt" | cut -c1-3000)"
    ;;
A25)  # session 22's third call (carry .carry/cs1; ~4 min): two knobs not timed on today's kernels. (1) exact slots
    # 4 -> 3 per consumer on the defaults (S_AHEAD_VT's four virtual stages; A23 had the plain loop 1.5% slower at 5
    # slots than at 4, 2 of 5 rounds), the kernels alone, 5 rounds, pwt and each arm's exact loop (novt -> novt1).
    # Rule set now: 3 slots become the default if pwt is faster in >= 4 of 5 rounds at both sizes with the output
    # bitwise equal. (2) PSA_CUTE_PAIR_Q_PERM as the node calls it (Morton; session 10: +3% at 480p, peak 1.79 ->
    # 1.29x q), 480p and 720p, 3 rounds, with the peak memory: a diagnostic for the Morton target, nothing ships
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    log "exact slots 4 -> 3 (defaults)"
    PROBE_NOVT1=1 PROBE_ROUNDS=5 timeout -k 10 200 python bench/probes/vt_peel_kernel.py PSA_CUTE_STAGES=4/3 \
        > "$OUT/kv3.txt" 2>&1
    log "kv3 rc=$? $(grep -v RESULT "$OUT/kv3.txt" | python bench/probes/ab_brief.py 2>&1 | cut -c1-1500)"
    log "switch_ab PSA_CUTE_PAIR_Q_PERM"
    PROBE_BACKENDS=cute PROBE_SHAPES=wan14,wan14_720 timeout -k 10 $((585 - SECONDS)) \
        python bench/probes/switch_ab.py PSA_CUTE_PAIR_Q_PERM > "$OUT/switch_pair_q_perm.txt" 2>&1
    log "switch_ab rc=$? $(grep -v RESULT "$OUT/switch_pair_q_perm.txt" | cut -c1-1500)"
    ;;
A24)  # session 22's second call (carry .carry/cs1; ~7 min): the routing select's threshold found by interpolation
    # (kernels/triton/select.py _search_interp, PSA_SELECT_INTERP; built on the CPU in session 22: the interpreter's
    # select cases pass with it, bitwise the sorted top-k, NaN / ties / equal rows included; sm_90a: 128 registers at
    # 720p as before, no spills, the search step 146 -> 208 instructions at 1024 + 256 keys, 66 -> 128 at 512) against
    # the bit search. A float64 model of both searches on score rows of these shapes: 20.6 -> 7.7 steps at 480p, 21.5
    # -> 8.0 at 720p (DiT-like 18.9 -> 7.3, 19.6 -> 9.2). Prediction: the select 0.49 -> ~0.33 ms at 720p (routing
    # ~1.00 -> ~0.85), ~0.08 -> ~0.065 at 480p. Rule set now: on if both searches' lists and bias rows are equal on
    # every shape, the routing is faster at 480p and 720p on random and DiT-like inputs in >= 4 of 5 rounds each,
    # FLUX.1's not slower than 2% (medians), and the GPU tests below pass with it. (1) the probe (bench/probes/
    # select_search.py), (2) the Triton, non-finite, graph and API GPU tests with it on, (3) the whole operator as
    # the node calls it (switch_ab.py, CuTe, 480p / 720p / FLUX.1, 3 rounds)
    log "select search: bits vs interp"
    timeout -k 10 240 python bench/probes/select_search.py > "$OUT/select_search.txt" 2>&1
    log "select_search rc=$? $(grep -v RESULT "$OUT/select_search.txt" | cut -c1-3000)"
    PSA_SELECT_INTERP=1 run_tests interp $((470 - SECONDS)) tests/test_triton_gpu.py tests/test_nonfinite.py \
        tests/test_graphs_gpu.py tests/test_api_errors.py
    log "switch_ab PSA_SELECT_INTERP"
    PROBE_BACKENDS=cute PROBE_SHAPES=wan14,wan14_720,flux timeout -k 10 $((585 - SECONDS)) \
        python bench/probes/switch_ab.py PSA_SELECT_INTERP > "$OUT/switch_select_interp.txt" 2>&1
    log "switch_ab rc=$? $(grep -v RESULT "$OUT/switch_select_interp.txt" | cut -c1-1500)"
    ;;
A23)  # next session's first call (carry .carry/cs1; ~7 min): is S_AHEAD's loss the depth of its exact pipeline? A20's
    # split had its tile stream alone (no GEMM, no softmax) at 5.107 ms at 480p against the plain loop's 4.758 (720p
    # 28.24 vs 24.94): each consumer's exact pipeline has four 16 KiB slots, and the S-ahead loop holds three of them at
    # once (K of u, V of u - 1, u - 2), so the producer keeps one tile in flight. Five slots per consumer fit beside two
    # virtual stages (230400 bytes, compiled on the CPU: 168 registers, no spills, S_AHEAD's fenced waits below 34
    # and 35 exponentials with its S GEMM's first instruction above all or all but one of them; with S_AHEAD_VT's
    # four virtual stages they do not fit, 263168 bytes, so these arms turn it off). (1) the plain loops, (2) S_AHEAD, each at 4 -> 5 exact slots
    # with two virtual stages under both arms, 5 rounds, pwt and each arm's exact loop alone (novt -> novt1).
    # Diagnostic, nothing ships from it. Prediction: S_AHEAD's novt ~6.5 -> <= 5.9 ms at 480p (most of its loss
    # gone), the plain loop's within +-2%; pwt slower in both (two virtual stages leave the virtual loop no lookahead).
    # If S_AHEAD at five slots beats the plain loop's novt at four in >= 4 of 5 rounds at both sizes, the next build
    # is a drop-only pair build (no virtual stages: six exact slots fit) with S_AHEAD
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    log "exact slots 4 -> 5, plain loops (two virtual stages, S_AHEAD_VT off)"
    PROBE_BASE=PSA_CUTE_S_AHEAD_VT=0,PSA_CUTE_VT_STAGES=2 PROBE_NOVT1=1 PROBE_ROUNDS=5 timeout -k 10 200 \
        python bench/probes/vt_peel_kernel.py PSA_CUTE_STAGES=4/5 > "$OUT/kv5_plain.txt" 2>&1
    log "kv5_plain rc=$? $(grep -v RESULT "$OUT/kv5_plain.txt" | python bench/probes/ab_brief.py 2>&1 | cut -c1-1500)"
    log "exact slots 4 -> 5, S_AHEAD (two virtual stages)"
    PROBE_BASE=PSA_CUTE_S_AHEAD=1,PSA_CUTE_VT_STAGES=2 PROBE_NOVT1=1 PROBE_ROUNDS=5 timeout -k 10 200 \
        python bench/probes/vt_peel_kernel.py PSA_CUTE_STAGES=4/5 > "$OUT/kv5_s_ahead.txt" 2>&1
    log "kv5_s_ahead rc=$? $(grep -v RESULT "$OUT/kv5_s_ahead.txt" | python bench/probes/ab_brief.py 2>&1 | cut -c1-1500)"
    # the pair tests on the defaults (S_AHEAD_VT on since session 21; its ping-pong, peel and stage-count tests pin
    # it off since then, untested on a GPU in that form)
    run_tests pair_defaults $((580 - SECONDS)) tests/test_cute_pair_gpu.py
    ;;
A20T)  # session 20's second call, right after A20 while the machine is warm (carry .carry/cs1; ~4.5 min): every
    # forward GPU test with all four switches on (A19's took 195 s; the S_AHEAD_VT tests add a few builds); split
    # from A20 since session 20 added S_AHEAD_VT's arms (A19: two arms with drop 109 s, two on the fence 74 s)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    PSA_CUTE_PV_PIN=1 PSA_CUTE_PV_FENCE_VT=1 PSA_CUTE_S_AHEAD=1 PSA_CUTE_S_AHEAD_VT=1 PSA_CUTE_PAIR_DROP=1 \
        run_tests fwd_pin_on $((585 - SECONDS)) \
        tests/test_cute_pair_gpu.py tests/test_cute_gpu.py tests/test_nonfinite.py tests/test_graphs_gpu.py
    ;;
B19)  # session 19, after A19 (carry .carry/cs1; right after A19 so the machine is warm): the shipped defaults (A19's
    # picks set in kernels/cute/switches.py) through every piece (L: 480p, 720p, FLUX.1 as the node calls it, Morton,
    # DiT-like), then the Triton and API GPU tests and the backward tests (session 18's F18 cut them; their host code,
    # session 17's env_switch, last passed them in A17b). END (default 585) bounds the call
    END=${B19_END:-585}
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: pieces runs Triton only"
    log "pieces (A19's defaults)"
    timeout $((END * 55 / 100)) python bench/pieces.py --out "$OUT/pieces_l" --morton --flux-node --ditlike \
        --shapes wan14,wan14_720,flux > "$OUT/pieces_l.log" 2>&1
    log "pieces rc=$?"
    run_tests triton $((END * 78 / 100 - SECONDS)) tests/test_triton_gpu.py tests/test_api_errors.py
    log "pytest backward"
    timeout $((END - SECONDS)) python -m pytest -q -p no:cacheprovider -n 2 -m gpu tests/test_backward_gpu.py \
        > "$OUT/tests_bwd.log" 2>&1
    log "pytest backward rc=$? $(tail -1 "$OUT/tests_bwd.log")"
    ;;
A19)  # next session's first call (carry .carry/cs1; ~8 min): session 18's CPU builds, all off, all scheduling only
    # (equal outputs): PSA_CUTE_PV_FENCE (a CTA fence keeps ptxas from hoisting the P V wait above the softmax: the
    # sm_90a SASS of both kernels has the WARPGROUP.DEPBAR before the first MUFU.EX2 without it, after the last one
    # with it), PSA_CUTE_PV_FENCE_VT (the same in the pair kernel's virtual tiles), PSA_CUTE_S_AHEAD (the S GEMM one
    # tile ahead of the softmax). (1) the split (pair_split.py) with the fence: do the GEMMs and the softmax now
    # overlap (session 18 without it, 480p: stream 4.75, + GEMMs 4.87, + softmax 4.76, + both 5.82)? (2) each switch
    # against the default in the kernels alone, pwt and drop, 480p and 720p, 5 rounds; then the vt fence and S_AHEAD
    # on top of the fence; (3) their GPU tests, every forward GPU test with all three on. Rules set now: PV_FENCE on
    # if the pwt medians are faster at 480p and 720p in >= 4 of 5 rounds each and the drop medians are not slower
    # by more than 0.5%; PV_FENCE_VT and S_AHEAD each on top of the chosen build on the same rule; outputs equal
    # (max diff 0) and every GPU test passing. Prediction: with the overlap back, the exact part (novt) 5.8 ->
    # ~5.1-5.3 ms at 480p (the stream, 4.75, is the floor), pwt 6.8 -> ~6.1-6.3; S_AHEAD no gain (its SASS has the
    # wait hoisted above the exponentials even with the fence). If PV_FENCE wins, follow with L, C15 / E (the
    # break-even table, the DiT step) and the README's numbers
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    log "pair split with the P V fence"
    PSA_CUTE_PV_FENCE=1 PSA_CUTE_PV_FENCE_VT=1 PROBE_ROUNDS=2 timeout -k 10 130 python bench/probes/pair_split.py \
        > "$OUT/pair_split_fence.txt" 2>&1
    log "pair_split_fence rc=$? $(grep -v RESULT "$OUT/pair_split_fence.txt" | cut -c1-1500)"
    log "fences and S ahead, kernels alone"
    PROBE_DROP=1 PROBE_ROUNDS=5 timeout -k 10 200 python bench/probes/vt_peel_kernel.py PSA_CUTE_PV_FENCE \
        PSA_CUTE_S_AHEAD > "$OUT/sched_kernel.txt" 2>&1
    log "sched rc=$? $(grep -v RESULT "$OUT/sched_kernel.txt" | python bench/probes/ab_brief.py 2>&1 | cut -c1-2500)"
    PROBE_BASE=PSA_CUTE_PV_FENCE=1 PROBE_ROUNDS=5 timeout -k 10 150 python bench/probes/vt_peel_kernel.py \
        PSA_CUTE_PV_FENCE_VT PSA_CUTE_S_AHEAD > "$OUT/sched_on_fence.txt" 2>&1
    log "sched_on_fence rc=$? $(grep -v RESULT "$OUT/sched_on_fence.txt" | python bench/probes/ab_brief.py 2>&1 | cut -c1-2000)"
    PSA_CUTE_PV_FENCE=1 PSA_CUTE_PV_FENCE_VT=1 PSA_CUTE_S_AHEAD=1 run_tests fwd_sched_on $((585 - SECONDS)) \
        tests/test_cute_pair_gpu.py tests/test_cute_gpu.py tests/test_nonfinite.py tests/test_graphs_gpu.py
    ;;
F18)  # session 18, last call (carry .carry/cs1): the pair kernel with one part removed at a time (bench/probes/
    # pair_split.py: no GEMMs, no softmax, neither = the tile stream alone; with and without the virtual tiles) at
    # 480p and 720p; then the Triton and API GPU tests and the backward tests (session 17's env_switch, host code,
    # not yet run on a GPU). Diagnostic only: no default rides on it
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: no split"
    # (two calls were taken back before they finished; with ~400 s of device time left the call ends by END s:
    # the split at both sizes, the Triton tests in what is left, the backward tests only if END allows)
    END=${F18_END:-585}
    log "pair split"
    PROBE_ROUNDS=${PROBE_ROUNDS:-3} timeout -k 10 $((END * 45 / 100)) python bench/probes/pair_split.py \
        > "$OUT/pair_split.txt" 2>&1
    log "pair_split rc=$? $(grep -v RESULT "$OUT/pair_split.txt" | cut -c1-1500)"
    run_tests triton $((END * 70 / 100 - SECONDS)) tests/test_triton_gpu.py tests/test_api_errors.py
    if [ $((END - SECONDS)) -gt 150 ]; then
        log "pytest backward"
        timeout $((END - SECONDS)) python -m pytest -q -p no:cacheprovider -n 2 -m gpu tests/test_backward_gpu.py \
            > "$OUT/tests_bwd.log" 2>&1
        log "pytest backward rc=$? $(tail -1 "$OUT/tests_bwd.log")"
    fi
    ;;
T18)  # session 18, third call (carry .carry/cs1): the pairwise row max / row sum (PSA_CUTE_TREE_MAX, PSA_CUTE_TREE_SUM;
    # P18's per-instruction sampling: after their own GEMM waits the consumers wait on the chained FMNMX / FADD) in
    # the kernels alone, pwt (pair kernel) and drop (one-block kernel) at 480p and 720p, 5 alternated rounds; then
    # the tree sum on top of the tree max; then their GPU tests and every forward GPU test with both on. Rules set
    # now: TREE_MAX on if its outputs are equal (max diff 0, pwt and drop) and its pwt median is faster at 480p and
    # 720p with the drop medians not slower by more than 0.5%; TREE_SUM on top of it on the same rule (outputs within
    # the tests' rounding bound instead of equal), with every GPU test passing
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    log "tree max / tree sum, kernels alone"
    PROBE_DROP=1 PROBE_ROUNDS=5 timeout -k 10 200 python bench/probes/vt_peel_kernel.py PSA_CUTE_TREE_MAX \
        PSA_CUTE_TREE_SUM > "$OUT/tree_kernel.txt" 2>&1
    log "tree rc=$? $(grep -v RESULT "$OUT/tree_kernel.txt" | python bench/probes/ab_brief.py 2>&1 | cut -c1-2500)"
    log "tree sum on top of the tree max"
    PROBE_BASE=PSA_CUTE_TREE_MAX=1 PROBE_DROP=1 PROBE_ROUNDS=5 timeout -k 10 120 python bench/probes/vt_peel_kernel.py \
        PSA_CUTE_TREE_SUM > "$OUT/tree_sum_on_max.txt" 2>&1
    log "tree_sum_on_max rc=$? $(grep -v RESULT "$OUT/tree_sum_on_max.txt" | python bench/probes/ab_brief.py 2>&1 | cut -c1-1500)"
    run_tests tree $((330 - SECONDS)) tests/test_cute_pair_gpu.py -k tree
    PSA_CUTE_TREE_MAX=1 PSA_CUTE_TREE_SUM=1 run_tests fwd_tree_on $((575 - SECONDS)) tests/test_cute_gpu.py \
        tests/test_cute_pair_gpu.py tests/test_nonfinite.py tests/test_graphs_gpu.py
    ;;
P18)  # session 18, second call (carry .carry/cs1): Nsight Compute's per-instruction stall sampling (SourceCounters)
    # on the pair kernel (pwt 480p and 720p, pwt without virtual tiles) and the one-block drop kernel at 480p, read by
    # bench/probes/ncu_sass.py: which instructions the warps wait on (A18's ratios mix producer and consumer warps);
    # then the pair-kernel and CUDA-graph GPU tests (the q_perm key-index fix and the graph key of session 17, not
    # yet run on a GPU)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    for run in pwt novt drop pwt720; do
        var=${run%720}; T=32760; [ "$run" = pwt720 ] && T=75600
        log "ncu source $run"
        timeout 100 ncu --kernel-name regex:cutlass --launch-skip 1 --launch-count 1 --section SourceCounters \
            --section WarpStateStats --import-source no -f -o "$OUT/sass_$run" \
            python bench/probes/virtual_ncu.py $var --calls 1 --T $T > "$OUT/sass_$run.err" 2>&1
        ncu -i "$OUT/sass_$run.ncu-rep" --page source --csv --print-source sass > "$OUT/sass_$run.csv" 2>> "$OUT/sass_$run.err"
        python bench/probes/ncu_sass.py "$OUT/sass_$run.csv" --top 40 > "$OUT/sass_$run.txt" 2>&1
        log "ncu source $run rc=$? $(sed -n 1,12p "$OUT/sass_$run.txt" | cut -c1-300 | tr '\n' ' ')"
    done
    (cd "$OUT" && rm -f sass_*.ncu-rep; tar czf sass_csv.tgz sass_*.csv sass_*.err && rm -f sass_*.csv sass_*.err)
    run_tests pair_graphs $((570 - SECONDS)) tests/test_cute_pair_gpu.py tests/test_graphs_gpu.py
    ;;
A18)  # next session's first call (carry .carry/cs1; ~6 min): (1) the ping-pong consumers and the CuTe peel at 720p in
    # the kernel alone, 5 alternated rounds (720p's rounds spread 0.4%, 480p's 3%: session 17 timed ping-pong at 480p
    # only); (2) Nsight Compute's stall reasons per issued instruction on the pair kernel (pwt, pwt without virtual
    # tiles) and the one-block drop kernel at 480p: what the exact part waits on (gmma, long scoreboard, barrier,
    # wait...; session 17's sections said latency-bound without the breakdown); (3) the Morton budget at 480p on the
    # Triton backend, 1 against 0.75 x q, raster as the yardstick (B16's open question: Triton peaks at 1.24x q there,
    # the target is <= 1x; session 10 measured 1.29x -> 0.93x for +1.8%). Rules set now: PINGPONG / VT_PEEL on if
    # faster at 720p in at least 4 of 5 rounds and in the median; Triton's 480p budget to 0.75 if its peak is <= 1x q
    # and its median time within 3% of raster's
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: Triton only"
    log "pingpong + peel at 720p"
    PROBE_T=75600 PROBE_ROUNDS=5 timeout -k 10 150 python bench/probes/vt_peel_kernel.py PSA_CUTE_PINGPONG \
        PSA_CUTE_VT_PEEL > "$OUT/pingpong_peel_720p.txt" 2>&1
    log "pingpong_peel_720p rc=$? $(grep -v RESULT "$OUT/pingpong_peel_720p.txt" | cut -c1-1500)"
    M=gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
    for r in barrier branch_resolving dispatch_stall drain gmma imc_miss lg_throttle long_scoreboard \
             math_pipe_throttle membar mio_throttle misc no_instruction not_selected selected short_scoreboard \
             sleeping tex_throttle wait; do
        M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
    done
    for var in pwt novt drop; do
        log "ncu stalls $var"
        timeout 90 ncu --kernel-name regex:cutlass --launch-skip 1 --launch-count 1 --metrics "$M" --csv \
            python bench/probes/virtual_ncu.py $var --calls 1 > "$OUT/ncu_stalls_$var.csv" 2> "$OUT/ncu_stalls_$var.err"
        log "ncu stalls $var rc=$? $(grep -c stalled "$OUT/ncu_stalls_$var.csv") metrics"
    done
    python bench/probes/ncu_table.py "$OUT"/ncu_stalls_{pwt,novt,drop}.csv > "$OUT/ncu_stalls_table.md" 2>&1
    log "ncu stalls table: $(head -14 "$OUT/ncu_stalls_table.md" | tr '\n' ' ' | cut -c1-1800)"
    log "Triton Morton budget 1 vs 0.75 at 480p"
    PROBE_BACKENDS=triton PROBE_RASTER=1 PROBE_ROUNDS=3 timeout -k 10 150 python bench/probes/cute_out_perm.py \
        PSA_MORTON_SCRATCH 1 0.75 > "$OUT/triton_morton_budget.txt" 2>&1
    log "triton_morton_budget rc=$? $(tail -1 "$OUT/triton_morton_budget.txt" | cut -c1-1500)"
    ;;
T)  # the CuTe GPU tests with the stashed picks (after N, when N had no time left for them)
    run_tests cute 300 tests/test_cute_gpu.py tests/test_nonfinite.py tests/test_graphs_gpu.py
    ;;
L)  # every piece at 480p, 720p and FLUX.1 with the session-7 defaults, both backends, Morton, FLUX as
    # the node calls it
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: pieces runs Triton only"
    log "pieces (current defaults and picks)"
    timeout ${PIECES_TIMEOUT:-400} python bench/pieces.py --out "$OUT/pieces_l" --morton --flux-node --ditlike \
        --shapes wan14,wan14_720,flux > "$OUT/pieces_l.log" 2>&1
    log "pieces rc=$?"
    ;;
*)
    echo "unknown phase $PHASE"; exit 2 ;;
esac
log "done"

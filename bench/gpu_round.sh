# H200 device calls, one phase per call, run from the repository root with the cutlass-dsl site and ComfyUI's comfy/
# files carried in one archive (bench/install_cute_site.sh unpacks it):
#   carry [".carry/cs1"]    command: bash bench/gpu_round.sh PHASE
# Pending phases, in the order to run them (each header gives what it measures, the prediction and the rule for
# turning a switch on, all written before timing; `decide` logs bench/probes/rule_check.py's DECISION line for it):
# B39, E39, CH39 (C39's node A/B and decision, then H39: one call), G39, D39, L; F (every forward test) with the
# switches the rules turned on, all together. Next session's 30 minutes of device
# time (a machine's start included) hold three calls of up to 10 minutes: B39, E39, CH39 (session 28's order: the
# statistics' default first, since G39 and D39 build on it; then the three kernel builds, which bear on the virtual
# and exact parts, the operator's largest; C39's pieces run (L) waits). Reusable phases: L (every piece at 480p,
# 720p and FLUX.1: bench/pieces.py), E (the DiT step: bench/dit_step.py), C15 (the break-even table, installed into
# nodes/, then E), D15 (the node's speed-up curve for web/js/speedup_h200.json), C21 (D15, then C15), T (the CuTe GPU
# tests). The phases of sessions 2-26 (all run; their results and decisions are in bench/results/pieces_h200.md) are
# in git history: `git show 24921c1:bench/gpu_round.sh`.
# Tests run in 4 pytest-xdist workers (PSA_XDIST; the image has pytest-xdist): they are bound by compiles. Every result
# lands under $OUT; a step that runs past its timeout is cut and the next one still runs.
set -u
PHASE=${1:?usage: bash bench/gpu_round.sh PHASE (see above)}
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
log() { echo "[gpu_round $PHASE $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/round.log"; }
run_tests() {  # name, timeout, pytest args...
    local name=$1 t=$2; shift 2
    if [ "$t" -lt 30 ]; then log "pytest $name skipped: ${t} s left in the call"; return; fi  # (timeout 0: none)
    log "pytest $name"
    timeout "$t" python -m pytest -q -p no:cacheprovider -n "${PSA_XDIST:-4}" -m gpu "$@" > "$OUT/tests_$name.log" 2>&1
    log "pytest $name rc=$? $(tail -1 "$OUT/tests_$name.log")"
}
decide() {  # NAME PROBE_OUTPUT [rule_check.py options]: the header's rule applied, its DECISION line logged
    log "$(python bench/probes/rule_check.py "$@" 2>&1 | tr '\n' ' ' | cut -c1-1800)"
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
    # with PSA_STATS_GLUON=1 (L). Rule (B39's): on by default if B39's tests pass and no shape's median is slower;
    # session 27 (before any timing) allows 1% per row for the rounds' spread: FLUX.1's statistics are even by design
    # (A39: 0.038 -> 0.038 ms) and eight rows of noise would otherwise decide it
    PROBE_ROUNDS=5 timeout -k 10 200 python bench/probes/switch_ab.py PSA_STATS_GLUON > "$OUT/switch_stats_gl.txt" 2>&1
    log "switch_ab rc=$? $(grep -v RESULT "$OUT/switch_stats_gl.txt" | cut -c1-2500)"
    decide PSA_STATS_GLUON "$OUT/switch_stats_gl.txt" --rows "" --max-ratio 1.01
    [ -n "${C39_NO_PIECES:-}" ] || PSA_STATS_GLUON=1 PIECES_TIMEOUT=$((560 - SECONDS)) bash bench/gpu_round.sh L
    ;;
CH39)  # (carry .carry/cs1; ~9 min) C39 without its pieces run, then H39 in what is left of the call (each phase's
    # header gives its prediction and rule)
    C39_NO_PIECES=1 bash "$0" C39
    H39_END=$((585 - SECONDS)) bash "$0" H39
    ;;
G39)  # (carry .carry/cs1; ~5 min; after B39 has run the forward suite with the Gluon statistics) PSA_MORTON_ROLL again,
    # with PSA_STATS_GLUON=1 under both arms: the Morton memory target (<= 1x q above the output) against its time
    # (<= +3%). Session 17 found the roll at 0.86x q but +4.9% at 480p (3 head chunks against 2, one chunk reading q
    # through the permutation), -0.7% at 720p. The Gluon gather statistics take each chunk's statistics and copies from
    # ~0.6 to ~0.5 ms at 480p (untimed: B39), which shrinks what a third chunk costs. Prediction: 480p +2.5-4%, 720p
    # about even, peaks 0.86x / 0.67x q. Rule set now: PSA_MORTON_ROLL on by default if B39 turned the Gluon statistics
    # on, the roll's tests pass with it, and the medians of 5 rounds are within +3% at both sizes (CuTe, the node's
    # call) with the peak under 1x q
    PSA_STATS_GLUON=1 PSA_MORTON_ROLL=1 timeout -k 10 150 python -m pytest -q -p no:cacheprovider -m gpu \
        tests/test_cute_gpu.py tests/test_cute_pair_gpu.py -k "morton" > "$OUT/tests_roll_gluon.log" 2>&1
    log "pytest roll + gluon rc=$? $(tail -1 "$OUT/tests_roll_gluon.log")"
    PSA_STATS_GLUON=1 PROBE_ROUNDS=5 PROBE_BACKENDS=cute PROBE_SHAPES=wan14,wan14_720 timeout -k 10 300 \
        python bench/probes/switch_ab.py PSA_MORTON_ROLL > "$OUT/switch_roll_gluon.txt" 2>&1
    log "roll A/B rc=$? $(grep -v RESULT "$OUT/switch_roll_gluon.txt" | cut -c1-2000)"
    decide PSA_MORTON_ROLL "$OUT/switch_roll_gluon.txt" --rows "" --max-ratio 1.03 --peak-below 1.0 \
        --tests "$OUT/tests_roll_gluon.log"
    ;;
H39)  # (carry .carry/cs1; ~7 min) PSA_ROUTE_GLUON (kernels/triton/route_gl.py, session 27, built on the CPU, never run on a
    # GPU): the routing scores as a Gluon kernel, one program per query block's row of 64 x 64 tiles, the query-side
    # bfloat16 parts split once and kept in shared memory, the three products per dot on wgmma, the next tile's loads
    # under them; sm_90a 248 registers, no spills, 96 KiB (two programs per SM), 2,082 SASS instructions per tile
    # against the Triton kernel's 3,632 per program (one tile each, both splits). Session 25 found the Triton scores
    # kernel latency-bound at 0.49-0.53 ms of route()'s 0.98-1.07 at 720p (its work ~0.15 ms of tensor time, 0.08 of
    # stores). (1) its GPU tests (scores within 1e-5 of the row's spread, H-bar bitwise, lists equal up to ties);
    # (2) route_switch.py PSA_ROUTE_GLUON (route() and the scores alone, 5 alternated rounds, 720p / 480p / FLUX.1);
    # (3) the Triton and non-finite forward GPU tests with it on. From 256 KV blocks on (route_gl.MIN_BLOCKS; FLUX.1
    # keeps the Triton kernel). Prediction: the scores at 720p 0.49-0.53 -> 0.20-0.28
    # ms, route() -> 0.70-0.80; 480p 0.18 -> 0.14-0.16; FLUX.1 unchanged (the same kernel). Rule set now: on if
    # its tests and the forward tests pass, route() is faster in >= 4 of 5 rounds at 480p and 720p, and FLUX.1's median
    # is at most 1% slower
    # (H39_END: the seconds left to it when CH39 runs it nested; a nested call's SECONDS starts at 0)
    END=${H39_END:-560}
    timeout -k 10 $((END > 450 ? 200 : 120)) python -m pytest -q -p no:cacheprovider -m gpu tests/test_route_gl_gpu.py \
        > "$OUT/tests_route_gl.log" 2>&1
    log "pytest route_gl rc=$? $(tail -1 "$OUT/tests_route_gl.log")"
    grep -B3 -A30 "^E  " "$OUT/tests_route_gl.log" | head -60 >> "$OUT/round.log"
    PROBE_ROUNDS=5 timeout -k 10 $((END > 450 ? 200 : 150)) python bench/probes/route_switch.py PSA_ROUTE_GLUON \
        > "$OUT/route_gl_ab.txt" 2>&1
    log "route_gl A/B rc=$? $(grep -v RESULT "$OUT/route_gl_ab.txt" | cut -c1-2500)"
    decide PSA_ROUTE_GLUON "$OUT/route_gl_ab.txt" --rows wan14 --faster-rounds 4 --tests "$OUT/tests_route_gl.log"
    decide PSA_ROUTE_GLUON "$OUT/route_gl_ab.txt" --rows flux --max-ratio 1.01
    PSA_ROUTE_GLUON=1 run_tests fwd_route_gl $((END - SECONDS)) tests/test_triton_gpu.py tests/test_nonfinite.py
    grep -B3 -A25 "^E  " "$OUT/tests_fwd_route_gl.log" | head -60 >> "$OUT/round.log"
    ;;
E39)  # (carry .carry/cs1; ~9 min) three softmax / virtual-loop builds made on the CPU, all off, untimed: PSA_CUTE_BIAS_SLACK
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
    # it where the slack goes on). (3) PSA_CUTE_LAZY_RESCALE (session 27: the online softmax keeps a row's reference
    # max until a tile's exceeds it by more than 8 in log2 units, so the output's rescale, 32 multiplies per thread and
    # row behind a branch that a warp takes in about half its exact tiles on random inputs, is skipped almost always;
    # both kernels, 168 / 128 registers, no spills; not bitwise), with the one-block drop kernel (PROBE_DROP).
    # Prediction: the exact part (novt) and drop 1-3% faster, the virtual part unchanged. Rule set now: on if its tests
    # pass and pwt is faster in >= 6 of 7 rounds at both sizes with novt not slower (median)
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || { log "cutlass-dsl not importable"; exit 1; }
    timeout -k 10 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_cute_pair_gpu.py \
        -k "bias_loads_unclamped or vt_full or tma_store or lazy" > "$OUT/tests_vt_builds.log" 2>&1
    log "pytest bias_slack / vt_full / lazy rc=$? $(tail -1 "$OUT/tests_vt_builds.log")"
    grep -B3 -A25 "^E  " "$OUT/tests_vt_builds.log" | head -60 >> "$OUT/round.log"
    PROBE_ROUNDS=7 PROBE_NOVT1=1 timeout -k 10 200 python bench/probes/vt_peel_kernel.py PSA_CUTE_BIAS_SLACK \
        PSA_CUTE_VT_FULL > "$OUT/vt_builds_kernel.txt" 2>&1
    log "vt builds rc=$? $(grep -v RESULT "$OUT/vt_builds_kernel.txt" | python bench/probes/ab_brief.py 2>&1 | cut -c1-1500)"
    T="$OUT/tests_vt_builds.log"
    decide PSA_CUTE_BIAS_SLACK "$OUT/vt_builds_kernel.txt" --faster-rounds 6 --bitwise --tests "$T" --tests-k unclamped
    decide PSA_CUTE_VT_FULL "$OUT/vt_builds_kernel.txt" --faster-rounds 6 --tests "$T" --tests-k vt_full
    PROBE_ROUNDS=7 PROBE_NOVT1=1 PROBE_BASE="PSA_CUTE_BIAS_SLACK=1" timeout -k 10 150 python \
        bench/probes/vt_peel_kernel.py PSA_CUTE_VT_FULL > "$OUT/vt_full_on_slack_kernel.txt" 2>&1
    log "vt_full on slack rc=$? $(grep -v RESULT "$OUT/vt_full_on_slack_kernel.txt" | python bench/probes/ab_brief.py 2>&1 | cut -c1-1500)"
    decide PSA_CUTE_VT_FULL "$OUT/vt_full_on_slack_kernel.txt" --faster-rounds 6 --tests "$T" --tests-k vt_full
    PROBE_ROUNDS=7 PROBE_NOVT1=1 PROBE_DROP=1 timeout -k 10 180 python bench/probes/vt_peel_kernel.py \
        PSA_CUTE_LAZY_RESCALE > "$OUT/lazy_kernel.txt" 2>&1
    log "lazy rc=$? $(grep -v RESULT "$OUT/lazy_kernel.txt" | python bench/probes/ab_brief.py 2>&1 | cut -c1-1500)"
    decide PSA_CUTE_LAZY_RESCALE "$OUT/lazy_kernel.txt" --faster-rounds 6 --novt-not-slower --tests "$T" --tests-k lazy
    ;;
D39)  # after C39 (carry .carry/cs1; ~8 min): the backward GPU tests with PSA_STATS_GLUON=1 (training reads the same
    # statistics; 2 workers, as that file needs), then the DiT step (E) with it
    PSA_STATS_GLUON=1 PSA_XDIST=2 run_tests bwd_gluon 330 tests/test_backward_gpu.py
    grep -B3 -A25 "^E  " "$OUT/tests_bwd_gluon.log" | head -60 >> "$OUT/round.log"
    PSA_STATS_GLUON=1 DIT_TIMEOUT=$((570 - SECONDS)) bash bench/gpu_round.sh E
    ;;
C21)  # session 21's last call (carry .carry/cs1; ~6 min): S_AHEAD_VT on (A22) through the node's speed-up curve
    # (D15), the break-even table (C15, installed into nodes/) and the DiT step (E)
    WEB_TIMEOUT=120 bash "$0" D15
    bash "$0" C15
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
E)
    COMFY=.carry/comfy
    if [ -f .carry/cs1/comfy_py.tar.xz ]; then  # comfy/'s .py files (0.4 MB) beside the site in one carry
        mkdir -p /tmp/comfy_py && tar xf .carry/cs1/comfy_py.tar.xz -C /tmp/comfy_py && COMFY=/tmp/comfy_py
    fi
    log "dit_step ($COMFY)"
    timeout ${DIT_TIMEOUT:-560} python bench/dit_step.py --comfy "$COMFY" --out "$OUT/dit" --repeats 2 --profile > "$OUT/dit.log" 2>&1
    log "dit_step rc=$?"
    ;;
L)  # every piece at 480p, 720p and FLUX.1 with the session-7 defaults, both backends, Morton, FLUX as
    # the node calls it
    python -c "import cutlass.cute" 2>> "$OUT/round.log" || log "cutlass-dsl not importable: pieces runs Triton only"
    log "pieces (current defaults and picks)"
    timeout ${PIECES_TIMEOUT:-400} python bench/pieces.py --out "$OUT/pieces_l" --morton --flux-node --ditlike \
        --shapes wan14,wan14_720,flux > "$OUT/pieces_l.log" 2>&1
    log "pieces rc=$?"
    ;;
F)  # every forward GPU test (B39's set) under the caller's environment: after defaults flip on several phases' rules,
    # once with all of them on together (e.g. `PSA_CUTE_VT_FULL=1 PSA_CUTE_LAZY_RESCALE=1 bash bench/gpu_round.sh F`
    # before the flips are committed), since each phase timed and tested its switch alone
    env | grep -E "^PSA_" | sort | tr '\n' ' ' | sed 's/^/switches: /' >> "$OUT/round.log"; echo >> "$OUT/round.log"
    run_tests fwd_all $((570 - SECONDS)) tests/test_triton_gpu.py tests/test_cute_gpu.py tests/test_cute_pair_gpu.py \
        tests/test_nonfinite.py tests/test_graphs_gpu.py tests/test_api_errors.py
    grep -B3 -A25 "^E  " "$OUT/tests_fwd_all.log" | head -80 >> "$OUT/round.log"
    ;;
T)  # the CuTe GPU tests with the stashed picks (after N, when N had no time left for them)
    run_tests cute 300 tests/test_cute_gpu.py tests/test_nonfinite.py tests/test_graphs_gpu.py
    ;;
*)
    echo "unknown phase $PHASE"; exit 2 ;;esac
log "done"


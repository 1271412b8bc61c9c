# H200 device calls, one phase per call, run from the repository root with the cutlass-dsl site and ComfyUI's comfy/
# files carried in one archive (bench/install_cute_site.sh unpacks it):
#   carry [".carry/cs1"]    command: bash bench/gpu_round.sh PHASE
# Pending, in this order: F on the defaults (every forward GPU test; session 29 removed two switch-gated CuTe builds
# after its last GPU call, with the shipped builds' sm_90a SASS byte-identical, and no machine could be started after),
# then U30 (session 30's split-order shared exact pipeline, built without a GPU), then, if U30's rule holds,
# `PSA_CUTE_PAIR_SHARE=1 bash bench/gpu_round.sh F` before the flip is committed; Q30 and M30 with any time left.
# Session 29
# ran B39, E39, CH39 (C39 + H39), G39, D39 and L (results and decisions in
# bench/results/pieces_h200.md; those phases are in git history: `git show d1b661c:bench/gpu_round.sh`). A new build
# gets a phase here with its prediction and on/off rule written before timing; `decide` logs
# bench/probes/rule_check.py's DECISION line for it. Reusable phases: L (every piece at 480p, 720p and FLUX.1:
# bench/pieces.py), E (the DiT step: bench/dit_step.py), C15 (the break-even table, installed into nodes/, then E),
# D15 (the node's speed-up curve for web/js/speedup_h200.json), C21 (D15, then C15), F (every forward GPU test under
# the caller's PSA_ switches), T (the CuTe GPU tests). The phases of sessions 2-26 are in `git show
# 24921c1:bench/gpu_round.sh`. A machine's start costs ~1.5 of the session's 30 device minutes, and so does a start
# that fails (session 29: three refused starts took 270 s); one call runs <= 10 minutes.
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
U30)  # session 30 (carry .carry/cs1; ~8-9 min): the pair kernel's shared exact pipeline in split order (PSA_CUTE_PAIR_SHARE,
    # fwd_pair.py / pair_sched._produce_split: the blocks both lists hold first, then the two lists' own blocks
    # alternating; 0 or 1 passed tiles before each own one by arithmetic; the shipped virtual loop kept), built and
    # compiled on the CPU only (sm_90a: 168 registers, no spills, 232,448 bytes of shared memory; the protocol model
    # tests pass). Steps: its crafted-list tests as a smoke run (the phase stops if they fail or hang), then its other
    # GPU tests (every share test of test_cute_pair_gpu.py: against the per-list pipelines
    # within SHARE_TOL and the float64 reference); the exact part alone (novt) and pwt, per list vs shared, with clocks
    # and power (bench/probes/split_clocks.py), on DiT-like Morton inputs at 480p and on random ones, each in both build
    # orders; the node's call on random inputs at 480p and 720p (switch_ab.py, 3 rounds, CuTe).
    # PREDICTION (written before timing): DiT-like novt 5.2-5.3 -> 4.7-5.0 ms (-5 to -11%) at a higher clock, its cycles
    # within +-5% of the per-list build's (the pacing model, union_pacing_s30_cpu.txt: 111 K vs 114 K at C = 1700);
    # DiT-like pwt -4 to -9%; random novt 0 to -4% (~12% of tiles shared); the node's random call within +-1%.
    # RULE: PAIR_SHARE on by default if every share test passes, DiT-like novt and pwt are >= 3% faster in both orders,
    # random novt and pwt are not slower than 1% in either order, and switch_ab's 480p and 720p medians are not slower than 1%;
    # then F with PSA_CUTE_PAIR_SHARE=1 before the flip is committed. Else it stays off (and the numbers say which part
    # of the prediction failed).
    # first the crafted-list smoke tests (session 9's first shared build hung): a failure or hang ends the phase here
    run_tests share_smoke 150 -x tests/test_cute_pair_gpu.py -k "shared_exact_tiles_crafted"
    smoke=$(tail -1 "$OUT/tests_share_smoke.log" 2>/dev/null)
    if [[ "$smoke" != *passed* || "$smoke" == *failed* || "$smoke" == *error* ]]; then
        log "U30 stops: the crafted-list smoke tests did not pass (tests_share_smoke.log)"; exit 1
    fi
    run_tests share 200 tests/test_cute_pair_gpu.py -k "share and not crafted"
    for inp in ditlike random; do  # both orders in one process (one compile of each build): "build#2" is the second
        log "split_clocks $inp"
        PROBE_INPUTS=$inp PROBE_BUILDS="novt,share:novt,pwt,share:pwt,share:novt,novt,share:pwt,pwt" PROBE_SECONDS=2 \
            timeout 150 python bench/probes/split_clocks.py > "$OUT/share_clocks_$inp.txt" 2>&1
        log "split_clocks rc=$? $(grep -c '^32760 ' "$OUT/share_clocks_$inp.txt") rows"
    done
    log "switch_ab PSA_CUTE_PAIR_SHARE"
    PROBE_BACKENDS=cute PROBE_SHAPES=wan14,wan14_720 timeout $((575 - SECONDS)) python bench/probes/switch_ab.py \
        PSA_CUTE_PAIR_SHARE > "$OUT/share_ab.txt" 2>&1
    log "switch_ab rc=$?"
    # the rule in three parts (all three must say on): DiT-like, random, the node's call with the tests
    decide PSA_CUTE_PAIR_SHARE "$OUT/share_clocks_ditlike.txt" --clocks 0.97
    decide PSA_CUTE_PAIR_SHARE "$OUT/share_clocks_random.txt" --clocks 1.01
    decide PSA_CUTE_PAIR_SHARE "$OUT/share_ab.txt" --rows _cute --max-ratio 1.01 --tests "$OUT/tests_share.log"
    ;;
Q30)  # session 30 (carry .carry/cs1; ~3 min), for time left after U30: PSA_CUTE_PAIR_Q_PERM again (the pair kernel
    # reads the caller's query rows through the Morton permutation: no q copy in the node's call). Session 10 measured
    # it +3% at 480p and -0.3% at 720p, peak 1.79x -> 1.29x q; the statistics, the output path and the pair kernel
    # have all changed since. PREDICTION: 480p +1 to +3%, 720p within +-1%, peak 1.74x -> ~1.25x q at 480p.
    # RULE: on by default if its tests pass and the node's call is not slower than 1% at 480p and 720p (medians of
    # 3 rounds); then F with it on before the flip is committed.
    run_tests q_perm 150 tests/test_cute_pair_gpu.py -k "query_rows_through_the_permutation or morton_path"
    PROBE_BACKENDS=cute PROBE_SHAPES=wan14,wan14_720 timeout $((575 - SECONDS)) python bench/probes/switch_ab.py \
        PSA_CUTE_PAIR_Q_PERM > "$OUT/q_perm_ab.txt" 2>&1
    log "switch_ab rc=$?"
    decide PSA_CUTE_PAIR_Q_PERM "$OUT/q_perm_ab.txt" --rows _cute --max-ratio 1.01 --tests "$OUT/tests_q_perm.log"
    ;;
M30)  # session 30 (~1.5 min; no carry needed), for time left: what bounds the exact part's tile stream, the L2 or one
    # SM's intake (bench/probes/l2_ingress.py: persistent TMA streams of 16 KiB tiles on 16 to 264 programs, from an
    # L2-resident and an HBM buffer, with clocks and power). It decides whether a four-query-block build with TMA
    # multicast could help random inputs (pieces_h200.md, Session 30). PREDICTION (a guess, to be read against):
    # bytes per clock per program near 36 at P = 132 and above 50 at P = 16-33 from L2 (the L2 bounds the stream).
    log "l2_ingress"
    timeout 240 python bench/probes/l2_ingress.py > "$OUT/l2_ingress.txt" 2>&1
    log "l2_ingress rc=$? $(grep RESULT "$OUT/l2_ingress.txt" | cut -c1-1500)"
    ;;
F)  # every forward GPU test under the caller's environment: after defaults flip on several phases' rules, once with
    # all of them on together (e.g. `PSA_CUTE_BIAS_SLACK=1 PSA_STATS_GLUON=0 bash bench/gpu_round.sh F` before the
    # flips are committed), since each phase timed and tested its switch alone; and after any kernels/ change
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


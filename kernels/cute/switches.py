"""The CuTe kernels' compile-time switches (kernels/cute/fwd.py builds, fwd_pair.py, tile_ops.py) with what each was
measured at: a switch set here is the default, its PSA_CUTE_* environment variable overrides it per process (read
when a kernel is compiled, and part of the CUDA-graph key, kernels/graphs.py). Kept apart from fwd.py so the
history does not crowd the kernel; fwd.py imports every name (fwd.NAME stays the way to read or patch one).
"""
# S = Q K^T with the query tile in registers (PSA_CUTE_QRS=1/0 overrides): every S GEMM then reads only K from
# shared memory, which the TMA writes and both GEMMs' B operands also use. H200, 2026-12-01 (pieces_h200.md,
# session 4; on and off alternated twice per shape in each of two runs): faster in 20 of 24 pairs, by up to 12%
# (e.g. Wan2.1-14B 480p pwt 6.60-6.95 vs 6.95-7.11 ms), within a ~5% run-to-run spread; bitwise the same output
Q_RS = True
# pisa / pwt: the producer prefetches the query block's bias row into L2 (PSA_CUTE_BIAS_L2). H200 (bias_l2.py, session
# 6, two rounds): 480p 6.89 / 7.05 ms vs 7.20 / 6.97 off, 720p 35.98 / 37.33 vs 35.84 / 37.17: no gain, off
BIAS_L2 = False
# pisa / pwt: a virtual tile's bias loaded right after the previous tile's softmax, not at the top of its own
# iteration (PSA_CUTE_BIAS_PF). Same probe: slower (480p 7.61 / 7.54 ms, 720p 38.71 / 39.25): off
BIAS_PF = False
# Morton: the output rows are written through the permutation (PSA_CUTE_OUT_PERM=1/0 overrides), straight into the
# caller's layout, so the separate scatter pass goes; q, k, v stay block-order copies (their TMA loads). H200
# (bench/probes/cute_out_perm.py, session 6, two rounds): 480p 8.00 / 8.77 ms vs 8.10 / 8.09 with the scatter,
# 720p 41.12 / 40.29 vs 39.89 / 40.48, and more memory (its output cannot go over the q copy): off
OUT_PERM = False
# the same where the pair kernel runs (fwd_pair.py out_perm: q, k, v from their block-order copies, only the output
# rows through the permutation, straight into the caller's layout; no scatter pass). Built on the CPU in session 22
# (the shipped build's sm_90a SASS unchanged but for its parameter offsets; this one 168 registers, no spills, 230400
# bytes). Session 22 on the H200: its GPU tests pass, output bitwise the scatter path's; as the node calls it, replayed
# (switch_pair_out_perm_s22_h200.txt, medians of 5) 480p 7.593 -> 7.649 ms, 720p 36.680 -> 36.274, 3 of 5 rounds
# each; its pieces alone (out_perm_kernel_s22_h200.txt, medians of 5): the kernel writing through the permutation
# 6.671 ms against 6.542 + the scatter 0.173 (480p), 34.880 against 34.260 + 0.396 (720p): the permuted row stores
# cost the kernel about what the scatter pass costs, or more. Off. PSA_CUTE_PAIR_OUT_PERM=1/0 overrides
PAIR_OUT_PERM = False
# Morton: the query rows read through the permutation into the consumer's registers, the output written through it:
# only k and v copied, no scatter. One-block kernel only (q_perm_enabled). PSA_CUTE_Q_PERM=1/0 overrides. Session 9:
# correct; FLUX.1 1024^2 through psa 1.20 / 1.22 ms vs 1.01 / 1.27 (host-bound, no pick; cute_q_perm_s9_h200.txt): off
Q_PERM = False
# pisa / pwt: two query blocks per CTA reading the virtual-token tiles once (fwd_pair.py) from PAIR_MIN_BLOCKS KV
# blocks on (PSA_CUTE_PAIR=1/0 forces it, PSA_CUTE_VT_STAGES its shared stages). H200, session 7 (cute_pair.py,
# attention alone, alternated, pwt d 0.125): faster in every pairing, 480p (512 blocks) 6.83 / 7.04 vs 6.87 / 7.28 ms,
# 720p (1182) 35.65 / 35.97 vs 38.46 / 37.04, then 512 blocks on. Session 24 (E37, pair_small_s24_h200.txt: the
# node's call at the break-even sizes, CuTe, replayed from CUDA graphs up to 16384 tokens, 3 alternated rounds,
# medians, ms, one-block -> pair): 4608 tokens (72 blocks: FLUX.1 1024^2) 0.224 -> 0.217 / 0.252 -> 0.245 / 0.350 ->
# 0.341 at d 0.125 / 0.2 / 0.3, 6912 0.347 -> 0.335 / 0.421 -> 0.408 / 0.596 -> 0.578, 9728 0.561 -> 0.539 / 0.742 ->
# 0.719 / 1.035 -> 0.996, 16896 (eager) 1.716 -> 1.647 / 1.990 -> 1.859 / 2.571 -> 2.470, faster in 3 of 3 rounds
# but one cell (2 of 3); 2816 tokens (44 blocks) 0.221 -> 0.176 / 0.198 -> 0.193 / 0.335 -> 0.348 (host-bound there,
# and slower at d 0.3); outputs within 1.3e-5 relative L2 (the reciprocal epilogue). The rule set before timing (the
# smallest size from which the pair kernel is faster at every density of it and of every larger size): 72 blocks.
# F37: every forward GPU test on it (230 passed); FLUX.1 as the node calls it, replayed (switch_pair_flux_s24_h200.txt,
# medians of 5 alternated rounds) 0.2519 -> 0.2454 ms, faster in 5 of 5
PAIR_MIN_BLOCKS = 72
# the pair build's epilogue multiplies by one reciprocal per row instead of dividing every element (session 8,
# cute_pair.py, two rounds: 480p 6.74 / 6.82 ms vs 6.77 / 6.85, 720p 35.15 / 35.61 vs 35.44 / 35.76). Env
# PSA_CUTE_RECIP_STORE=1/0 overrides.
RECIP_STORE = True
# the pair build with one exact-tile pipeline fed the union of its two query blocks' lists (fwd_pair.py, share): a
# block both lists hold is loaded once. Session 9: correct, 1.3-1.7 ms slower at 480p with the lists read from global
# memory (cute_pair_share_s9_h200.txt). Session 10, lists in shared memory (cute_pair_share_s10_h200.txt, two
# rounds): 0.5 ms faster than that, still slower than a pipeline per list everywhere: 480p random 8.16 / 8.21 vs
# 6.93 / 7.06 ms, DiT-like (61% of adjacent lists shared) 7.67 / 7.62 vs 6.81 / 6.97, 720p DiT-like (68%) 38.3 /
# 38.9 vs 35.6 / 34.7; its exact part alone 6.65 vs 5.87 ms on DiT-like 480p, although it loads ~30% fewer tiles:
# the two consumers paced by one pipeline cost more than the loads saved. Off. PSA_CUTE_PAIR_SHARE=1/0 overrides
PAIR_SHARE = False
PAIR_SHARE_MAX_SEL = 256  # both lists in its shared memory (2 KiB); longer ones keep a pipeline per list
# Measured and dropped (session 25, commit e770827): the shared pipeline with one full barrier per owner kind and slot,
# each consumer waiting for and releasing only its own tiles and the producer arriving for a single-owner tile's other
# consumer (the protocol tests/test_union_barrier_model.py checks). Its GPU tests passed (crafted lists 14, every
# shared-pipeline test 29), but on DiT-like Morton inputs at 480p (bench/probes/split_clocks.py, the exact part alone)
# it took 6.10 ms against the shared pipeline's 5.93 and the per-list pipelines' 5.28 (11.4 / 10.9 / 8.5 M cycles):
# the other list's waits and releases were not what the shared pipeline pays for (its one producer warp filling one
# ring in union order for both consumers is the suspect left). Session 28's CPU model of that ring (bench/probes/
# union_pacing.py, pieces_h200.md) puts the sorted merge's pacing at 9-12% of the per-list cycles, a third of the
# measured loss at most: the shared consumers' per-tile cost is the larger part; an order alternating the two lists'
# own tiles would remove the pacing share.
# Session 30 (CPU only; not yet run on a GPU): the shared pipeline's order is now the split order (fwd_pair.py,
# pair_sched._produce_split): the blocks both lists hold first, then the two lists' own blocks alternating, so a
# consumer passes 0 or 1 tiles before each own one by arithmetic (no list walk in the tile loop, no long-gap path),
# and it keeps the shipped virtual loop (S_AHEAD_VT: 232,448 bytes of shared memory, the 227 KiB limit). The pacing
# model (bench/results/union_pacing_s30_cpu.txt) puts it level with the per-list pipelines' cycles (DiT-like 111 K vs
# 114 K at C = 1700) on ~30% fewer tile loads. Session 31 (U30, on an H100; share_clocks_*_s31_h100.txt): correct
# (every share test passed), but DiT-like exact part 5.24 -> 5.32 ms (+1.6%; 8.33 -> 8.86 M cycles at a 5% higher
# clock), random 5.43 -> 5.80 (+6.9%, +12% cycles), the node's call at 480p +8.7%: off. A CPU model fits both ratios
# with ~300 cycles per passed tile of the other list and +4% per own tile (bench/probes/union_coupling.py,
# pieces_h200.md Session 31): the passes, not the sharing, cost the gain. Session 32: the split order replaced by the
# split rings (pair_sched.py: the two per-list rings kept, a block both lists hold loaded once into one of them, no
# tile of the other list waited for or released; the split order's code: `git show bb41039:kernels/cute/pair_sched.py`).
# U32 on an H100 (share_clocks_*_s32_h100.txt): correct (38 share tests passed), the passes' loss gone but no gain:
# DiT-like exact part 5.233 -> 5.212 ms (-0.4%; second order -0.1%), +2.4% cycles at a 3% higher clock; random +2.6%
# / +3.1% (+4.6% / +6.1% cycles); the node's call at 480p +5.3%: off. Its exact loop had 626 SASS instructions per
# tile against the per-list 593 (+5.6%, the size of the random loss): the ring arithmetic in signed // and %; now
# shifts and masks, once per tile (the V wait reuses its K's stage), 595 (bench/probes/cute_sass_loops.py share=1).
# Session 33, U33 on an H100 (share_clocks_*_s33_h100.txt): 38 share tests passed; DiT-like novt 5.276 -> 5.204 ms
# (-1.4%; second order -1.4%), pwt -1.1% / -2.3%, still +2.5% cycles at a 4% higher clock; random novt +2.1% / +1.9%
# (+4.1% / +5.0% cycles); the node's call at 480p 7.497 -> 7.901 (+5.4%, as U32's): off. With the loop at the
# per-list size the cycles it adds are not its instructions; untested suspects: the 8-arrival empty barriers, the
# rings coupled through shared tiles (a consumer waits for the other rank's loads)
# the pair build on the Morton path reading the caller's query rows through the permutation and writing the output
# through it (fwd_pair.py q_perm: no q copy, no scatter, q's copy no longer in the peak). PSA_CUTE_PAIR_Q_PERM=1/0
# overrides. Session 10 (cute_pair_q_perm4_s10_h200.txt, as the node calls it, 4 rounds, medians): correct (max
# diff 0), peak 1.79x -> 1.29x q, but 480p 8.23 vs 7.97 ms (+3%; the gathered query loads), 720p 39.14 vs 39.24: off.
# Session 22 on today's kernels (switch_pair_q_perm_s22_h200.txt, 3 rounds, medians): 480p 7.598 -> 7.992 ms (+5%),
# peak 1.74x -> 1.24x q; 720p 36.87 -> 36.54, 0.92x -> 0.67x q: still off. Session 31 (H100, Q30,
# switch_pair_q_perm_s31_h100.txt): 480p 7.416 -> 7.992 (+7.8%), 720p +1.2%: off
PAIR_Q_PERM = False
PAIR_VT_STAGES = 3  # its shared virtual-tile stages (cute_pair.py, session 7: 3 fastest at 720p, 2-4 equal at 480p)
# the pair build's virtual loop with every tile but the last as whole blocks: log2(64) in the bias, no per-column
# bounds, counts or second sum (fwd_pair.py vt_peel; the last tile after the loop, as before). Its sm_90a loop body
# 632 -> ~450 instructions; session 15's fold (the same idea behind a runtime branch inside the loop) compiled to 849
# and measured slower. Built in session 16 on the CPU; session 17 on the H200 (vt_peel_kernel_s17_h200.txt, the kernel
# alone, medians of 5 alternated rounds): 480p 6.888 -> 6.822 ms, 720p 35.457 -> 35.514; Nsight Compute: 16% fewer
# instructions in the virtual tiles, the same time (the kernel is latency-bound); session 18 at 720p again
# (pingpong_peel_720p_s18_h200.txt): 35.699 -> 35.811, faster in 2 of 5 rounds: off. PSA_CUTE_VT_PEEL=1/0 overrides
VT_PEEL = False
# the pair build's two consumers issuing their GEMMs in turn (fwd_pair.py pingpong: FlashAttention-3's warpgroup
# ping-pong on named barriers). Session 17's Nsight Compute profile of the pair kernel at 480p (ncu_*_s17_h200.csv):
# tensor pipe 55-57% of its peak, 0.48 eligible warps per scheduler, issue slots 37% busy: latency-bound, not issue-
# bound (the peel's 16% fewer virtual-tile instructions changed no time). Session 17 on the H200: equal outputs, its
# GPU tests pass (unequal lists, odd last block, no virtual tiles), the kernel alone at 480p 6.898 vs 6.923 ms (medians
# of 3 alternated rounds); session 18 at 720p (pingpong_peel_720p_s18_h200.txt, 5 rounds): 35.726 -> 36.529, slower in
# every round: off. PSA_CUTE_PINGPONG=1/0 overrides
PINGPONG = False
# the per-tile row max (TREE_MAX) and row sum (TREE_SUM) of the online softmax as pairwise reductions of depth 4
# instead of dependent chains of 16 (tile_ops._tree), in both CuTe kernels. Session 18's per-instruction stall
# sampling (Nsight Compute SourceCounters, bench/results/sass_stalls_*_s18_h200.txt) put the consumers' time, after
# their own GEMM waits, on dependent chains: the row max's 16 FMNMX per row each wait on the previous one. The tree
# max gives bitwise the same output; the tree sum rounds the row sum in another order (rel L2 1.1e-5). Session 18 on
# the H200 (tree_kernel_s18_h200.txt, the kernels alone, medians of 5 alternated rounds), pwt / drop: tree max 480p
# 6.957 -> 6.962 / 5.950 -> 5.963, 720p 35.757 -> 35.955 / 30.945 -> 31.073 (faster in 2 and 1 of 5 rounds); tree
# sum 480p 6.965 -> 6.938 / 5.993 -> 5.995, 720p 35.823 -> 35.738 / 30.954 -> 30.923 (4 of 5), and on top of the tree
# max the drop kernel 1.1% slower at 720p (tree_sum_on_max_s18_h200.txt). No gain beyond the rounds' spread: the
# chains are not what the consumers wait on (pair_split.py: see PV_FENCE below). Both off; their GPU tests pass.
# PSA_CUTE_TREE_MAX / PSA_CUTE_TREE_SUM=1/0 override
TREE_MAX = False
TREE_SUM = False
# the pair build's exact loop with the S GEMM of tile u issued before the softmax of tile u - 1 (fwd_pair.py s_ahead,
# pair_sched._ahead_exact): the softmax then runs under both GEMMs. Session 18's split of the pair kernel at 480p
# (bench/probes/pair_split.py, exact part alone): tile stream 4.75 ms, + GEMMs 4.87, + softmax 4.76, + both 5.82.
# Built on the CPU in session 18, off until timed; its sm_90a SASS has the wait after the softmax hoisted above the
# exponentials again (with PV_FENCE the fence too), so as built no gain is expected. Session 19 on the H200
# (sched_kernel_s19_h200.txt, sched_on_fence_s19_h200.txt; the kernels alone, medians of 5 alternated rounds): equal
# outputs, pwt 480p 6.852 -> 7.381, 720p 35.802 -> 38.034 (slower in every round; on top of PV_FENCE 6.760 -> 7.094,
# 34.658 -> 37.132): with the wait above the softmax nothing overlaps. Since session 19 its in-loop wait is pinned
# to the row sums (tile_ops._pv_wait, force_pin): the DSL's own sm_90a cubin then has all 34 exponentials of the
# softmax of u - 1 above the wait for S of u and P V of u - 2 (tests/test_cute_compile.py); untimed in that form
# (A20). Timed in session 21 (A20): 11-13% slower; its tile stream alone 7-13% slower than the plain loop's. Session
# 22 (A23, kv5_s22_h200.txt; two virtual stages, S_AHEAD_VT off, medians of 5 rounds): a fifth exact slot per
# consumer takes its exact loop 6.520 -> 6.312 ms at 480p and 34.268 -> 32.298 at 720p, still above the plain loop's
# 5.879 / 30.117 at four slots (which five slots do not help: 5.969 / 30.133): depth is a part of its loss, not
# all of it. Off. PSA_CUTE_S_AHEAD=1/0 overrides
S_AHEAD = False
# a CTA-scope fence before the wait for the P V GEMM that a tile's softmax should run under (tile_ops._pv_wait):
# ptxas otherwise hoists that WARPGROUP.DEPBAR above the softmax (sm_90a SASS of the pair and one-block kernels,
# session 18: the wait comes before the first exponential), so P V and the softmax run one after the other, which
# is what pair_split.py measured (either alone hides under the tile stream, both do not). With the fence the
# exponentials stay above the wait. PV_FENCE: the exact tiles of both kernels (and the one-block kernel's virtual
# tiles); PV_FENCE_VT: the pair kernel's virtual tiles (their bias loads for the next tile are in flight there, and
# the fence may wait for them). Built on the CPU in session 18. Session 19 on the H200 (sched_kernel_s19_h200.txt: the
# kernels alone, medians of 5 alternated rounds, outputs bitwise equal): PV_FENCE pwt 480p 6.912 -> 6.690 ms, 720p
# 35.754 -> 34.696 (faster in 5 of 5 rounds each), drop 5.943 -> 5.714 / 30.642 -> 29.565 (5 of 5): on. PV_FENCE_VT on
# top of it (sched_on_fence_s19_h200.txt): 6.742 -> 6.722 (2 of 5), 34.695 -> 35.132 (0 of 5): off. The split with
# the fence (pair_split_fence_s19_h200.txt, 480p, exact part alone): stream 4.758, + GEMMs 4.887, + softmax 4.796,
# + both 5.657 (5.815 without the fence): a sixth of the gap above the stream is recovered; the rest is each tile's
# S GEMM -> softmax chain (S_AHEAD's aim). The virtual tiles' fence held only 20-23 of their 34 exponentials above
# the wait (SASS); since session 19 PV_FENCE_VT is pinned to the row sums (tile_ops._pv_wait; all 34 above it, and
# the fence never runs, so it cannot wait for the next tile's bias loads in flight there): untimed in that form
# (A20). PSA_CUTE_PV_FENCE(_VT)=1/0 override
PV_FENCE = True
PV_FENCE_VT = False
# those fences under a test of the row sums that never holds in practice (tile_ops._pv_wait's pin): the predicated
# fence, and the wait below it, then depend on every exponential of the tile, so ptxas cannot hoist them above the
# softmax even where it moves an unconditional fence (the S-ahead loop, whose waits always take the pin), and the
# fence itself never runs (sm_90a: FSETP on the row sums, a branch around MEMBAR.ALL.CTA, then the DEPBAR). Only
# changes waits that PV_FENCE fences. Built on the CPU in session 19, off until timed (A20). PSA_CUTE_PV_PIN=1/0
PV_PIN = False
# the pair build's virtual loop with the S GEMM of tile t issued before the softmax of tile t - 1 (pair_sched.
# _ahead_virtual; S_AHEAD's schedule for the virtual tiles, its wait always pinned to the row sums). The virtual tiles
# are where the split puts the larger share above their bound: 5.4 of 35.0 ms at 720p against 0.8 for their stream
# (pair_split.py, session 18), B19's virtual part 0.98 / 6.9 ms against cuDNN's 0.70 / 3.58 for q against the block
# means alone. It holds three shared stages at once, so it takes four (PSA_CUTE_VT_STAGES below 4 is raised; 225 KiB
# of shared memory), its producer sends each k-bar tile one tile ahead of the value means, and it replaces the peeled
# loop (VT_PEEL). Its whole-block tiles take the constant count BS (tile_ops._bias_whole) and an issue barrier after
# the S GEMM: sm_90a SASS of the first builds had ptxas issue every HGMMA of S after the softmax (with the count
# registers, in every build; without the barrier, in one of two). Scheduling only: bitwise the plain loop's output.
# Not with S_AHEAD (both loops in one build spilled 232 bytes). Built on the CPU in session 20: the DSL's SASS has the
# eight HGMMA of S of t, then the softmax of t - 1, then the pinned wait (tests/test_cute_compile.py). Timed in
# session 21 (kernels alone, pwt d 0.125, medians of alternated rounds, ms): A20 480p 6.867 -> 6.823 (3 of 5),
# 720p 35.031 -> 34.722 (5 of 5); on PV_PIN 6.858 -> 6.695 (5 of 5), 35.328 -> 34.948 (5 of 5). Its output was
# 1.2e-4 off the plain loop's there: LLVM fused the whole-block bias product into the logit's FMA for 2 of 32 columns
# (_bias_whole now rounds it on its own, mul.rn). A22, bitwise the plain loop: 480p 6.660 -> 6.537 (5 of 7), 720p
# 34.480 -> 34.092 (7 of 7); the virtual part 0.82 -> 0.70 and 4.75 -> 4.37 ms (savt_kernel_s21_h200.txt). The rule
# set before timing (faster in >= 6 of 7 rounds at each size) held at 720p only; at 480p the median was faster in
# each of the four runs and 18 of 24 rounds in all (one-sided sign test p = 0.01), with the output unchanged: on.
# PSA_CUTE_S_AHEAD_VT=1/0 overrides
S_AHEAD_VT = True
# drop (the exact tiles alone, the "exact part") through the pair build with no virtual tiles (n_vt = 0: no
# k-bar / value-mean / H-bar loads, no first-order term) instead of the one-block kernel: the kernel pair_split.py and
# vt_peel_kernel.py time as "novt". Alone it is the same loop (A19: novt 5.946 vs one-block drop 5.943 ms at 480p,
# both without the fence; the split with it 5.657 vs A19's drop 5.714); what it brings is the pair build's schedules,
# S_AHEAD above all, which the one-block kernel cannot take (its 128-register bound has no room for the second S
# accumulator). Its epilogue multiplies by the reciprocal row sum (RECIP_STORE), so its output differs from the one-
# block kernel's by that rounding. Built on the CPU in session 20, off until timed (A20, on S_AHEAD).
# PSA_CUTE_PAIR_DROP=1/0 overrides
PAIR_DROP = False
# the pair kernel's epilogue through shared memory: the normalised output tile into the consumer's query stage, then
# one TMA store of whole rows (fwd_pair.py tma_store, pair_sched._store_tile_tma), instead of per-element 4-byte
# stores from the accumulator fragments (tile_ops._store_rows). Session 22 (A28, epilogue_stores_s22_h200.txt, the
# pair kernel alone, medians of 5 rounds): with its stores skipped (probe "nostore") the kernel is 6.508 -> 6.146 ms
# at 480p and 34.148 -> 33.651 at 720p, writing the caller's [B, T, H, D] layout 6.873 / 34.869: the stores cost
# 0.36-0.73 ms, far above their bytes (0.08 ms at 480p). Built on the CPU in session 22; A29 on the H200
# (tma_store_kernel_s22_h200.txt, the kernels alone, medians of 5 alternated rounds): bitwise the per-element
# stores' output, pwt 480p 6.552 -> 6.285 ms (5 of 5 rounds), 720p 34.799 -> 33.950 (4 of 5): on. Not with the
# output permutation (its rows are not a tile). PSA_CUTE_TMA_STORE=1/0 overrides
TMA_STORE = True
# the same epilogue in the one-block kernel (fwd.py: drop, and pisa / pwt below the pair kernel's PAIR_MIN_BLOCKS,
# 512 KV blocks until session 24, 72 since: FLUX.1 1024^2 took it then; its query stage holds one tile), built on the CPU in session 22 after the device time. Session 23 (A31,
# tma_store_one_s23_h200.txt: FLUX.1 1024^2 as the node calls it, graph replay, 5 alternated rounds): 0.2933 ->
# 0.2682 ms, faster in 5 of 5 rounds, outputs equal (max diff 0), its GPU test and every forward GPU test green
# (229 passed): on. PSA_CUTE_TMA_STORE_ONE=1/0 overrides
TMA_STORE_ONE = True
# pisa / pwt pair kernel: a virtual tile's bias loaded without clamping its columns to the row (PSA_CUTE_BIAS_SLACK),
# where the bias tensor has BS elements of storage past its end (route.py allocates them: columns past a row read
# the next row or that slack, and _bias_slots turns them into -inf as before). The clamps (14 VIADDMNMX) and half the
# addresses go (the loads then share one address per column pair): the shipped S_AHEAD_VT virtual loop's sm_90a SASS
# 546 -> 513 instructions per tile (bench/probes/cute_sass_loops.py bias_slack=1; 168 registers, no spills). Built on
# the CPU in session 26. Session 29 on the H200 (vt_builds_kernel_s29_h200.txt, the pair kernel alone, 7 alternated
# rounds, bitwise the same output): pwt 6.335 -> 6.267 ms at 480p (5 of 7 rounds faster), 33.60 -> 33.22 at 720p (6
# of 7), where the rule asked 6 of 7 at both; the build without virtual tiles, which the slack does not change, moved
# by up to 1% between the same arms: off. PSA_CUTE_BIAS_SLACK=1/0 overrides
BIAS_SLACK = False
# Removed in session 29 after the H200 (vt_builds_kernel_s29_h200.txt, lazy_kernel_s29_h200.txt; the pair kernel alone,
# 7 alternated rounds): VT_FULL (session 27: the S-ahead virtual loop's whole-block tiles as VT_PEEL's, log2(64) in the
# bias, no count multiplies or second sum; 546 -> 485 SASS instructions per tile) 6.342 -> 6.328 ms at 480p and 33.61
# -> 33.51 at 720p, and on BIAS_SLACK 6.268 -> 6.336 / 33.15 -> 33.16; LAZY_RESCALE (session 27: FlashAttention-4's
# conditional rescaling, the reference max kept until a tile's exceeds it by 2^8) pwt 6.325 -> 6.309 / 33.91 -> 33.71,
# drop 5.643 -> 5.486 / 29.17 -> 28.86, and 16% more error against float64 than the shipped softmax on large logits
# (rel L2 1.39e-3 vs 1.20e-3; 5% on dense inputs). Fewer instructions per tile did not buy their share of time at the
# power cap. The builds are in git history (commit 62dcc63)

# the cube order's interior read and written in the caller's layout (fwd_cube.py, under PSA_MORTON_CUBES; the order
# itself is kernels/reorder.py's switch): on with the order, so PSA_CUTE_CUBE_VIEW=0 times the same order with
# today's copies. Session 34 on an H100 (bench/results/pieces_h200.md, Session 34): the first build's view put the
# cube index before the head in the folded TMA dimension, whose coordinate unit is the first mode's stride, so the
# head's coordinate was rounded and every view test failed (outputs unlike the copies', some non-finite; 480p +8.7%,
# peak 1.74x -> 0.81x q). Rebuilt heads first, tiles addressed without divisions (pair_sched._cube_tile; 168
# registers, no spills), its coordinates checked on the CPU (tests/test_cube_view_coords.py). Session 35 (an H100):
# outputs within rel 2.2e-4 of the copies' (their statistics took another kernel), 480p 7.41 -> 7.96 ms against the
# same order's copies (+7%), 720p 38.24 -> 38.28; PSA_MORTON_CUBES stays off, so this only acts under it
CUBE_VIEW = True
# PSA_CUTE_CUBE_KV (session 36): with the view on, k and v through it too (session 35's build, above), else only the
# query tile and the output (fwd_cube.py): k and v keep block-order copies of every block, as the Morton path's, since
# the exact loop streams them from copies faster than through the view's 5-D boxes (session 35: +7% with the boxes),
# while q is one load per query block and the output one store, so their boxes cost little there, and the q copy
# (0.09 ms of the statistics' 0.58 at 480p, H200 B39) and the output's scatter pass (0.16 ms, A36) go. Off: the
# query and output only, until the H200 says otherwise
CUBE_KV = False


# ---------------------------------------------------------------------------------------------- read per call
import os  # noqa: E402


def _env_flag(name: str, default: bool) -> bool:
    env = os.environ.get(name)
    return default if env is None else env.strip() not in ("0", "", "false", "False")


def q_perm_enabled(T: int | None = None, variant: str = "pwt") -> bool:
    """Whether the Morton path hands attention() the caller's q with `perm` for T tokens: where the pair kernel
    runs (pisa / pwt from PAIR_MIN_BLOCKS KV blocks, PSA_CUTE_PAIR) its PAIR_Q_PERM (PSA_CUTE_PAIR_Q_PERM), else
    the one-block kernel's Q_PERM (PSA_CUTE_Q_PERM)."""
    if _pair_runs(T, variant):
        return _env_flag("PSA_CUTE_PAIR_Q_PERM", PAIR_Q_PERM)
    return _env_flag("PSA_CUTE_Q_PERM", Q_PERM)


def _pair_runs(T: int | None, variant: str) -> bool:
    """Whether attention() takes the pair kernel for T tokens of `variant` (PAIR_MIN_BLOCKS, PSA_CUTE_PAIR)."""
    return T is not None and variant in ("pisa", "pwt") and _env_flag("PSA_CUTE_PAIR", -(-T // 64) >= PAIR_MIN_BLOCKS)


def out_perm_enabled(T: int | None = None, variant: str = "pwt") -> bool:
    """Whether the Morton path hands attention() `perm` for the output rows (no scatter): PAIR_OUT_PERM where the
    pair kernel runs, else OUT_PERM (PSA_CUTE_PAIR_OUT_PERM / PSA_CUTE_OUT_PERM)."""
    if _pair_runs(T, variant):
        return _env_flag("PSA_CUTE_PAIR_OUT_PERM", PAIR_OUT_PERM)
    return _env_flag("PSA_CUTE_OUT_PERM", OUT_PERM)

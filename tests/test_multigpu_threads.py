"""Several devices in one process (ComfyUI's MultiGPU CFG split: one worker thread per device, the same
override object called from all of them at once). Concurrent calls give the sequential results, every decision
is counted once, the per-branch block counter of each thread stays its own, and the caches that are read
per device (the sampling schedule, the kernels' autotune and compile results) stay consistent. No ComfyUI here
(tests/test_comfy_multigpu.py drives ComfyUI's own MultiGPU code); CPU only."""
from __future__ import annotations

import sys
import threading
import time
from collections import Counter

import pytest
import torch

from comfy_inproc import load_pack

load_pack()
from psa_pack.nodes import layout, patch, policy, state  # noqa: E402

SIGMAS = torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0])
GRID = (2, 8, 16)  # 256 video tokens: 4 blocks of 64
BLOCKS = 4
THREADS = 4


class Dense:
    """ComfyUI's attention function stand-in ([B, L, H*D] layout), SDPA."""

    def __call__(self, q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False,
                 **kwargs):
        b, _, hd = q.shape
        q, k, v = (t.view(b, -1, heads, hd // heads).transpose(1, 2) for t in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).reshape(b, -1, hd)


class Executor:
    """The diffusion model's forward as the DIFFUSION_MODEL wrapper sees it: per block one self-attention call
    (counted: no block_index, as in ComfyUI 0.3.x) and one cross-attention call."""

    class_obj = None

    def __init__(self, qkv, ctx):
        self.qkv, self.ctx = qkv, ctx

    def __call__(self, x, t, context, transformer_options):
        ov = transformer_options[patch.OVERRIDE]
        outs = []
        for _ in range(BLOCKS):
            outs.append(ov(Dense(), *self.qkv, heads=2, transformer_options=transformer_options))
            outs.append(ov(Dense(), self.qkv[0], self.ctx, self.ctx, heads=2, transformer_options=transformer_options))
        return outs


def _override():
    kn = policy.Knobs(density=0.25, dense_steps=1, dense_blocks=(0, -1), min_tokens=128, backend="torch")
    return patch.SparseAttentionOverride(kn, family="wan", total_blocks=BLOCKS)


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    T = GRID[0] * GRID[1] * GRID[2]
    return [torch.randn(1, T, 128, generator=g) for _ in range(3)], torch.randn(1, 16, 128, generator=g)


def _branch_run(ov, branch: int, qkv, ctx, sched=None):
    """All steps of one CFG branch (cond_or_uncond [branch]) through ForwardWrapper, as one device's thread."""
    x = torch.zeros(1, 16, GRID[0], GRID[1] * 2, GRID[2] * 2)
    wrapper, ex, outs = patch.ForwardWrapper(ov), Executor(qkv, ctx), []
    for sigma in SIGMAS[:-1].tolist():
        to = {"sigmas": torch.tensor([sigma]), "sample_sigmas": SIGMAS if sched is None else sched(),
              "cond_or_uncond": [branch], patch.OVERRIDE: ov}
        outs += wrapper(ex, x, None, ctx, transformer_options=to)
    return outs


def _expected_tally():
    # per branch: 4 steps x 4 blocks self-attention; step 0 dense, blocks 0 and 3 dense; 16 cross-attention calls
    return {"sparse": 3 * 2, "dense step": 4, "dense block": 3 * 2, "cross-attention": 16}


def _tally(uid):
    t = patch.run_state(uid).tally
    return dict(sparse=t.sparse, **t.dense)


@pytest.fixture
def fast_switching():
    """Make the interpreter hand the GIL over as often as it can, so races between threads show up."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _in_threads(fn, n):
    barrier, results, errors = threading.Barrier(n), [None] * n, []

    def run(i):
        try:
            barrier.wait()
            results[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert all(not t.is_alive() for t in threads)
    return results


def test_concurrent_branches_equal_sequential_and_count_every_decision(fast_switching, tmp_path, monkeypatch):
    log = tmp_path / "decisions.jsonl"
    monkeypatch.setenv(patch.DECISION_LOG_ENV, str(log))
    inputs = [_inputs(i) for i in range(THREADS)]
    seq = _override()
    want = [_branch_run(seq, i, *inputs[i]) for i in range(THREADS)]
    n_seq = len(log.read_text().splitlines())
    ov = _override()
    got = _in_threads(lambda i: _branch_run(ov, i, *inputs[i]), THREADS)
    for i in range(THREADS):
        assert len(got[i]) == len(want[i])
        for a, b in zip(got[i], want[i]):
            assert torch.equal(a, b)
    per_branch = _expected_tally()
    assert _tally(seq.uid) == {k: n * THREADS for k, n in per_branch.items()}
    assert _tally(ov.uid) == _tally(seq.uid)
    assert len(log.read_text().splitlines()) == 2 * n_seq  # one line per call, none lost or torn


def test_each_thread_counts_its_own_blocks(fast_switching, tmp_path, monkeypatch):
    log = tmp_path / "decisions.jsonl"
    monkeypatch.setenv(patch.DECISION_LOG_ENV, str(log))
    ov = _override()
    _in_threads(lambda i: _branch_run(ov, i, *_inputs(i)), THREADS)
    import json
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    blocks = Counter((r["branch"][0], r["block"]) for r in rows if r["q_len"] == r["k_len"])
    # every branch saw blocks 0..3 once per step: the counters never mixed
    assert blocks == Counter({(b, i): 4 for b in range(THREADS) for i in range(BLOCKS)})


def test_run_state_is_created_once_when_threads_arrive_together(fast_switching):
    # before the lock: 14 of 200 such trials handed different threads different RunState objects
    for trial in range(100):
        uid = f"race-{trial}-{id(object())}"
        got = _in_threads(lambda i: patch.run_state(uid), 8)
        assert all(s is got[0] for s in got), trial
        patch.reset_run(uid)


def test_tally_loses_no_update_under_concurrent_adds(fast_switching):
    # before the lock: 8 threads x 10000 dense decisions counted 69213-80000 of 80000
    uid = "tally-" + str(id(object()))
    st = patch.run_state(uid)

    def add(i):
        for j in range(10000):
            state.count(st, None if j % 2 else f"reason {j % 3}")
    _in_threads(add, 8)
    assert st.tally.sparse == 8 * 5000 and sum(st.tally.dense.values()) == 8 * 5000
    patch.reset_run(uid)


def test_a_copy_of_the_schedule_per_device_keeps_the_step_count_of_a_continued_pass():
    # ComfyUI's MultiGPU worker passes sample_sigmas.to(device): on an extra GPU a new tensor every forward.
    # A second pass (Wan2.2's low-noise expert) continues the first one's step count on every device.
    layout._LAST_PASS[0] = None
    first, second = torch.tensor([1.0, 0.8, 0.6, 0.4]), torch.tensor([0.4, 0.2, 0.1, 0.0])
    for s in first[:-1].tolist():
        for _ in range(2):  # the main device's tensor, then an extra device's copy
            assert layout.sigma_and_step({"sigmas": torch.tensor([s]), "sample_sigmas": first.clone()})[1][1] == 3
    steps = []
    for s in second[:-1].tolist():
        steps.append(layout.sigma_and_step({"sigmas": torch.tensor([s]), "sample_sigmas": second})[1])
        steps.append(layout.sigma_and_step({"sigmas": torch.tensor([s]), "sample_sigmas": second.clone()})[1])
    assert steps == [(3, 6), (3, 6), (4, 6), (4, 6), (5, 6), (5, 6)]


def test_triton_autotuned_launches_never_overlap(monkeypatch, fast_switching):
    """triton's Autotuner keeps the launch arguments on itself (`nargs`) while it benchmarks and clears them
    after every launch: two threads in one tuner at once break each other (a TypeError in the benchmark)."""
    fwd = pytest.importorskip("psa_pack.kernels.triton.fwd", reason="triton not importable")
    inside, overlaps = [0], []

    class Tuner:
        best_config = None

        def __getitem__(self, grid):
            def launch(*args, **meta):
                inside[0] += 1
                if inside[0] > 1:
                    overlaps.append(inside[0])
                time.sleep(0.0005)  # a benchmark waits on the GPU, with the GIL released
                inside[0] -= 1
            return launch
    monkeypatch.setattr(fwd, "_tuner", lambda device, tma: Tuner())
    monkeypatch.setattr(fwd, "_INTERPRET", False)
    q = torch.zeros(1, 1, 64, 64, dtype=torch.float16)
    st = type("S", (), {"kbar_lp": None, "vmean_lp": None, "hbar_lp": None, "hbar_scale": None})()
    cfg = type("C", (), {"block_size": 64, "variant": "drop", "scale": 0.125, "budget": lambda self, n: n})()
    idx = torch.zeros(1, 1, 1, 1, dtype=torch.int32)

    def run(i):
        for _ in range(10):
            fwd.attention(q, q, q, torch.empty_like(q), st, idx, None, cfg)
    _in_threads(run, 4)
    assert overlaps == []


def test_cute_executor_is_bound_per_device(monkeypatch):
    """A compiled CuTe function is loaded for the device that was current at its first call; every other
    device gets its own executor (`.to(device)`), compiled once for all."""
    cute_fwd = pytest.importorskip("psa_pack.kernels.cute.fwd", reason="nvidia-cutlass-dsl not importable")

    class Compiled:
        def __init__(self):
            self.bound = []

        def to(self, device):
            self.bound.append(device)
            return ("executor", device)
    c = Compiled()
    cute_fwd._executors.clear()
    for dev in (0, 1, 0, 1, 1):
        assert cute_fwd._executor(c, ("key",), torch.device("cuda", dev)) == ("executor", dev)
    assert c.bound == [0, 1]
    cute_fwd._executors.clear()

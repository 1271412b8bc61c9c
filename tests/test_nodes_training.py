"""The override while training, without ComfyUI: what dense_steps means then, the block index from the call
stack (the same in a checkpointed block's forward and recompute), per-sample decisions in one batch."""
from __future__ import annotations

import pytest
import torch

from comfy_inproc import load_pack

load_pack()
from psa_pack.nodes import patch, policy, training  # noqa: E402


def test_training_dense_fraction_reads_dense_steps_as_part_of_the_noise_range():
    assert policy.training_dense_fraction(-1) == policy.AUTO_DENSE_STEP_FRACTION == 0.2
    assert policy.training_dense_fraction(0) == 0.0
    assert policy.training_dense_fraction(10) == 0.2  # 10 of the paper's 50 steps
    assert policy.training_dense_fraction(500) == 1.0


def _call(**kw):
    c = dict(q_len=4096, k_len=4096, head_dim=64, dtype="torch.float32", has_mask=False, n_tokens_expected=4096,
             block=1, total_blocks=4, step=None, n_steps=None, sigma=0.5, training=True, dense_sigma=0.8)
    c.update(kw)
    return policy.Call(**c)


@pytest.mark.parametrize("sigma,dense_steps,want", [
    (0.9, -1, "dense noise level (training)"),  # noisier than the sigma at 20% of the schedule
    (0.5, -1, None),
    (0.9, 0, None),  # dense_steps 0: every noise level sparse
])
def test_training_calls_are_judged_by_their_own_sigma_not_a_schedule(sigma, dense_steps, want):
    kn = policy.Knobs(dense_steps=dense_steps, dense_blocks=(0, -1))
    assert policy.call_reason(kn, _call(sigma=sigma)) == want
    assert policy.call_reason(kn, _call(sigma=sigma, block=0)) in (want, "dense block") or want is not None


def test_training_without_a_sigma_range_says_so():
    reason = policy.call_reason(policy.Knobs(), _call(dense_sigma=None))
    assert reason and "while training" in reason
    assert policy.call_reason(policy.Knobs(dense_steps=0), _call(dense_sigma=None)) is None


class Attn(torch.nn.Module):
    def __init__(self, override):
        super().__init__()
        self.override = override
        self.qkv = torch.nn.Linear(64, 3 * 64)

    def forward(self, x, to):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.override(dense, q, k, v, heads=1, transformer_options=to)


class Block(torch.nn.Module):
    def __init__(self, override):
        super().__init__()
        self.attn = Attn(override)

    def forward(self, x, to):
        return x + self.attn(x, to)


class Model(torch.nn.Module):
    def __init__(self, override, n=4):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(override) for _ in range(n))

    def forward(self, x, to, checkpoint=False):
        for blk in self.blocks:
            if checkpoint:
                x = torch.utils.checkpoint.checkpoint(blk, x, to, use_reentrant=False)
            else:
                x = blk(x, to)
        return x


def dense(q, k, v, heads, **kwargs):
    return torch.nn.functional.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]


def _setup(tmp_path, monkeypatch, **kn):
    k = dict(density=0.25, dense_steps=0, dense_blocks=(0, -1), min_tokens=256, backend="torch", reorder="none")
    k.update(kn)
    ov = patch.SparseAttentionOverride(policy.Knobs(**k), family="wan", total_blocks=4)
    torch.manual_seed(0)
    model = Model(ov)
    training.register_blocks(ov.uid, "wan", model)
    log = tmp_path / "d.jsonl"
    monkeypatch.setenv(patch.DECISION_LOG_ENV, str(log))
    info = patch.ForwardInfo("wan", (1, 16, 32), 0, sigma=0.5, timing_known=True, sigmas=(0.5, 0.9))
    to = {patch.FORWARD_KEY: info, "sigmas": torch.tensor([0.5, 0.9]), "cond_or_uncond": [0]}
    return ov, model, to, log


def test_block_index_comes_from_the_stack_in_forward_and_recompute(tmp_path, monkeypatch):
    import json
    ov, model, to, log = _setup(tmp_path, monkeypatch)
    x = torch.randn(2, 512, 64)
    grads = []
    for ckpt in (False, True):
        model.zero_grad()
        model(x, to, checkpoint=ckpt).square().mean().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):  # recompute took the forward's decisions: identical gradients
        assert torch.allclose(a, b, atol=1e-6)
    d = [json.loads(line) for line in log.read_text().splitlines()]
    plain, ckpt = d[:4], d[4:]
    assert [e["block"] for e in plain] == [0, 1, 2, 3] and not any(e["recompute"] for e in plain)
    assert [e["block"] for e in ckpt if not e["recompute"]] == [0, 1, 2, 3]
    assert sorted(e["block"] for e in ckpt if e["recompute"]) == [0, 1, 2, 3]
    assert all(e["sparse"] == (e["block"] in (1, 2)) for e in d)
    assert training.block_from_stack(ov.uid) is None  # outside any block


def test_samples_of_one_batch_are_split_by_their_own_sigma_and_stay_differentiable(tmp_path, monkeypatch):
    import json
    # dense_steps 25: sigma 0.9 (sample 1) is above the threshold 0.8, sigma 0.5 (sample 0) is not
    ov, model, to, log = _setup(tmp_path, monkeypatch, dense_steps=25)
    patch.run_state(ov.uid).dense_sigma = 0.8
    x = torch.randn(2, 512, 64, requires_grad=True)
    blk = model.blocks[1]
    out = blk(x, to)
    d = json.loads(log.read_text().splitlines()[-1])
    assert d["sparse_rows"] == [True, False] and d["row_sigmas"] == [0.5, 0.9]
    # row 0 through the operator, row 1 through the dense function, each equal to running it alone
    q, k, v = blk.attn.qkv(x).chunk(3, dim=-1)
    from psa_pack.kernels import piecewise_sparse_attention
    want0 = piecewise_sparse_attention(q[:1, None], k[:1, None], v[:1, None], density=0.25, band=1,
                                       backend="torch")[:, 0]
    want1 = dense(q[1:], k[1:], v[1:], 1)
    assert torch.allclose(out[:1] - x[:1], want0, atol=1e-6) and torch.allclose(out[1:] - x[1:], want1, atol=1e-6)
    (g,) = torch.autograd.grad(out.square().sum(), x)
    assert torch.isfinite(g).all() and g[0].abs().sum() > 0 and g[1].abs().sum() > 0

"""RPL: its generalised cross-entropy against a straightforward computation, and RPL as
mariodoebler/test-time-adaptation runs it on CLIP (`classification/methods/rpl.py` on its ZeroShotCLIP) over the
golden tiny ViT and tiny ResNet (tests/fixtures/golden/rpl, made by the driver beside the fixtures, float32 on the
CPU): 24 images in 3 batches of 8, SGD (Nesterov) lr 0.01 on the ViT (continual; episodic with 2 steps and q 0.5)
and 0.003 on the ResNet (continual). After every batch: the logits (TUNED_LOGITS; measured 1.5e-4), the norm
parameters (NORM_PARAMS; 5e-7) and SGD's momentum buffers (GRAD_RTOL of their largest; 2.6e-5)."""
from __future__ import annotations

import pytest
import torch

import shiftlab
from _golden import (
    FEATURES,
    GRAD_RTOL,
    NORM_PARAMS,
    TUNED_LOGITS,
    assert_close,
    batch_fixture,
    fixture_model,
    stream_views,
)
from shiftlab.methods.context import SampleContext

pytestmark = pytest.mark.usefixtures("one_thread")

VARIANTS = {"rpl_vit": {"lr": 0.01}, "rpl_vit_episodic": {"lr": 0.01, "steps": 2, "episodic": True, "q": 0.5},
            "rpl_resnet": {"lr": 0.003}}


def test_generalized_cross_entropy_against_a_straightforward_computation():
    from shiftlab.methods.rpl.method import generalized_cross_entropy
    logits = torch.tensor([[2.0, 0.0, 1.0], [0.0, 0.5, 3.0]], requires_grad=True)
    p = logits.softmax(-1)
    want = torch.stack([(1 - p[0, 0] ** 0.8) / 0.8, (1 - p[1, 2] ** 0.8) / 0.8])
    got = generalized_cross_entropy(logits, 0.8)
    torch.testing.assert_close(got, want)
    # q -> 0 is the cross-entropy; q = 1 the probability's complement
    double = logits.detach().double()
    torch.testing.assert_close(generalized_cross_entropy(double, 1e-7), -double.softmax(-1).max(-1).values.log(),
                               rtol=0, atol=1e-6)
    torch.testing.assert_close(generalized_cross_entropy(logits, 1.0), 1 - p.max(-1).values)


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rpl_matches_their_code_batch_by_batch(golden_vit, golden_model, golden_dir, variant):
    want, info = batch_fixture(golden_dir, "rpl", variant)
    assert info["n_batches"] == 3
    model, names, heads = fixture_model(info, golden_vit, golden_model)
    method = shiftlab.create_method("rpl", model, names, heads=heads, **VARIANTS[variant])
    assert method.tower.parameter_names == info["adapted"]
    assert_close(heads.zeroshot, want["prototypes"], FEATURES, "text head")
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    for b in range(info["n_batches"]):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[8 * b:8 * b + 8]])
        assert_close(torch.stack([o.logits for o in outs]), want[f"{b}/logits"], TUNED_LOGITS, f"batch {b} logits")
        momentum = method.optimizer.state_dict()["state"]
        moved = 0.0
        for i, (name, value) in enumerate(method.tower.norm_state().items()):
            assert_close(value, want[f"{b}/norm/{name}"], NORM_PARAMS, f"batch {b} {name}")
            moved = max(moved, float((want[f"{b}/norm/{name}"] - method._initial_norm[name]).abs().max()))
            theirs_m = want[f"{b}/momentum/{name}"]
            scale = max(float(theirs_m.abs().max()), 1e-3)
            assert_close(momentum[i]["momentum_buffer"], theirs_m, GRAD_RTOL * scale, f"batch {b} momentum {name}")
        assert moved > 10 * NORM_PARAMS, f"batch {b}: the parameters moved"

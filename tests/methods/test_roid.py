"""ROID: its loss, weights and prior correction against straightforward computations, and ROID as
mariodoebler/test-time-adaptation runs it on CLIP (`classification/methods/roid.py` on its ZeroShotCLIP) over the
golden tiny ViT and tiny ResNet (tests/fixtures/golden/roid, made by the driver beside the fixtures, float32 on the
CPU): 24 images in 3 batches of 8, SGD (Nesterov), without the consistency loss. After every batch: the logits
(TUNED_LOGITS), the norm parameters (NORM_PARAMS), SGD's momentum buffers (GRAD_RTOL of their largest;
ROID_RESNET_GRAD_RTOL on the ResNet) and the
running mean prediction (LOSS)."""
from __future__ import annotations

import json
import math

import pytest
import torch

import shiftlab
from _golden import (
    FEATURES,
    GRAD_RTOL,
    LOSS,
    NORM_PARAMS,
    ROID_RESNET_GRAD_RTOL,
    TUNED_LOGITS,
    assert_close,
    stream_views,
)
from shiftlab.methods.catalogue import declarations
from shiftlab.methods.common.roid_training import min_max, prior_corrected, roid_weights, soft_likelihood_ratio
from shiftlab.methods.context import ClassHeads, SampleContext

pytestmark = pytest.mark.usefixtures("one_thread")

VARIANTS = {"roid_vit": {"lr": 0.01},
            "roid_vit_episodic": {"lr": 0.01, "steps": 2, "episodic": True, "use_weighting": False,
                                  "use_prior_correction": False},
            "roid_resnet": {"lr": 0.001, "momentum_src": 0.9, "temperature": 0.5}}


def test_soft_likelihood_ratio_weights_and_prior_against_straightforward_computations():
    logits = torch.tensor([[4.0, 0.0, 1.0], [0.0, 0.5, 0.3], [1.0, 1.0, 1.0]], dtype=torch.float64)
    p = logits.softmax(1)
    q = p.clamp(max=0.99)
    want = torch.stack([-sum(q[i, c] * math.log(q[i, c] / (1 - q[i, c]) + 1e-5) for c in range(3)) for i in range(3)])
    torch.testing.assert_close(soft_likelihood_ratio(logits), want)
    # diversity against a mean prediction [1, 0, 0]: image 0 is the least diverse; certainty: minus the entropy
    mean = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    div = torch.stack([1 - p[i, 0] / p[i].norm() for i in range(3)])
    cert = (p * p.log()).sum(1)
    div, cert = (div - div.min()) / (div.max() - div.min()), (cert - cert.min()) / (cert.max() - cert.min())
    weights, mask = roid_weights(logits, mean, temperature=0.5)
    assert mask.tolist() == (div < div.mean()).tolist() == [True, False, False]
    torch.testing.assert_close(weights, torch.where(mask, 0.0, torch.exp(div * cert / 0.5)))
    # all equal: zeros, not their 0 / 0
    assert min_max(torch.ones(3)).tolist() == [0.0, 0.0, 0.0]
    # the prior correction: logits x (prior + s) / (1 + s C), s = max(1/B, 1/C) / max(prior)
    prior = p.mean(0)
    s = max(1 / 3, 1 / 3) / prior.max()
    torch.testing.assert_close(prior_corrected(logits), logits * (prior + s) / (1 + 3 * s))


def test_consistency_is_refused_in_one_line_before_torch_work():
    with pytest.raises(ValueError, match=r"^roid.use_consistency: True .* only False is offered$"):
        declarations.make_config(declarations.spec("roid"), use_consistency=True)


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_roid_matches_their_code_batch_by_batch(golden_vit, golden_model, golden_dir, variant):
    want = torch.load(golden_dir / "roid" / f"{variant}.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "roid" / "roid.json").read_text())["fixtures"][variant]
    assert info["n_batches"] == 3 and info["reference"]["commit"].startswith("8b2ed63")
    if info["model"] == "shiftlab-tiny-vit":
        model, names, heads = golden_vit
    else:
        model, names = golden_model
        heads = ClassHeads(model, names)
    method = shiftlab.create_method("roid", model, names, heads=heads, **VARIANTS[variant])
    assert method.tower.parameter_names == info["adapted"]
    assert_close(heads.zeroshot, want["prototypes"], FEATURES, "text head")
    grad_rtol = GRAD_RTOL if info["model"] == "shiftlab-tiny-vit" else ROID_RESNET_GRAD_RTOL
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    for b in range(info["n_batches"]):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[8 * b:8 * b + 8]])
        assert_close(torch.stack([o.logits for o in outs]), want[f"{b}/logits"], TUNED_LOGITS, f"batch {b} logits")
        assert_close(method.class_probs, want[f"{b}/class_probs"], LOSS, f"batch {b} mean prediction")
        momentum = method.optimizer.state_dict()["state"]
        moved = 0.0
        for i, (name, value) in enumerate(method.tower.norm_state().items()):
            assert_close(value, want[f"{b}/norm/{name}"], NORM_PARAMS, f"batch {b} {name}")
            moved = max(moved, float((want[f"{b}/norm/{name}"] - method._initial_norm[name]).abs().max()))
            theirs_m = want[f"{b}/momentum/{name}"]
            scale = max(float(theirs_m.abs().max()), 1e-3)
            assert_close(momentum[i]["momentum_buffer"], theirs_m, grad_rtol * scale, f"batch {b} momentum {name}")
        assert moved > 10 * NORM_PARAMS, f"batch {b}: the parameters moved"


@pytest.mark.parametrize("name", ["roid", "cmf"])
def test_the_adaptive_attack_target_is_the_batch_prediction_before_its_step(name, tiny_model):
    """`--attack-target adaptive` (mode state) on ROID and CMF: the batch's prior-corrected logits through the norm
    parameters held when it arrives, differentiable in the pixels, leaving the state alone; what the adapting batch
    then outputs (their outputs are the adapting forward's)."""
    from shiftlab.attacks.adaptive import method_target
    model = tiny_model
    names = ["cat", "dog", "car", "tree", "boat"]
    method = shiftlab.create_method(name, model, names, lr=0.01)
    x = torch.rand(3, 1, 3, model.image_size, model.image_size, generator=torch.Generator().manual_seed(0))
    before = method.state_dict()
    target = method_target(method, [1, 2, 3], run_seed=0)
    logits = target(x[:, 0].clone().requires_grad_(True))
    assert all(torch.equal(v, method.tower.norm_state()[k]) for k, v in before["norm"].items())
    outs = method.adapt_batch([SampleContext(model, method.heads, model.normalize(v)) for v in x])
    torch.testing.assert_close(torch.stack([o.logits for o in outs]), logits.detach(), rtol=0, atol=1e-5)
    # the correction is in the differentiable path: the pixels' gradient reaches it
    pixels = x[:, 0].clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(target(pixels).max(-1).values.sum(), pixels)
    assert grad.abs().sum() > 0
    assert not torch.allclose(logits, method.logits(model.normalize(x[:, 0])))     # not the uncorrected logits


def test_a_batch_of_one_image_adapts_without_nan(tiny_model):
    """Their min-max normalisation divides 0 by 0 on a batch of one (NaN weights, then NaN parameters); here the
    image keeps weight 1 and the parameters stay finite."""
    model = tiny_model
    method = shiftlab.create_method("roid", model, ["cat", "dog", "car"], lr=0.01)
    x = torch.rand(1, 3, model.image_size, model.image_size, generator=torch.Generator().manual_seed(1))
    (out,) = method.adapt_batch([SampleContext(model, method.heads, model.normalize(x))])
    assert out.extras["weight"] == 1.0 and torch.isfinite(out.logits).all()
    moved = [not torch.equal(v, method._initial_norm[k]) for k, v in method.tower.norm_state().items()]
    assert all(torch.isfinite(v).all() for v in method.tower.norm_state().values()) and any(moved)

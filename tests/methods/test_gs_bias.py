"""GS-Bias: its bias tuning against straightforward computations, its refusals, and its authors' own code
(tests/fixtures/golden/gs_bias, made by the driver beside the fixture from hzhxmu/GS-Bias's `run_gsbias.GSBias` on
the golden tiny ViT, float32 on the CPU).

Golden tolerances (tests/_golden.py): the class head FEATURES; losses LOSS; the bias gradients PARAMS x 10 (a
probability difference, O(1e-2), summed over 3 views or K patches); the final logits LOGITS + alpha x the
gradient tolerance x steps (the bias is alpha times the summed gradients, alpha 50); selections and the number of
steps exactly (after a margin check of the early stop: tolerances.json)."""
from __future__ import annotations

import json

import pytest
import torch

import shiftlab
from _golden import FEATURES, LOGITS, LOSS, PARAMS, assert_close, check_margin, fixture_tolerances
from shiftlab import SampleContext
from shiftlab.methods.gs_bias.method import top_patches, tune_biases
from shiftlab.methods.gs_bias.spec import GSBiasConfig
from shiftlab.methods.head_kinds import text_head

pytestmark = pytest.mark.usefixtures("one_thread")
CLASSNAMES = ["cat", "dog", "car", "tree", "boat"]


def _logits(n: int, c: int, seed: int, scale: float = 5.0) -> torch.Tensor:
    return scale * torch.randn(n, c, generator=torch.Generator().manual_seed(seed))


def test_the_patches_do_not_depend_on_the_spatial_bias():
    """A bias shifts each class's column by one value: the softmax over patches, and so the top-K, are unchanged."""
    patch_logits = _logits(16, 7, 0)
    bias = _logits(1, 7, 1, scale=30.0)
    assert torch.equal(top_patches(patch_logits, 5), top_patches(patch_logits + bias, 5))
    score = torch.stack([sum(patch_logits[p, c].exp() / patch_logits[:, c].exp().sum() for c in range(7))
                         for p in range(16)])
    assert torch.equal(top_patches(patch_logits, 5), torch.topk(score, 5).indices)


def test_one_step_is_plain_gradient_descent_on_each_loss():
    """steps=1: one update, b = -alpha dL/db at zero; the prediction adds 0.9 b + 0.1 x 0 per bias."""
    views, patches = _logits(10, 6, 2), _logits(9, 6, 3)
    cfg = GSBiasConfig(alpha=3.0, beta=2.0, top_k=4, steps=1, selection_p=0.3)
    res = tune_biases(views, patches, cfg)
    g = torch.zeros(6, requires_grad=True)
    kept = torch.argsort(-(views.softmax(-1) * views.log_softmax(-1)).sum(-1))[:3]   # the 3 lowest entropies
    p = (views[kept] + g).softmax(-1).mean(0)
    (-(p * p.log()).sum()).backward()
    s = torch.zeros(6, requires_grad=True)
    q = (patches[top_patches(patches, 4)] + s).softmax(-1).mean(0)
    (-(q * q.log()).sum()).backward()
    assert sorted(res.selected[0].tolist()) == sorted(kept.tolist()) and len(res.grads_g) == 1
    assert_close(res.global_bias, -0.9 * 3.0 * g.grad, 1e-5, "global bias")
    assert_close(res.spatial_bias, -0.9 * 2.0 * s.grad, 1e-5, "spatial bias")
    assert_close(res.logits, views[0] - 0.9 * (3.0 * g.grad + 2.0 * s.grad), 1e-5, "logits")


def test_the_stop_and_the_step_budget():
    views, patches = _logits(10, 6, 4), _logits(9, 6, 5)
    full = tune_biases(views, patches, GSBiasConfig(alpha=1.0, beta=1.0, top_k=4, steps=5, stop_change=1e9))
    assert len(full.losses_g) == 5 and len(full.grads_g) == 5
    # any change of the global loss stops the run at its second step, before a second update
    stopped = tune_biases(views, patches, GSBiasConfig(alpha=1.0, beta=1.0, top_k=4, steps=5, stop_change=0.0))
    assert len(stopped.losses_g) == 2 and len(stopped.grads_g) == 1
    # the stopped run predicts with its step-2 biases: 0.9 b_1 + 0.1 c_0 (c_0 = 0)
    one = tune_biases(views, patches, GSBiasConfig(alpha=1.0, beta=1.0, top_k=4, steps=1))
    assert_close(stopped.global_bias, one.global_bias, 1e-6, "stopped bias")


def test_refusals(tiny_model, tiny_vit_model):
    with pytest.raises(ValueError, match="ViT image tower only, and shiftlab-tiny is a ResNet"):
        shiftlab.create_method("gs_bias", tiny_model, CLASSNAMES)
    with pytest.raises(ValueError, match="17 is more than the 16 patch tokens"):
        shiftlab.create_method("gs_bias", tiny_vit_model, CLASSNAMES, top_k=17)


def test_a_sample_runs_through_the_method(tiny_vit_model):
    method = shiftlab.create_method("gs_bias", tiny_vit_model, CLASSNAMES, top_k=4)
    views = torch.randn(8, 3, 64, 64, generator=torch.Generator().manual_seed(6))
    out = method.predict_context(SampleContext(tiny_vit_model, method.heads, views))
    res = method.tune(SampleContext(tiny_vit_model, method.heads, views))
    assert torch.equal(out.logits, res.logits) and 1 <= out.extras["steps"] <= 5
    zs = tiny_vit_model.logit_scale * tiny_vit_model.encode_views(views[:1])[0] @ text_head(method).T
    assert_close(res.logits - res.global_bias - res.spatial_bias, zs, 1e-4, "zero-shot part")


# -- golden: their run_gsbias.GSBias ------------------------------------------------------------------------

@pytest.mark.golden
@pytest.mark.parametrize("variant", ["imagenet_r", "steps"])
def test_gs_bias_is_their_code(golden_dir, golden_vit, variant):
    want = torch.load(golden_dir / "gs_bias" / "gs_bias.pt", weights_only=True)
    info = json.loads((golden_dir / "gs_bias" / "gs_bias.json").read_text())["fixtures"][variant]
    tol = fixture_tolerances("gs_bias")
    model, names, heads = golden_vit
    cfg = info["cfg"]
    method = shiftlab.create_method("gs_bias", model, names, heads=heads, precision="fp32", text_head="zeroshot",
                                    logit_scale=100.0, alpha=cfg["alpha"], beta=cfg["beta"], top_k=cfg["K"],
                                    steps=cfg["T"], selection_p=info["selection_p"])
    assert info["template"] == ["a photo of a {}."]
    assert_close(text_head(method), want[f"{variant}/text"], FEATURES, "class head")
    inputs = torch.load(golden_dir / "inputs.pt", weights_only=True)["views_unit"]
    grad_tol = PARAMS * 10
    for i in range(info["n_samples"]):
        key = f"{variant}/{i}"
        res = method.tune(SampleContext(model, heads, model.normalize(inputs[i])))
        steps = info["steps_run"][str(i)]
        assert len(res.losses_g) == steps, f"{key}: steps"
        # the stop's decision: each step's relative change away from the 25% line by more than the loss tolerance
        first = float(want[f"{key}/loss_g"][0])
        for loss in want[f"{key}/loss_g"][1:].tolist():
            check_margin(abs(abs((loss - first) / first) * 100 - cfg.get("stop", 25.0)), tol["stop_percent"],
                         f"{key}: stop")
        assert_close(torch.tensor(res.losses_g), want[f"{key}/loss_g"], LOSS, f"{key}: loss_g")
        assert_close(torch.tensor(res.losses_s), want[f"{key}/loss_s"], LOSS, f"{key}: loss_s")
        for s, sel in enumerate(res.selected):
            assert set(sel.tolist()) == set(want[f"{key}/selected"][s].tolist()), f"{key}: selected, step {s}"
        assert_close(torch.stack(res.grads_g), want[f"{key}/grad_g"], grad_tol, f"{key}: grad_g")
        assert_close(torch.stack(res.grads_s), want[f"{key}/grad_s"], grad_tol, f"{key}: grad_s")
        updates = len(res.grads_g)
        logit_tol = LOGITS + (cfg["alpha"] + cfg["beta"]) * grad_tol * updates
        assert_close(res.logits, want[f"{key}/logits"], logit_tol, f"{key}: logits")
        assert int(res.logits.argmax()) == int(want[f"{key}/logits"].argmax()), f"{key}: prediction"

"""ROID: its loss, weights and prior correction against straightforward computations, and ROID as
mariodoebler/test-time-adaptation runs it on CLIP (`classification/methods/roid.py` on its ZeroShotCLIP) over the
golden tiny ViT and tiny ResNet (tests/fixtures/golden/roid, made by the driver beside the fixtures, float32 on the
CPU): 24 images in 3 batches of 8, SGD (Nesterov), without the consistency loss and, in
tests/fixtures/golden/roid_consistency, with it (their default; their global generator seeded before each update as
shiftlab seeds its generator). After every batch: the logits
(TUNED_LOGITS), the norm parameters (NORM_PARAMS), SGD's momentum buffers (GRAD_RTOL of their largest;
ROID_RESNET_GRAD_RTOL on the ResNet) and the
running mean prediction (LOSS)."""
from __future__ import annotations

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
    batch_fixture,
    fixture_model,
    stream_views,
)
from shiftlab.methods.common.roid_training import min_max, prior_corrected, roid_weights, soft_likelihood_ratio
from shiftlab.methods.context import SampleContext

pytestmark = pytest.mark.usefixtures("one_thread")

VARIANTS = {"roid_vit": {"lr": 0.01, "use_consistency": False},
            "roid_vit_episodic": {"lr": 0.01, "steps": 2, "episodic": True, "use_weighting": False,
                                  "use_consistency": False, "use_prior_correction": False},
            "roid_resnet": {"lr": 0.001, "momentum_src": 0.9, "temperature": 0.5, "use_consistency": False}}
# tests/fixtures/golden/roid_consistency: their default consistency loss on, their global generator seeded per update
CONSISTENCY_VARIANTS = {"roid_vit_consistency": {"lr": 0.01},
                        "roid_vit_consistency_episodic": {"lr": 0.01, "steps": 2, "episodic": True}}
GOLDEN = [("roid", v, o) for v, o in sorted(VARIANTS.items())] + \
    [("roid_consistency", v, o) for v, o in sorted(CONSISTENCY_VARIANTS.items())]


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


def test_their_augmentation_reflect_padded_without_blur_or_noise_draws_what_torchvision_draws():
    """get_tta_transforms(img_size, padding_mode="reflect", cotta_augs=False) with torchvision's random transforms
    on torch's global generator (the colour jitter written out on it), against `tta_transform` with a generator
    seeded alike: no blur sigma and no noise drawn (their whole loss is compared in the golden test)."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as TF

    from shiftlab.methods.common.tta_transforms import STRONG as r
    from shiftlab.methods.common.tta_transforms import tta_transform
    images = torch.rand(2, 3, 20, 20, generator=torch.Generator().manual_seed(1))
    adjust = [(TF.adjust_brightness, r.brightness), (TF.adjust_contrast, r.contrast),
              (TF.adjust_saturation, r.saturation), (TF.adjust_hue, r.hue),
              (lambda x, f: TF.adjust_gamma(x.clamp(1e-8, 1.0), f), r.gamma)]

    def global_pipeline(x):
        x = x.clamp(0, 1)
        for i in torch.randperm(5).tolist():
            fn, (lo, hi) = adjust[i]
            x = fn(x, torch.tensor(1.0).uniform_(lo, hi).item())
        x = T.Pad(10, padding_mode="reflect")(x)
        x = T.RandomAffine(degrees=list(r.degrees), translate=(1 / 16, 1 / 16), scale=r.scale,
                           interpolation=T.InterpolationMode.BILINEAR, fill=0)(x)
        return T.RandomHorizontalFlip(0.5)(T.CenterCrop(20)(x)).clamp(0, 1)
    for seed in range(3):
        mine = tta_transform(images, torch.Generator().manual_seed(seed), padding_mode="reflect", cotta_augs=False)
        torch.manual_seed(seed)
        torch.testing.assert_close(mine, global_pipeline(images), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"^padding_mode: 'zeros' is not one of edge, reflect$"):
        tta_transform(images, torch.Generator(), padding_mode="zeros")


def test_consistency_is_their_symmetric_cross_entropy_on_the_kept_images(tiny_model):
    """The step's loss with `use_consistency` = the loss without + sum over the kept images of weight x SCE(logits
    of their augmentation, their logits) / B, the augmentation drawn from `update_generator(augment_seed, k)`."""
    from shiftlab.methods.common.ema_teacher import update_generator
    from shiftlab.methods.common.roid_training import symmetric_cross_entropy
    from shiftlab.methods.common.tta_transforms import tta_transform
    x, r = torch.tensor([[2.0, 0.0, -1.0]]), torch.tensor([[0.0, 1.0, 0.5]])
    p, q = x.softmax(1), r.softmax(1)
    torch.testing.assert_close(symmetric_cross_entropy(x, r),
                               -0.5 * (q * p.log()).sum(1) - 0.5 * (p * q.log()).sum(1))
    model = tiny_model
    names = ["cat", "dog", "car", "tree", "boat"]
    x01 = torch.rand(6, 3, model.image_size, model.image_size, generator=torch.Generator().manual_seed(2))
    pixels = model.normalize(x01)
    on = shiftlab.create_method("roid", model, names, lr=0.01, augment_seed=5)
    off = shiftlab.create_method("roid", model, names, lr=0.01, use_consistency=False)
    on.updates = 3
    logits = on.logits(pixels)
    loss, weights = on.loss(logits, pixels)
    base, _ = off.loss(off.logits(pixels))
    kept = weights > 0
    augmented = tta_transform(x01[kept], update_generator(5, 3), padding_mode="reflect", cotta_augs=False)
    want = base + (symmetric_cross_entropy(on.logits(model.normalize(augmented)), logits[kept])
                   * weights[kept]).sum() / 6
    assert 0 < int(kept.sum()) < 6
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    assert float((loss - base).detach()) > 1e-4


@pytest.mark.golden
@pytest.mark.parametrize(("folder", "variant", "options"), GOLDEN, ids=[v for _, v, _ in GOLDEN])
def test_roid_matches_their_code_batch_by_batch(golden_vit, golden_model, golden_dir, folder, variant, options):
    want, info = batch_fixture(golden_dir, folder, variant)
    assert info["n_batches"] == 3 and info["reference"]["commit"].startswith("8b2ed63")
    consistency = info["argv"][info["argv"].index("ROID.USE_CONSISTENCY") + 1]
    assert consistency is options.get("use_consistency", True)
    options = {**options, "augment_seed": info.get("seed", 0)}
    model, names, heads = fixture_model(info, golden_vit, golden_model)
    method = shiftlab.create_method("roid", model, names, heads=heads, **options)
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

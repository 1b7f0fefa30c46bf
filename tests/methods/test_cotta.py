"""CoTTA: its consistency loss, EMA and restore against straightforward computations, its augmentation against
torchvision's transforms drawing from torch's global generator, and CoTTA as mariodoebler/test-time-adaptation runs
it on CLIP (`classification/methods/cotta.py` on its ZeroShotCLIP) over the golden tiny ViT and tiny ResNet
(tests/fixtures/golden/cotta, made by the driver beside the fixtures, float32 on the CPU): 24 images in 3 batches of
8, their draws seeded per update as shiftlab's (the driver's docstring). After every batch: the outputs (the
teacher's; TUNED_LOGITS), the anchor's confidence (LOGITS), the first 16 entries of every adapted student and teacher
weight (NORM_PARAMS) and of SGD's momentum (GRAD_RTOL of the largest), each weight's summed distance from the source
and how many of its entries are at their source value (the stochastic restore's draws): tests/_mean_teacher_golden.py.
Measured: outputs 1.1e-5 (ViT), 4.9e-4 (ResNet), weights 1.5e-6, teacher 3.1e-7."""
from __future__ import annotations

import json

import pytest
import torch

import shiftlab
from _golden import FEATURES, LOGITS, TUNED_LOGITS, assert_close, batch_fixture, fixture_model, stream_views
from _mean_teacher_golden import check_weights
from shiftlab.methods.context import SampleContext

pytestmark = pytest.mark.usefixtures("one_thread")

VARIANTS = {
    "cotta_vit": {"lr": 0.01, "confidence_threshold": 1.0, "restore_probability": 0.1, "teacher_momentum": 0.9,
                  "n_augmentations": 4},
    "cotta_vit_episodic_cifar": {"lr": 0.01, "steps": 2, "episodic": True, "confidence_threshold": 1.0,
                                 "restore_probability": 0.05, "teacher_momentum": 0.8, "loss": "teacher_ce",
                                 "n_augmentations": 2},
    "cotta_vit_plain": {"lr": 0.01, "confidence_threshold": 0.0, "restore_probability": 0.05,
                        "teacher_momentum": 0.5},
    "cotta_resnet": {"lr": 0.003, "confidence_threshold": 1.0, "restore_probability": 0.02, "teacher_momentum": 0.9,
                     "n_augmentations": 2},
}


def test_consistency_loss_against_a_straightforward_computation():
    from shiftlab.methods.cotta.method import consistency_loss
    s = torch.tensor([[2.0, 0.0, 1.0], [0.0, 0.5, 3.0]])
    t = torch.tensor([[1.0, 1.0, 0.0], [0.0, 2.0, 1.0]])
    ps, pt = s.softmax(-1), t.softmax(-1)
    ce_t = -(pt * ps.log()).sum(1)
    ce_s = -(ps * pt.log()).sum(1)
    torch.testing.assert_close(consistency_loss(s, t, "teacher_ce"), ce_t)
    torch.testing.assert_close(consistency_loss(s, t, "symmetric"), 0.5 * ce_t + 0.5 * ce_s)


def test_ema_and_restore_against_a_straightforward_computation():
    from shiftlab.methods.common.ema_teacher import ema_update_, stochastic_restore_, update_generator
    teacher, student = [torch.tensor([1.0, 2.0])], [torch.tensor([3.0, -2.0])]
    ema_update_(teacher, student, 0.75)
    torch.testing.assert_close(teacher[0], torch.tensor([1.5, 1.0]))
    p, p0 = torch.arange(1000.0), torch.zeros(1000)
    stochastic_restore_([p], [p0], 0.3, update_generator(4, 2))
    mask = torch.rand(1000, generator=update_generator(4, 2)) < 0.3
    assert torch.equal(p == 0, mask | (torch.arange(1000) == 0))
    assert 250 < int(mask.sum()) < 350


@pytest.mark.parametrize("soft", [False, True])
def test_augmentation_draws_what_torchvision_draws_from_the_global_generator(soft):
    """The pipeline of get_tta_transforms with torchvision's random transforms (drawing from torch's global
    generator) and the colour jitter written out on the global generator, against `tta_transform` with a generator
    seeded alike (their whole pipeline is compared in the golden test)."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as TF

    from shiftlab.methods.common.tta_transforms import SOFT, STRONG, tta_transform
    r = SOFT if soft else STRONG
    images = torch.rand(2, 3, 20, 20, generator=torch.Generator().manual_seed(1))
    adjust = [(TF.adjust_brightness, r.brightness), (TF.adjust_contrast, r.contrast),
              (TF.adjust_saturation, r.saturation), (TF.adjust_hue, r.hue),
              (lambda x, f: TF.adjust_gamma(x.clamp(1e-8, 1.0), f), r.gamma)]

    def global_pipeline(x):
        x = x.clamp(0, 1)
        for i in torch.randperm(5).tolist():
            fn, (lo, hi) = adjust[i]
            x = fn(x, torch.tensor(1.0).uniform_(lo, hi).item())
        x = T.Pad(10, padding_mode="edge")(x)
        x = T.RandomAffine(degrees=list(r.degrees), translate=(1 / 16, 1 / 16), scale=r.scale,
                           interpolation=T.InterpolationMode.BILINEAR, fill=0)(x)
        x = T.GaussianBlur(5, sigma=list(r.blur_sigma))(x)
        x = T.RandomHorizontalFlip(0.5)(T.CenterCrop(20)(x))
        return (x + (torch.randn(x.size()) * 0.005 + 0.0)).clamp(0, 1)
    outs = []
    for seed in range(4):
        mine = tta_transform(images, torch.Generator().manual_seed(seed), soft=soft)
        torch.manual_seed(seed)
        torch.testing.assert_close(mine, global_pipeline(images), rtol=0, atol=0)
        outs.append(mine)
    assert not torch.equal(outs[0], outs[1])


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cotta_matches_their_code_batch_by_batch(golden_vit, golden_model, golden_dir, variant):
    want, info = batch_fixture(golden_dir, "cotta", variant)
    assert info["n_batches"] == 3
    model, names, heads = fixture_model(info, golden_vit, golden_model)
    method = shiftlab.create_method("cotta", model, names, heads=heads, augment_seed=info["seed"],
                                    **VARIANTS[variant])
    assert method.tower.parameter_names == info["adapted"]
    assert_close(heads.zeroshot, want["prototypes"], FEATURES, "text head")
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    for b in range(info["n_batches"]):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[8 * b:8 * b + 8]])
        assert_close(torch.stack([o.logits for o in outs]), want[f"{b}/logits"], TUNED_LOGITS, f"batch {b} logits")
        assert abs(outs[0].extras["anchor_confidence"] - float(want[f"{b}/anchor_confidence"])) < LOGITS
        check_weights(method, want, b, info["head"])


def test_adaptive_target_is_the_teacher_it_holds_without_a_step(golden_vit, golden_dir):
    """`--attack-target adaptive`: the teacher's logits of view 0 with the state held when the batch arrives, no
    update; they are the batch's outputs when the anchor is confident (plain teacher)."""
    from shiftlab.attacks.adaptive import method_target
    model, names, heads = golden_vit
    method = shiftlab.create_method("cotta", model, names, heads=heads, confidence_threshold=0.0,
                                    restore_probability=0.05, teacher_momentum=0.5)
    views = stream_views(golden_dir, 1)
    method.adapt_batch([SampleContext(model, heads, model.normalize(v)) for v in views[:4]])  # a state that moved
    before = json.dumps({k: str(v) for k, v in method.state_dict().items()})
    x = torch.stack([v[0] for v in views[4:8]]).requires_grad_(True)
    logits = method_target(method, [4, 5, 6, 7], run_seed=0)(x)
    assert logits.requires_grad and json.dumps({k: str(v) for k, v in method.state_dict().items()}) == before
    outs = method.adapt_batch([SampleContext(model, heads, model.normalize(v)) for v in views[4:8]])
    assert not outs[0].extras["augmented"]
    torch.testing.assert_close(torch.stack([o.logits for o in outs]), logits.detach(), rtol=0, atol=1e-4)

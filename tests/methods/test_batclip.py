"""BATCLIP: its three loss terms against loops written as their losses.py reads, its loss scaling against torch's
GradScaler, both towers' norms as its adapted state, and its authors' code (sarthaxxxxx/BATCLIP: `methods/ours.py`
on their `ZeroShotCLIP`) on the golden tiny ViT and tiny ResNet (tests/fixtures/golden/batclip, made by the driver
beside the fixtures, float32 on the CPU).

Golden: 24 images in 3 batches of 8, continual; their ImageNet-C config (AdamW 5e-4), two steps per batch at 5e-3,
and Adam on the ResNet. After every batch: the logits, every adapted parameter of both towers (the text tower's
LayerNorms included) and the three terms of the batch's first step (tolerances.json beside the fixtures)."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import assert_close, assert_top1_margin, fixture_model, fixture_tolerances, stream_views
from shiftlab.methods.batclip.method import batclip_loss, loss_scale_after
from shiftlab.methods.context import SampleContext

pytestmark = pytest.mark.usefixtures("one_thread")

NAMES = ["cat", "dog", "car", "tree", "boat"]
# the driver's variants (tests/fixtures/golden/batclip/batclip.json), as shiftlab configs
VARIANTS = {"batclip_vit": {}, "batclip_vit_steps2": {"lr": 0.005, "steps": 2},
            "batclip_resnet": {"optimizer": "adam", "lr": 0.002}}


def test_the_loss_is_entropy_minus_alignment_minus_dispersion_as_their_loops():
    gen = torch.Generator().manual_seed(0)
    logits, features = torch.randn(6, 4, generator=gen, dtype=torch.float64), torch.randn(6, 3, generator=gen,
                                                                                          dtype=torch.float64)
    logits[:, 2] += 5                               # classes 2 and 0/1/3: a few images each, class order unsorted
    logits[0, 0] = logits[3, 1] = 20
    text = F.normalize(torch.randn(4, 3, generator=gen, dtype=torch.float64), dim=-1)
    labels = logits.argmax(1)
    present = sorted(set(labels.tolist()))
    assert len(present) == 3
    means = {k: features[labels == k].mean(0) for k in present}
    i2t = sum(float(means[k] @ text[k]) for k in present) / len(present)
    unit = {k: means[k] / means[k].norm() for k in present}
    inter = sum(1 - float(unit[k] @ unit[j]) for k in present for j in present if k != j)
    p = logits.softmax(1)
    ent = float(-(p * p.log()).sum(1).mean())
    loss, terms = batclip_loss(logits, features, text)
    assert terms == pytest.approx({"entropy": ent, "i2t": i2t, "inter_mean": inter}, abs=1e-12)
    assert float(loss) == pytest.approx(ent - i2t - inter, abs=1e-12)
    # one predicted class: no pair, no dispersion
    one_class = torch.tensor([[1.0, 0.0]], dtype=torch.float64).repeat(6, 1)
    assert batclip_loss(one_class, features, text[:2])[1]["inter_mean"] == 0


def test_the_loss_scale_follows_torchs_grad_scaler():
    """`loss_scale_after` against the update GradScaler.update applies (`torch._amp_update_scale_`: growth 2,
    backoff 0.5, here growth interval 3) over finite and overflowing steps, from their init scale 1000 (torch's
    GradScaler object itself is not run: its step imports torch._dynamo, seconds for nothing here)."""
    scale_t, tracker = torch.full((), 1000.0), torch.zeros((), dtype=torch.int32)
    scale, good = 1000.0, 0
    for finite in (True, True, True, True, False, True, True, True, False, False):
        torch._amp_update_scale_(scale_t, tracker, torch.full((), 0.0 if finite else 1.0), 2.0, 0.5, 3)
        scale, good = loss_scale_after(scale, good, finite, growth_interval=3)
        assert (float(scale_t), int(tracker)) == (scale, good)
    assert scale == 1000.0 * 2 * 2 / 2 / 2 / 2


def test_both_towers_norms_adapt_and_the_head_follows_the_text_tower(tiny_model):
    model = tiny_model
    shared = {k: v.clone() for k, v in model.clip.state_dict().items()}
    method = shiftlab.create_method("batclip", model, NAMES, lr=0.01)
    names = method.tower.parameter_names
    assert names[0].startswith("visual.") and names[-2:] == ["ln_final.weight", "ln_final.bias"]
    assert {n.split(".")[0] for n in names} == {"visual", "transformer", "ln_final"}
    assert all(n in shared for n in names)                                  # open_clip's CLIP names
    torch.testing.assert_close(method.head, method.heads.zeroshot, rtol=0, atol=1e-6)
    size = model.image_size
    x = model.normalize(torch.rand(4, 3, size, size, generator=torch.Generator().manual_seed(1)))
    outs = method.adapt_batch([SampleContext(model, method.heads, v[None]) for v in x])
    assert {"entropy", "i2t", "inter_mean", "loss"} <= set(outs[0].extras)
    state = method.tower.norm_state()
    assert all(not torch.equal(state[n], shared[n]) for n in ("ln_final.weight", "visual.bn1.weight"))
    assert all(torch.equal(v, model.clip.state_dict()[k]) for k, v in shared.items())   # the shared model untouched
    assert not torch.allclose(method.head, method.heads.zeroshot, atol=1e-4)       # re-encoded by the adapted tower
    with torch.no_grad():
        want = F.normalize(method.tower.text_features(method.tokens), dim=-1)
    torch.testing.assert_close(method.head, want, rtol=0, atol=0)
    method.reset()
    torch.testing.assert_close(method.head, method.heads.zeroshot, rtol=0, atol=1e-6)



def test_an_fp16_step_scales_the_loss_and_skips_an_overflowing_one_as_their_grad_scaler(tiny_vit_model):
    """Under fp16 (CUDA only, so the policy is stood in for here): the step equals the unscaled one, a step whose
    gradients overflow leaves the parameters and AdamW alone and halves the scale, and the scale is state."""
    import contextlib
    import types
    model = tiny_vit_model
    x = model.normalize(torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(2)))
    plain, scaled = (shiftlab.create_method("batclip", model, NAMES, lr=0.01) for _ in range(2))
    scaled.precision = types.SimpleNamespace(loss_scaling=True, autocast=contextlib.nullcontext)
    for method in (plain, scaled):
        method.adapt(x)
    for k, v in plain.tower.norm_state().items():
        torch.testing.assert_close(scaled.tower.norm_state()[k], v, rtol=0, atol=1e-6)
    assert (scaled.loss_scale, scaled.good_steps) == (1000.0, 1)
    before, moments = scaled.tower.norm_state(), scaled.optimizer.state_dict()["state"][0]["exp_avg"].clone()
    image, text = scaled.features(x)
    scaled.step((image.sum() + text.sum()) * float("inf"))
    assert all(torch.equal(v, before[k]) for k, v in scaled.tower.norm_state().items())
    assert torch.equal(scaled.optimizer.state_dict()["state"][0]["exp_avg"], moments)
    assert scaled.state_dict()["extra"] == {"loss_scale": 500.0, "good_steps": 0}

# -- their code (tests/fixtures/golden/batclip) ---------------------------------------------------------------


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_batclip_matches_their_code_batch_by_batch(golden_vit, golden_model, golden_dir, variant):
    tol = fixture_tolerances("batclip")
    want = torch.load(golden_dir / "batclip" / f"{variant}.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "batclip" / "batclip.json").read_text())
    assert info["reference"]["commit"] == "ba2e3381873ef58e76a90148ee3835864349e985"
    info = info["fixtures"][variant]
    model, names, heads = fixture_model(info, golden_vit, golden_model)
    method = shiftlab.create_method("batclip", model, names, heads=heads, **VARIANTS[variant])
    assert (info["optimizer"].lower(), info["lr"], info["steps"]) == (method.config.optimizer, method.config.lr,
                                                                     method.config.steps)
    assert method.tower.parameter_names == info["adapted"]
    assert_close(method.head, want["prototypes"], tol["params"], "text head before any update")
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    for b in range(info["n_batches"]):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[8 * b:8 * b + 8]])
        logits = torch.stack([o.logits for o in outs])
        assert_close(logits, want[f"{b}/logits"], tol["logits"], f"batch {b} logits")
        assert_top1_margin(want[f"{b}/logits"], tol["logits"], f"batch {b}")
        assert torch.equal(logits.argmax(1), want[f"{b}/logits"].argmax(1))
        for key in ("entropy", "i2t", "inter_mean"):
            assert outs[0].extras[key] == pytest.approx(float(want[f"{b}/{key}"]), abs=tol["loss"]), key
        moved = 0.0
        for name, value in method.tower.norm_state().items():
            assert_close(value, want[f"{b}/param/{name}"], tol["params"], f"batch {b} {name}")
            moved = max(moved, float((want[f"{b}/param/{name}"] - method._initial_norm[name]).abs().max()))
        assert moved > 20 * tol["params"], f"batch {b}: the parameters moved"

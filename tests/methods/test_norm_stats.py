"""Test-time normalisation (norm_stats): its BatchNorm statistics against a straightforward computation, the ViT
unchanged (zero-shot), the "ema" state across a resume, and the method as mariodoebler/test-time-adaptation runs it
on CLIP (`classification/methods/norm.py` on `bn.py`: BNTest, BNAlpha, BNEMA on its ZeroShotCLIP) over the golden
tiny ResNet CLIP (tests/fixtures/golden/norm_stats, made by the driver beside the fixtures, float32 on the CPU).

Golden: 24 images in 3 consecutive batches of 8: each batch's logits (LOGITS) and, for "ema", every BatchNorm
layer's running statistics after every batch (FEATURES, relative to the largest value of the layer's statistic).
"""
from __future__ import annotations

import json

import pytest
import torch

import shiftlab
from _golden import FEATURES, LOGITS, assert_close, stream_views
from shiftlab.methods.context import SampleContext

pytestmark = pytest.mark.usefixtures("one_thread")

CLASSES = ["cat", "dog", "car", "bus"]
VARIANTS = {"norm_test": {}, "norm_alpha": {"statistics": "alpha", "alpha": 0.3}, "norm_ema": {"statistics": "ema"}}


def contexts(model, method, pixels):
    return [SampleContext(model, method.heads, pixels[i:i + 1]) for i in range(pixels.shape[0])]


def logits_of(outs):
    return torch.stack([o.logits for o in outs])


def test_batch_and_alpha_statistics_against_a_straightforward_batch_norm():
    from shiftlab.methods.common.norm_statistics import StatsBatchNorm
    bn = torch.nn.BatchNorm2d(3).eval()
    with torch.no_grad():
        bn.running_mean.copy_(torch.tensor([0.5, -1.0, 2.0]))
        bn.running_var.copy_(torch.tensor([2.0, 0.5, 1.5]))
        bn.weight.copy_(torch.tensor([1.5, 0.5, -1.0]))
        bn.bias.copy_(torch.tensor([0.1, 0.2, 0.3]))
    x = torch.randn(4, 3, 5, 5, generator=torch.Generator().manual_seed(0))
    w, b = bn.weight[None, :, None, None], bn.bias[None, :, None, None]
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
    want = (x - mean[None, :, None, None]) / torch.sqrt(var[None, :, None, None] + bn.eps) * w + b
    torch.testing.assert_close(StatsBatchNorm(bn, "batch", 0.1, 0.1)(x), want, rtol=0, atol=1e-5)
    a = 0.25
    m = (1 - a) * bn.running_mean + a * mean
    v = (1 - a) * bn.running_var + a * x.var((0, 2, 3), unbiased=True)
    want = (x - m[None, :, None, None]) / torch.sqrt(v[None, :, None, None] + bn.eps) * w + b
    torch.testing.assert_close(StatsBatchNorm(bn, "alpha", a, 0.1)(x), want, rtol=0, atol=1e-5)


def test_the_tower_never_writes_the_shared_model_and_a_vit_is_zero_shot(tiny_model, tiny_vit_model):
    model = tiny_model
    before = {k: v.clone() for k, v in model.clip.visual.state_dict().items()}
    x = model.normalize(torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(1)))
    for statistics in ("batch", "alpha", "ema"):
        method = shiftlab.create_method("norm_stats", model, CLASSES, statistics=statistics)
        outs = method.adapt_batch(contexts(model, method, x))
        # the BatchNorm layers see test statistics: not the frozen tower's logits
        frozen = model.logit_scale * model.encode_views(x) @ method.heads.zeroshot.T
        assert (logits_of(outs) - frozen).abs().max() > 1e-3, statistics
    assert all(torch.equal(v, before[k]) for k, v in model.clip.visual.state_dict().items())
    vit = tiny_vit_model
    method = shiftlab.create_method("norm_stats", vit, CLASSES)
    x = vit.normalize(torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(2)))
    frozen = vit.logit_scale * vit.encode_views(x) @ method.heads.zeroshot.T
    assert method.tower.layers == []
    assert_close(logits_of(method.adapt_batch(contexts(vit, method, x))), frozen, 1e-4, "ViT logits")


def test_the_ema_statistics_carry_and_resume_exactly(tiny_model):
    model = tiny_model
    x = model.normalize(torch.rand(6, 3, 64, 64, generator=torch.Generator().manual_seed(4)))
    first = shiftlab.create_method("norm_stats", model, CLASSES, statistics="ema")
    initial = first.state_dict()
    first.adapt_batch(contexts(model, first, x[:3]))
    state = first.state_dict()
    assert any(not torch.equal(state["stats"][k]["mean"], initial["stats"][k]["mean"]) for k in state["stats"])
    straight = logits_of(first.adapt_batch(contexts(model, first, x[3:])))
    resumed = shiftlab.create_method("norm_stats", model, CLASSES, statistics="ema")
    resumed.load_state_dict(state)
    assert torch.equal(logits_of(resumed.adapt_batch(contexts(model, resumed, x[3:]))), straight)
    fresh = shiftlab.create_method("norm_stats", model, CLASSES, statistics="ema")
    assert not torch.equal(logits_of(fresh.adapt_batch(contexts(model, fresh, x[3:]))), straight)
    resumed.reset()
    assert all(torch.equal(v["var"], initial["stats"][k]["var"]) for k, v in resumed.state_dict()["stats"].items())


def test_one_value_per_channel_is_refused_in_one_line(tiny_model):
    method = shiftlab.create_method("norm_stats", tiny_model, CLASSES)
    x = tiny_model.normalize(torch.rand(1, 3, 32, 32))       # the tiny ResNet's last map is 1x1 at 32 px
    with pytest.raises(ValueError, match="^norm_stats: .*one value per channel .*batch statistics need two or more"):
        method.adapt_batch(contexts(tiny_model, method, x))


# -- their code (tests/fixtures/golden/norm_stats) ----------------------------------------------------------


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_norm_stats_matches_their_code_batch_by_batch(golden_model, golden_dir, variant):
    from shiftlab.methods.context import ClassHeads
    model, names = golden_model
    heads = ClassHeads(model, names)
    want = torch.load(golden_dir / "norm_stats" / f"{variant}.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "norm_stats" / "norm_stats.json").read_text())["fixtures"][variant]
    assert info["n_batches"] == 3
    method = shiftlab.create_method("norm_stats", model, names, heads=heads, **VARIANTS[variant])
    assert len(method.tower.layers) == info["batch_norm_layers"] > 0
    assert_close(heads.zeroshot, want["prototypes"], FEATURES, "text head")
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    frozen = None
    for b in range(info["n_batches"]):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[8 * b:8 * b + 8]])
        assert_close(logits_of(outs), want[f"{b}/logits"], LOGITS, f"batch {b} logits")
        frozen = model.logit_scale * model.encode_views(torch.cat(views[8 * b:8 * b + 8])) @ heads.zeroshot.T
        assert (want[f"{b}/logits"] - frozen).abs().max() > 100 * LOGITS, "the statistics change the logits"
        if variant == "norm_ema":
            stats = method.state_dict()["stats"]
            for name, layer in stats.items():
                for key, value in (("running_mean", layer["mean"]), ("running_var", layer["var"])):
                    theirs = want[f"{b}/{key}/{name}"]
                    scale = max(float(theirs.abs().max()), 1.0)
                    assert_close(value, theirs, FEATURES * scale, f"batch {b} {key} {name}")

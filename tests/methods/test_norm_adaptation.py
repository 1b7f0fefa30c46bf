"""The shared machinery of the classic batch TTA methods on CLIP (`shiftlab.methods.common.norm_adaptation`):
which parameters adapt, that the shared frozen tower never changes, BatchNorm on batch statistics, the optimisers,
and the state (adapted parameters + optimiser moments) that makes a resume exact. Exercised through TENT, its
first user."""
from __future__ import annotations

import copy
import dataclasses
import io
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import shiftlab
from shiftlab.methods.common.confidence import entropy
from shiftlab.methods.common.norm_adaptation import NormTower, make_optimizer, mean_prediction_entropy
from shiftlab.methods.context import SampleContext
from shiftlab.synthetic import tiny_vit

CLASSES = ["cat", "dog", "car", "tree"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def vit():
    return tiny_vit(0)


def _model(which, vit, tiny_model):
    return vit if which == "vit" else tiny_model


def _batches(model, n_batches=3, size=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    s = model.image_size
    return [model.normalize(torch.rand(size, 3, s, s, generator=gen)) for _ in range(n_batches)]


def _run(method, batch):
    outs = method.adapt_batch([SampleContext(method.model, method.heads, batch[i:i + 1]) for i in range(len(batch))])
    return torch.stack([o.logits for o in outs])


@pytest.mark.parametrize("which", ["vit", "resnet"])
def test_the_norm_affine_parameters_adapt_and_the_shared_tower_never_changes(which, vit, tiny_model):
    model = _model(which, vit, tiny_model)
    before = {k: v.clone() for k, v in model.clip.state_dict().items()}
    method = shiftlab.create_method("tent", model, CLASSES, steps=2, lr=0.05)
    for batch in _batches(model, 2):
        _run(method, batch)
    after = model.clip.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert not any(p.requires_grad for p in model.clip.parameters())
    norms = [n for n, m in model.clip.visual.named_modules()
             if isinstance(m, (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm2d))]
    assert method.tower.parameter_names == [f"{n}.{w}" for n in norms for w in ("weight", "bias")]
    moved = [n for n, v in method.tower.norm_state().items()
             if not torch.equal(v, model.clip.visual.get_parameter(n))]
    assert moved                                        # they did adapt ...
    shared = dict(model.clip.visual.named_parameters())
    for name, p in method.tower.visual.named_parameters():
        if name not in method.tower.parameter_names:    # ... and everything else IS the shared tensor
            assert p is shared[name]


def test_batchnorm_normalises_with_the_batch_statistics(tiny_model):
    batch = _batches(tiny_model, 1, size=5)[0]
    tower = NormTower(tiny_model.clip)
    reference = copy.deepcopy(tiny_model.clip.visual).train()   # torch's train mode: batch statistics
    with torch.no_grad():
        torch.testing.assert_close(tower(batch), reference(batch), rtol=0, atol=1e-5)
        frozen = tiny_model.clip.visual(batch)
        assert float((tower(batch) - frozen).abs().max()) > 1e-3    # not the running statistics
    assert tiny_model.clip.visual.bn1.running_mean is not None and not tiny_model.clip.visual.training


def test_a_tower_without_normalisation_layers_is_refused_in_one_line():
    model = tiny_vit(1)
    model.clip.visual = nn.Sequential(nn.Flatten(), nn.Linear(3 * 64 * 64, 32))
    with pytest.raises(ValueError, match=r"^tent: shiftlab-tiny-vit: its image tower \(Sequential\) has no "
                                         r"normalisation layer"):
        shiftlab.create_method("tent", model, CLASSES)


def test_optimisers_are_built_as_the_config_says(vit):
    params = [nn.Parameter(torch.zeros(3))]
    base = shiftlab.create_method("tent", vit, CLASSES).config
    adam = make_optimizer(base, params)
    assert type(adam) is torch.optim.Adam and adam.defaults["eps"] == 1e-6 and adam.defaults["lr"] == 1e-3
    sgd = make_optimizer(dataclasses.replace(base, optimizer="sgd", lr=0.1, momentum=0.5), params)
    assert type(sgd) is torch.optim.SGD and sgd.defaults["momentum"] == 0.5 and sgd.defaults["lr"] == 0.1
    adamw = make_optimizer(dataclasses.replace(base, optimizer="adamw", weight_decay=0.2), params)
    assert type(adamw) is torch.optim.AdamW and adamw.defaults["weight_decay"] == 0.2


def test_entropies_are_the_direct_sums():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 0.5]])
    p = logits.softmax(-1)
    torch.testing.assert_close(entropy(logits), -(p * p.log()).sum(-1))
    mean = p.mean(0)
    torch.testing.assert_close(mean_prediction_entropy(logits), -(mean * (mean + 1e-6).log()).sum())


@pytest.mark.parametrize("which", ["vit", "resnet"])
def test_a_resume_from_the_saved_state_continues_exactly(which, vit, tiny_model):
    model = _model(which, vit, tiny_model)
    batches = _batches(model, 3)
    cfg = dict(steps=2, lr=0.05)
    straight = shiftlab.create_method("tent", model, CLASSES, **cfg)
    want = [_run(straight, b) for b in batches]
    first = shiftlab.create_method("tent", model, CLASSES, **cfg)
    _run(first, batches[0])
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)              # as the online checkpoint stores it
    buffer.seek(0)
    resumed = shiftlab.create_method("tent", model, CLASSES, **cfg)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert resumed.state_dict()["optimizer"]["state"]   # Adam's moments travelled with the parameters
    for b, w in zip(batches[1:], want[1:]):
        assert torch.equal(_run(resumed, b), w)


def test_reset_and_episodic_start_every_batch_from_the_initial_state(vit):
    b1, b2 = _batches(vit, 2)
    fresh = _run(shiftlab.create_method("tent", vit, CLASSES, steps=1, lr=0.05), b2)
    continual = shiftlab.create_method("tent", vit, CLASSES, steps=1, lr=0.05)
    _run(continual, b1)
    assert not torch.equal(_run(continual, b2), fresh)
    continual.reset()
    assert torch.equal(_run(continual, b2), fresh)
    episodic = shiftlab.create_method("tent", vit, CLASSES, steps=1, lr=0.05, episodic=True)
    _run(episodic, b1)
    assert torch.equal(_run(episodic, b2), fresh)


def test_logits_are_the_scaled_cosines_to_the_head(vit):
    batch = _batches(vit, 1)[0]
    method = shiftlab.create_method("tent", vit, CLASSES, logit_scale=50.0, text_head="ensemble")
    with torch.no_grad():
        want = 50.0 * F.normalize(vit.clip.encode_image(batch), dim=-1) @ method.heads.ensemble.T
        torch.testing.assert_close(method.logits(batch), want, rtol=0, atol=1e-4)


def test_stored_features_without_pixels_are_refused_in_one_line(vit):
    method = shiftlab.create_method("tent", vit, CLASSES)
    ctx = SampleContext(vit, method.heads, None, image_features=torch.zeros(1, 32))
    with pytest.raises(ValueError, match="^tent adapts the image tower and needs the images' pixels"):
        method.adapt_batch([ctx])


# -- BatchNorm on a batch of one image -------------------------------------------------------------------------

TINY_32PX = "shiftlab-tiny-32px"   # the tiny ResNet at 32 px: its last feature map is 1x1


@pytest.fixture(scope="module")
def resnet_32px():
    from shiftlab.models import load_model
    from shiftlab.models.architectures import builtin_configs
    config = builtin_configs()["shiftlab-tiny"]
    config["vision_cfg"]["image_size"] = 32
    return load_model(TINY_32PX, None, model_config=config)


def test_batchnorm_on_one_value_per_channel_is_refused_in_one_line(resnet_32px):
    """One image whose last feature map is 1x1 leaves a BatchNorm layer one value per channel: a one-line
    refusal naming the batch size, not torch's traceback; two images adapt."""
    tent = shiftlab.create_method("tent", resnet_32px, CLASSES, steps=1)
    views = _batches(resnet_32px, 1, size=2)[0]
    ctxs = [SampleContext(resnet_32px, tent.heads, views[i:i + 1]) for i in range(2)]
    with pytest.raises(ValueError) as err:
        tent.adapt_batch(ctxs[:1])
    message = str(err.value)
    assert "\n" not in message and message.startswith("tent: shiftlab-tiny-32px: a batch of 1 image")
    assert "BatchNorm" in message and "batch_size=2" in message
    assert len(tent.adapt_batch(ctxs)) == 2


def test_a_run_s_batch_tail_of_one_gets_error_records_that_say_why(resnet_32px, tmp_path):
    from _synthetic import make_image_folder
    from shiftlab import RunConfig, run
    from shiftlab.datasets import build_dataset
    data = build_dataset("imagefolder", make_image_folder(tmp_path / "data", ["cat", "dog", "car"], size=(40, 30)))
    run(RunConfig(dataset="imagefolder", methods=["zeroshot", "tent"], method_config={"tent": {"steps": 1}},
                  batch_size=2, workers=0, progress=False, out=str(tmp_path / "run"), device="cpu"),
        model=resnet_32px, dataset=data)
    recs = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    tent = {r["id"]: r for r in recs if r["method"] == "tent"}
    stream = json.loads((tmp_path / "run" / "stream.json").read_text())["ids"]
    assert all("error" not in tent[sid] for sid in stream[:2])            # a batch of two adapts
    assert tent[stream[2]]["error"].startswith("ValueError: tent: shiftlab-tiny-32px: a batch of 1 image")
    assert all("error" not in r for r in recs if r["method"] == "zeroshot")

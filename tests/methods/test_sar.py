"""SAR: its SAM step against a straightforward computation, and CLIPTTA's SAR with its SAM (github.com/MarcLafon/
cliptta `ttavlm/methods/sar.py`, `optimizers/sam.py`, the CLIP version issue #32 follows) on the golden tiny ViT
(tests/fixtures/golden/sar, made by the driver beside the fixtures, float32 on the CPU).

Golden: 24 images in 3 batches of 8, continual: at logit scale 50 (no recovery: the state carries) and at 100
with 2 steps (the moving average below 0.2 from the first step: a recovery after every step, which keeps the
moving average and Adam's moments); after every batch the logits (TUNED_LOGITS: measured 2.1e-5), the norm
parameters (NORM_PARAMS: 1.8e-7), Adam's first moments (GRAD_RTOL of their largest: 6.7e-7 absolute) and the
moving average (LOSS: 1.7e-6); and the first variant with their --skip_top_layers (`skip_top_layers="top"`: ln_post
frozen on the 4-block tiny ViT).
"""
from __future__ import annotations

import json

import pytest
import torch

import shiftlab
from _golden import GRAD_RTOL, LOSS, NORM_PARAMS, TUNED_LOGITS, assert_close, stream_views
from shiftlab.methods.common.sam import sam_perturb
from shiftlab.methods.context import SampleContext
from shiftlab.synthetic import tiny_vit

pytestmark = pytest.mark.usefixtures("one_thread")

VARIANTS = {"sar": {"logit_scale": 50.0}, "sar_recover": {"steps": 2, "logit_scale": 100.0},
            "sar_skip": {"logit_scale": 50.0, "skip_top_layers": "top"}}
RECOVERIES = {"sar": 0, "sar_recover": 6, "sar_skip": 0}


def test_sam_moves_along_the_normalised_gradient_and_remembers_the_weights():
    a = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    b = torch.nn.Parameter(torch.tensor([3.0]))
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])
    olds = sam_perturb([a, b], rho=0.5, adaptive=False)
    torch.testing.assert_close(a.detach(), torch.tensor([1.0 + 0.5 * 3 / 5, 2.0]))
    torch.testing.assert_close(b.detach(), torch.tensor([3.0 + 0.5 * 4 / 5]))
    assert torch.equal(olds[0], torch.tensor([1.0, 2.0])) and torch.equal(olds[1], torch.tensor([3.0]))
    c = torch.nn.Parameter(torch.tensor([2.0]))
    c.grad = torch.tensor([1.0])
    sam_perturb([c], rho=0.1, adaptive=True)      # ASAM: |w| g in the norm, w^2 g in the move
    torch.testing.assert_close(c.detach(), torch.tensor([2.0 + 0.1 * 4.0 * 1.0 / 2.0]))


def test_recovery_restores_the_parameters_and_keeps_the_moments():
    model = tiny_vit(0)
    method = shiftlab.create_method("sar", model, ["cat", "dog", "car"], recovery_threshold=100.0, lr=0.01,
                                    entropy_margin=10.0)     # every image reliable: the moving average exists
    batch = model.normalize(torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(2)))
    outs = method.adapt_batch([SampleContext(model, method.heads, batch[i:i + 1]) for i in range(3)])
    assert outs[0].extras["recovered"] and method.recoveries == 1 and method.ema is not None
    initial = shiftlab.create_method("sar", model, ["cat", "dog", "car"]).tower.norm_state()
    assert all(torch.equal(v, initial[k]) for k, v in method.tower.norm_state().items())
    assert method.optimizer.state_dict()["state"]        # Adam's moments survived, as in both authors' codes
    forgetful = shiftlab.create_method("sar", model, ["cat", "dog", "car"], recovery_threshold=100.0,
                                       entropy_margin=10.0, recovery_resets_ema=True)
    forgetful.adapt_batch([SampleContext(model, forgetful.heads, batch[i:i + 1]) for i in range(3)])
    assert forgetful.ema is None and forgetful.recoveries == 1


def test_paper_protocol_is_sars_own_recipe():
    from shiftlab.methods.base import describe
    paper = describe("paper", "sar")["config"]
    assert (paper["optimizer"], paper["lr"], paper["momentum"], paper["predict_after_update"],
            paper["recovery_resets_ema"], paper["rho"]) == ("sgd", 0.001, 0.9, False, True, 0.05)
    assert paper["skip_top_layers"] == "top" and describe("leaderboard", "sar")["config"]["skip_top_layers"] == "none"


# -- the top layers left out (tests/fixtures/golden/sar/top_layers.json, made by top_layers.py beside it) --------


@pytest.mark.parametrize("tower_key", ["vit12", "resnet"])
def test_the_top_layer_rules_adapt_what_the_authors_code_collects(golden_dir, tower_key):
    """On a 12-block ViT (ViT-B's depth) and a ResNet: "top" adapts what CLIPTTA's --skip_top_layers collects
    (blocks 9-11 and ln_post, or layer4, left out), "sar_names" what SAR's collect_params collects (ln_post kept),
    "none" every norm; the skipped BatchNorm layers still use the batch's statistics, the shared tower untouched."""
    import importlib
    import types

    from shiftlab.methods.common.norm_adaptation import NormTower, norm_layers
    fixture = json.loads((golden_dir / "sar" / "top_layers.json").read_text())["towers"][tower_key]
    module, _, name = fixture["constructor"].rpartition(".")
    torch.manual_seed(0)
    tower = getattr(importlib.import_module(module), name)(**fixture["kwargs"]).eval().requires_grad_(False)
    everything = [f"{n}.{w}" for n, m in norm_layers(tower) for w in ("weight", "bias")]
    assert everything == fixture["all"]      # the tower the authors' code was run on
    clip = types.SimpleNamespace(visual=tower)
    for rule, theirs in (("top", "cliptta_skip"), ("sar_names", "sar"), ("none", "all")):
        assert NormTower(clip, rule).parameter_names == fixture[theirs], rule
    if tower_key == "resnet":
        frozen = NormTower(clip, "top").visual.get_submodule("layer4.0.bn1")
        assert frozen.running_mean is None and not frozen.track_running_stats   # batch statistics
        assert frozen.weight is tower.get_submodule("layer4.0.bn1").weight      # the shared, frozen tensor
        assert tower.get_submodule("layer4.0.bn1").running_mean is not None     # the shared tower's own kept
    else:
        assert "ln_post.weight" in fixture["sar"] and "ln_post.weight" not in fixture["cliptta_skip"]


# -- CLIPTTA's code (tests/fixtures/golden/sar) --------------------------------------------------------------


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_sar_matches_cliptta_batch_by_batch(golden_vit, golden_dir, variant):
    model, names, heads = golden_vit
    want = torch.load(golden_dir / "sar" / f"{variant}.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "sar" / "sar.json").read_text())["fixtures"][variant]
    assert "--use_sam" in info["argv"] and info["n_batches"] == 3
    method = shiftlab.create_method("sar", model, names, heads=heads, **VARIANTS[variant])
    assert method.tower.parameter_names == info["adapted"]
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    for b in range(info["n_batches"]):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[8 * b:8 * b + 8]])
        assert_close(torch.stack([o.logits for o in outs]), want[f"{b}/logits"], TUNED_LOGITS, f"batch {b} logits")
        moments = method.optimizer.state_dict()["state"]
        for i, (name, value) in enumerate(method.tower.norm_state().items()):
            assert_close(value, want[f"{b}/norm/{name}"], NORM_PARAMS, f"batch {b} {name}")
            theirs = want[f"{b}/exp_avg/{name}"]
            scale = max(float(theirs.abs().max()), 1e-3)
            assert_close(moments[i]["exp_avg"], theirs, GRAD_RTOL * scale, f"batch {b} Adam moment {name}")
        assert method.ema == pytest.approx(float(want[f"{b}/ema"]), abs=LOSS)
    assert method.recoveries == RECOVERIES[variant]

"""CLIPArTT: its loss against a straightforward computation, the episodic reset per batch, and the authors' own
code on the golden stream (tests/fixtures/golden/clipartt, made by the driver beside the fixtures from
github.com/dosowiechi/CLIPArTT's adapt.py setup and models/tent.py, float32 on the CPU): every step's loss
(CLIPTTA_LOSS), every batch's probabilities (FEATURES) and LayerNorm parameters (NORM_PARAMS), through
shiftlab's own tiny ViT encoder (the same weights)."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FEATURES, NORM_PARAMS, assert_close, fixture_tolerances, stream_views
from shiftlab.methods.common.clipartt_pseudo_labels import captions, clipartt_loss, soft_targets
from shiftlab.methods.context import ClassHeads, SampleContext

CLIPTTA_LOSS = fixture_tolerances("clipartt")["loss"]  # tests/fixtures/golden/clipartt/tolerances.json

CLASSNAMES = ["cat", "dog", "car", "tree", "boat", "house"]
BATCH = 8

pytestmark = pytest.mark.usefixtures("one_thread")


def _unit(*shape: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def test_captions_name_the_top_classes_in_order():
    assert captions(torch.tensor([[2, 0, 5]]), CLASSNAMES, "a photo of a {}") == ["a photo of a car or cat or house"]


@pytest.mark.parametrize("transposed", [True, False])
def test_loss_is_the_straightforward_cross_entropy_with_soft_targets(transposed):
    f, t = _unit(4, 8, seed=0), _unit(4, 8, seed=1)
    sim = [[(float(f[i] @ f[j]) + float(t[i] @ t[j])) / 2 / 0.5 for j in range(4)] for i in range(4)]
    target = [[math.exp(v) / sum(math.exp(w) for w in row) for v in row] for row in sim]
    loss = 0.0
    for i in range(4):
        logits = [10.0 * float(f[i] @ t[j]) for j in range(4)]
        log_z = math.log(sum(math.exp(v) for v in logits))
        weights = [target[j][i] for j in range(4)] if transposed else target[i]
        loss += -sum(w * (v - log_z) for w, v in zip(weights, logits)) / 4
    got = clipartt_loss(f, t, soft_targets(f, t, 0.5, "both"), 10.0, transposed)
    assert float(got) == pytest.approx(loss, abs=1e-5)
    assert torch.equal(soft_targets(f, t, 0.5, "identity"), torch.eye(4))


def test_every_batch_starts_from_the_frozen_tower_and_the_shared_model_is_untouched(tiny_model):
    heads = ClassHeads(tiny_model, CLASSNAMES)
    before = {k: v.clone() for k, v in tiny_model.clip.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    pixels = tiny_model.normalize(torch.rand(8, 3, tiny_model.image_size, tiny_model.image_size, generator=g))
    ctxs = [SampleContext(tiny_model, heads, pixels[i:i + 1]) for i in range(8)]
    method = shiftlab.create_method("clipartt", tiny_model, CLASSNAMES, heads=heads, steps=2, lr=1e-2, top_k=2)
    first = [o.logits for o in method.adapt_batch(ctxs[:4])]
    method.adapt_batch(ctxs[4:])
    again = [o.logits for o in method.adapt_batch(ctxs[:4])]      # episodic: the same batch, the same outputs
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert all(torch.equal(v, before[k]) for k, v in tiny_model.clip.state_dict().items())
    with pytest.raises(ValueError, match=r"clipartt\.top_k"):
        shiftlab.create_method("clipartt", tiny_model, CLASSNAMES, top_k=7)


@pytest.mark.golden
def test_every_batch_as_their_code(golden_dir):
    from _golden import FIXTURES, VIT_MODEL_FILE
    info = json.loads((FIXTURES / "clipartt" / "clipartt.json").read_text())
    assert info["reference"]["commit"] == "6f439ba1ee895df4935a1b1dbdbc5411a8d48005"
    args = info["fixtures"]["clipartt"]["arguments"]
    assert (args["K"], args["niter"], args["target_method"], args["method"]) == (3, 10, 1, "clipartt")
    names = json.loads((golden_dir / "golden.json").read_text())["classnames"]
    model = shiftlab.load_model("shiftlab-tiny-vit", str(golden_dir / VIT_MODEL_FILE))
    want = torch.load(FIXTURES / "clipartt" / "clipartt.pt", weights_only=True)
    method = shiftlab.create_method("clipartt", model, names, precision="fp32", logit_scale=100.0)
    assert_close(method.head, want["prototypes"], FEATURES, "class head")
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    for b in range(len(views) // BATCH):
        outs = method.adapt_batch([SampleContext(model, method.heads, v) for v in views[b * BATCH:(b + 1) * BATCH]])
        assert_close(torch.tensor(method.losses), want[f"{b}/losses"], CLIPTTA_LOSS, f"{b} losses")
        assert_close(torch.stack([o.probabilities() for o in outs]), want[f"{b}/probs"], FEATURES, f"{b} probs")
        params = torch.cat([p.detach().reshape(-1) for p in method.tower.adapted_parameters()])
        assert_close(params, want[f"{b}/params"], NORM_PARAMS, f"{b} LayerNorm parameters")
    # the adaptation changed predictions away from the frozen model's single class
    assert len(set(want["2/probs"].argmax(-1).tolist())) > 1


def test_continual_is_refused_in_one_line(tiny_model):
    for name in ("clipartt", "watt"):
        with pytest.raises(ValueError, match=rf"^{name}\.episodic: False \(continual\) is not offered"):
            shiftlab.create_method(name, tiny_model, CLASSNAMES, episodic=False)

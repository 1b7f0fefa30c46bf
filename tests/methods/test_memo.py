"""MEMO: its marginal entropy against a straightforward computation, the episodic reset, and the method as
mariodoebler/test-time-adaptation runs it on CLIP (`classification/methods/memo.py` on its ZeroShotCLIP,
AlphaBatchNorm) over the golden tiny ResNet CLIP (tests/fixtures/golden/memo, made by the driver beside the
fixtures, float32 on the CPU).

Golden: the golden stream's first 3 images, 8 views each (7 augmented), episodic; SGD (Nesterov, lr 0.002), 1 step
at alpha 0.1 and 2 steps at alpha 0.3. Per image: every forward of their model (each step's augmented views: LOGITS
at the first step, MEMO_LOGITS after a step), the prediction (MEMO_LOGITS), and after image 0 the change of the
BatchNorm, stem and attention-pool weights (GRAD_RTOL of the largest change).
"""
from __future__ import annotations

import json
import math

import pytest
import torch

import shiftlab
from _golden import FEATURES, GRAD_RTOL, LOGITS, assert_close, fixture_tolerances, stream_views
from shiftlab.methods.context import SampleContext
from shiftlab.views.recipe import ViewRecipe

MEMO_LOGITS = fixture_tolerances("memo")["logits"]  # tests/fixtures/golden/memo/tolerances.json

pytestmark = pytest.mark.usefixtures("one_thread")

CLASSES = ["cat", "dog", "car", "bus"]
VARIANTS = {"memo": {"lr": 0.002}, "memo_steps": {"lr": 0.002, "steps": 2, "alpha": 0.3}}


def test_marginal_entropy_against_a_straightforward_computation():
    from shiftlab.methods.memo.method import marginal_entropy
    logits = torch.tensor([[2.0, 0.0, 1.0], [0.0, 0.5, 3.0], [1.0, 1.0, -1.0]])
    p = logits.softmax(-1).mean(0)
    torch.testing.assert_close(marginal_entropy(logits), -(p * p.log()).sum())
    # a class no view gives any probability counts 0 (the clamp), not NaN
    assert math.isfinite(float(marginal_entropy(torch.tensor([[0.0, -1e4], [0.0, -1e4]]))))


def test_each_image_starts_from_the_frozen_tower_and_only_the_augmented_views_adapt(tiny_model):
    x = tiny_model.normalize(torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(0)))
    method = shiftlab.create_method("memo", tiny_model, CLASSES, views=ViewRecipe(n_views=4), lr=0.05)
    before = {k: v.clone() for k, v in tiny_model.clip.visual.state_dict().items()}
    first = method.predict(x)
    assert all(torch.equal(v, before[k]) for k, v in tiny_model.clip.visual.state_dict().items())
    moved = [n for (n, p, s) in method.weights if not torch.equal(p, s)]
    assert len(moved) > len(method.weights) // 2        # every weight adapts, not the norms only
    torch.testing.assert_close(method.predict(x), first, rtol=0, atol=0)      # episodic: the same again
    assert method.optimizer.state                         # the step's momentum, dropped by the next reset
    other = x.clone()
    other[0] = x[1]                                       # view 0 is predicted, not adapted on
    assert not torch.equal(method.predict(other), first)
    other = x.clone()
    other[1:] = x[1:].flip(-1)
    assert not torch.equal(method.predict(other), first)
    with pytest.raises(ValueError, match="memo: needs at least 2 views"):
        method.predict(x[:1])


# -- their code (tests/fixtures/golden/memo) -----------------------------------------------------------------


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_memo_matches_their_code_image_by_image(golden_model, golden_dir, variant):
    from shiftlab.methods.context import ClassHeads
    model, names = golden_model
    heads = ClassHeads(model, names)
    want = torch.load(golden_dir / "memo" / f"{variant}.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "memo" / "memo.json").read_text())["fixtures"][variant]
    method = shiftlab.create_method("memo", model, names, heads=heads, views=ViewRecipe(n_views=info["views"]),
                                    **VARIANTS[variant])
    assert method.parameter_names == info["adapted"]
    assert_close(heads.zeroshot, want["prototypes"], FEATURES, "text head")
    steps = VARIANTS[variant].get("steps", 1)
    forwards: list[torch.Tensor] = []
    original = method.logits
    method.logits = lambda pixels: _recorded(original, pixels, forwards)
    views = stream_views(golden_dir, info["views"])
    assert info["images"] == 3
    for i in range(info["images"]):
        x = model.normalize(views[i])
        forwards.clear()
        out = method.predict_context(SampleContext(model, heads, x))
        assert len(forwards) == steps + 1
        for k, got in enumerate(forwards):
            tol = LOGITS if k == 0 else MEMO_LOGITS
            assert_close(got, want[f"{i}/forward/{k}"], tol, f"image {i} forward {k}")
        frozen = model.logit_scale * model.encode_views(x[:1]) @ heads.zeroshot.T
        assert (want[f"{i}/logits"] - frozen).abs().max() > 10 * MEMO_LOGITS, "the step moves the prediction"
        assert_close(out.logits, want[f"{i}/logits"][0], MEMO_LOGITS, f"image {i} logits")
        if i == 0:
            deltas = {k[len("0/delta/"):]: v for k, v in want.items() if k.startswith("0/delta/")}
            assert len(deltas) > 3
            for name, p, source in method.weights:
                if name in deltas:
                    scale = float(deltas[name].abs().max())
                    assert scale > 0, name
                    assert_close(p.detach() - source, deltas[name], GRAD_RTOL * scale, f"{name} change")


def _recorded(original, pixels, forwards):
    out = original(pixels)
    forwards.append(out.detach().clone())
    return out

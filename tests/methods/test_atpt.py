"""A-TPT: its angular term against a plain computation, one tuning step against a plain-torch computation, and the
authors' own code on the golden tiny CLIP (tests/fixtures/golden/atpt, made by the driver beside it from
MB-Shihab-Aaqil-Ahamed/A-TPT's `test_time_adapt_eval`, float32 on the CPU: tpt_classification.py with lambda 10
and atpt_classification.py with lambda 80, one and two steps, 4 samples of 32 views).

Golden tolerances: tests/_golden.py's and the fixture's tolerances.json (the loss of lambda 80 is ~46: LOSS or
OTPT_LOSS_REL of its size, whichever is larger); the selected views as a set after a margin check, as
tests/methods/test_tpt.py.
"""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FIXTURES, LOGITS, LOSS, OptimizerStepRecorder, fixture_tolerances
from _imports import lazy_module
from _prompt_tuning_golden import key_failures, run_variants
from shiftlab import ClassHeads, SampleContext
from shiftlab.methods.atpt.method import min_angles

OTPT_LOSS_REL = fixture_tolerances("atpt")["loss_rel"]  # tests/fixtures/golden/atpt/tolerances.json

open_clip = lazy_module("open_clip", optional=False)   # imported by the first test that reads it

NAMES = ["goldfish", "great white shark", "hammerhead shark", "stingray", "cock", "hen", "ostrich", "brambling"]
N_VIEWS = 20
LR, WD = 5e-3, 0.01

pytestmark = pytest.mark.usefixtures("one_thread")


def test_min_angles_is_the_angle_to_the_nearest_other_class():
    gen = torch.Generator().manual_seed(0)
    text = F.normalize(torch.randn(6, 4, generator=gen, dtype=torch.float64), dim=-1)
    want = [min(math.acos(max(-1.0, min(1.0, float(text[i] @ text[j])))) for j in range(6) if j != i) for i in range(6)]
    torch.testing.assert_close(min_angles(text, 1.0), torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-7)
    # orthonormal features: every nearest class at 90 degrees; a duplicate class: clamped at tau, acos(tau) > 0
    assert torch.allclose(min_angles(torch.eye(3), 0.99999), torch.full((3,), math.pi / 2))
    dup = torch.stack([text[0], text[0], text[1]])
    assert float(min_angles(dup, 0.99999)[0]) == pytest.approx(math.acos(0.99999), rel=1e-3)
    # batched: one row per sample
    torch.testing.assert_close(min_angles(torch.stack([text, text.flip(0)]), 1.0)[1], min_angles(text, 1.0).flip(0))


# -- one step against plain torch -----------------------------------------------------------------------

def hand_text(model, ctx: torch.Tensor) -> torch.Tensor:
    clip = model.clip
    tokens = open_clip.tokenize([f"a photo of a {n}." for n in NAMES])
    emb = clip.token_embedding(tokens)
    emb = torch.cat([emb[:, :1], ctx.unsqueeze(0).expand(len(NAMES), -1, -1), emb[:, 1 + ctx.shape[0]:]], dim=1)
    x = clip.transformer(emb + clip.positional_embedding, attn_mask=clip.attn_mask)
    x = clip.ln_final(x)[torch.arange(len(NAMES)), tokens.argmax(-1)] @ clip.text_projection
    return x / x.norm(dim=-1, keepdim=True)


def make_context(model, heads, seed: int) -> SampleContext:
    gen = torch.Generator().manual_seed(seed)
    text = heads.zeroshot
    cls = torch.randint(0, len(NAMES), (N_VIEWS,), generator=gen)
    strength = torch.linspace(0.2, 3.0, N_VIEWS)[torch.randperm(N_VIEWS, generator=gen)]
    noise = F.normalize(torch.randn(N_VIEWS, text.shape[1], generator=gen), dim=-1)
    feats = F.normalize(strength[:, None] * text[cls] + noise, dim=-1)
    return SampleContext(model, heads, torch.zeros(N_VIEWS, 3, 64, 64), image_features=feats)


@pytest.mark.parametrize("objective", ["maximize", "minimize"])
def test_one_step_matches_hand_computation(tiny_model, objective):
    model = tiny_model
    heads = ClassHeads(model, NAMES)
    ctx = make_context(model, heads, 0)
    feats = ctx.image_features
    lam = 3.0
    method = shiftlab.create_method("atpt", model, NAMES, heads=heads, lambda_angular=lam, objective=objective)
    with OptimizerStepRecorder() as rec:
        out = method.predict_context(ctx)
    # written out: TPT's marginal entropy over the 2 lowest-entropy views -/+ lambda * mean nearest-class angle
    ids = open_clip.tokenize(["a photo of a"])[0, 1:5]
    ctx0 = model.clip.token_embedding.weight[ids].detach().clone().requires_grad_(True)
    text = hand_text(model, ctx0)
    probs = (model.clip.logit_scale.exp() * feats @ text.T).softmax(-1)
    ent = -(probs * probs.log()).sum(-1)
    selected = sorted(range(N_VIEWS), key=lambda v: float(ent[v].detach()))[:int(N_VIEWS * 0.1)]
    avg = probs[selected].mean(0)
    ent_loss = -(avg * avg.log()).sum()
    cos = text @ text.T
    angle = sum(torch.acos(torch.stack([cos[i, j] for j in range(len(NAMES)) if j != i]).max().clamp(max=0.99999))
                for i in range(len(NAMES))) / len(NAMES)
    loss = ent_loss + (-lam if objective == "maximize" else lam) * angle
    (grad,) = torch.autograd.grad(loss, ctx0)
    ctx1 = (ctx0 * (1 - LR * WD) - LR * grad / (grad.abs() + 1e-8)).detach()

    assert out.extras["selected"] == selected
    assert out.extras["entropy_loss"] == pytest.approx(float(ent_loss.detach()), abs=1e-5)
    assert out.extras["min_angle"] == pytest.approx(float(angle.detach()), abs=1e-5)
    assert out.extras["loss"] == pytest.approx(float(loss.detach()), abs=2e-5)
    err = float((rec.grad[0][0] - grad).abs().max())
    assert err <= 1e-3 * float(grad.abs().max())
    torch.testing.assert_close(rec.param[0][0], ctx1, rtol=0, atol=1e-6)
    with torch.no_grad():
        tuned = hand_text(model, ctx1)
    torch.testing.assert_close(out.logits, model.clip.logit_scale.exp() * feats[0] @ tuned.T, rtol=0, atol=1e-4)
    # the step moves the mean angle the way the objective asks
    moved = out.extras["min_angle_after"] - out.extras["min_angle"]
    assert moved > 0 if objective == "maximize" else moved < 0


def test_config_and_facts(tiny_model):
    with pytest.raises(ValueError, match="objective"):
        shiftlab.create_method("atpt", tiny_model, NAMES, objective="both")
    with pytest.raises(ValueError, match="tau"):
        shiftlab.create_method("atpt", tiny_model, NAMES, tau=1.5)
    from shiftlab.methods.catalogue.declarations import spec
    s = spec("atpt")
    assert s.dataset_values["imagenet-r"] == {"lambda_angular": 10.0, "objective": "maximize",
                                              "views": {"augmix": True}}
    assert s.dataset_values["dtd"]["lambda_angular"] == 80.0 and s.dataset_values["dtd"]["objective"] == "minimize"
    assert {(p["backbone"], p["metric"], p["value"]) for p in s.published} == {
        ("RN50", "top1", 55.78), ("RN50", "ece20", 3.96), ("ViT-B/16", "top1", 74.87), ("ViT-B/16", "ece20", 1.39)}


# -- golden checks: the authors' code ---------------------------------------------------------------------------

VARIANTS = {"ds": {"lambda_angular": 10.0, "objective": "maximize"},
            "fg": {"lambda_angular": 80.0, "objective": "minimize"},
            "fg_steps2": {"lambda_angular": 80.0, "objective": "minimize", "steps": 2}}
SAMPLES = range(4)
SCALARS = ("loss", "entropy_loss")   # the extras their code saved per sample


@pytest.fixture(scope="module")
def golden(golden_dir, golden_model, one_thread_module):
    expected = torch.load(FIXTURES / "atpt" / "atpt.pt", weights_only=True)
    model, classnames = golden_model
    inputs = torch.load(golden_dir / "inputs.pt", weights_only=True)["views_unit"]
    got = run_variants("atpt", model, classnames, inputs, VARIANTS, SAMPLES, SCALARS)
    return {"expected": expected, "got": got}


@pytest.mark.golden
@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_golden_key(golden, variant):
    failures = key_failures(golden["expected"], golden["got"], variant, n_samples=len(SAMPLES),
                            steps=VARIANTS[variant].get("steps", 1), scalars=SCALARS,
                            scalar_tol=lambda want: max(LOSS, OTPT_LOSS_REL * float(want.abs())), logits_tol=LOGITS)
    assert not failures, "\n".join(failures)


def test_fixture_records_both_files_and_their_signs():
    info = json.loads((FIXTURES / "atpt" / "atpt.json").read_text())["fixtures"]
    assert info["ds"]["module"] == "tpt_classification.py" and info["fg"]["module"] == "atpt_classification.py"

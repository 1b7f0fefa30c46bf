"""O-TPT: its orthogonality penalty against the authors' Householder construction written out, one tuning
step against a plain-torch computation, and the authors' own code on the golden tiny CLIP
(tests/fixtures/golden/otpt, made by the driver beside it from ashshaksharifdeen/O-TPT's
`test_time_adapt_eval`, float32 on the CPU: lambda 2 and 18, one and two steps, 4 samples of 32 views).

Golden tolerances: tests/_golden.py's and the fixture's tolerances.json (the loss of lambda 18 is ~106: LOSS or
OTPT_LOSS_REL of its size, whichever is larger); the selected views as a set after a margin check, as
tests/methods/test_tpt.py.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FIXTURES, LOGITS, LOSS, OptimizerStepRecorder, fixture_tolerances
from _imports import lazy_module
from _prompt_tuning_golden import key_failures, run_variants
from conftest import make_tiny_model
from shiftlab import ClassHeads, SampleContext
from shiftlab.methods.tpt.method import orthogonality_penalty

OTPT_LOSS_REL = fixture_tolerances("otpt")["loss_rel"]  # tests/fixtures/golden/otpt/tolerances.json

open_clip = lazy_module("open_clip", optional=False)   # imported by the first test that reads it


NAMES = ["goldfish", "great white shark", "hammerhead shark", "stingray", "cock", "hen", "ostrich", "brambling"]
N_VIEWS = 20
LR, WD = 5e-3, 0.01

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return make_tiny_model(seed=2)


@pytest.fixture(scope="module")
def heads(model):
    return ClassHeads(model, NAMES)


def householder_penalty(text: torch.Tensor) -> torch.Tensor:
    """The authors' construction (otpt_classification.py:236-286), written out row by row."""
    c = text.shape[0]
    gram = text @ text.T
    col_norms = torch.stack([gram[:, j].norm() for j in range(c)])
    terms = []
    for i in range(c):
        e_i = torch.zeros(c, dtype=text.dtype)
        e_i[i] = 1.0
        u = gram[i] - col_norms[i] * e_i
        v = u / u.norm()
        reflected = gram[i] - 2 * v * (v @ gram[i])          # (I - 2 v v^T) w_i
        terms.append((reflected - e_i).norm())
    return torch.stack(terms).mean()


def test_penalty_equals_the_authors_householder_reflections_value_and_gradient():
    gen = torch.Generator().manual_seed(0)
    raw = torch.randn(7, 5, generator=gen, dtype=torch.float64)
    a = raw.clone().requires_grad_(True)
    b = raw.clone().requires_grad_(True)
    want = householder_penalty(F.normalize(a, dim=-1))
    got = orthogonality_penalty(F.normalize(b, dim=-1))
    assert float(got.detach()) == pytest.approx(float(want.detach()), abs=1e-12)
    want.backward()
    got.backward()
    torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=1e-12)
    assert a.grad.abs().max() > 1e-3
    # orthonormal features are not penalised; batched input gives one value per row
    assert float(orthogonality_penalty(torch.eye(4))) == 0.0
    both = torch.stack([F.normalize(raw, dim=-1), F.normalize(raw.flip(0), dim=-1)]).float()
    torch.testing.assert_close(orthogonality_penalty(both), orthogonality_penalty(both[0]).expand(2))


# -- one step against plain torch -----------------------------------------------------------------------

def hand_text(model, ctx: torch.Tensor) -> torch.Tensor:
    clip = model.clip
    tokens = open_clip.tokenize([f"a photo of a {n}." for n in NAMES])
    emb = clip.token_embedding(tokens)
    emb = torch.cat([emb[:, :1], ctx.unsqueeze(0).expand(len(NAMES), -1, -1), emb[:, 1 + ctx.shape[0]:]], dim=1)
    x = clip.transformer(emb + clip.positional_embedding, attn_mask=clip.attn_mask)
    x = clip.ln_final(x)[torch.arange(len(NAMES)), tokens.argmax(-1)] @ clip.text_projection
    return x / x.norm(dim=-1, keepdim=True)


def init_ctx(model) -> torch.Tensor:
    ids = open_clip.tokenize(["a photo of a"])[0, 1:5]
    return model.clip.token_embedding.weight[ids].detach().clone()


def make_context(model, heads, seed: int) -> SampleContext:
    gen = torch.Generator().manual_seed(seed)
    text = heads.zeroshot
    cls = torch.randint(0, len(NAMES), (N_VIEWS,), generator=gen)
    strength = torch.linspace(0.2, 3.0, N_VIEWS)[torch.randperm(N_VIEWS, generator=gen)]
    noise = F.normalize(torch.randn(N_VIEWS, text.shape[1], generator=gen), dim=-1)
    feats = F.normalize(strength[:, None] * text[cls] + noise, dim=-1)
    return SampleContext(model, heads, torch.zeros(N_VIEWS, 3, 64, 64), image_features=feats)


def test_one_step_matches_hand_computation(model, heads):
    ctx = make_context(model, heads, 0)
    feats = ctx.image_features
    lam = 3.0
    method = shiftlab.create_method("otpt", model, NAMES, heads=heads, lambda_ortho=lam)
    with OptimizerStepRecorder() as rec:
        out = method.predict_context(ctx)
    # written out: TPT's marginal entropy over the 2 lowest-entropy views + lambda * mean_c | ||(T T^T)_c|| - 1 |
    ctx0 = init_ctx(model).requires_grad_(True)
    text = hand_text(model, ctx0)
    logits = model.clip.logit_scale.exp() * feats @ text.T
    probs = logits.softmax(-1)
    ent = -(probs * probs.log()).sum(-1)
    selected = sorted(range(N_VIEWS), key=lambda v: float(ent[v]))[:int(N_VIEWS * 0.1)]
    avg = probs[selected].mean(0)
    ent_loss = -(avg * avg.log()).sum()
    rows = [torch.sqrt(sum((text[c] @ text[j]) ** 2 for j in range(len(NAMES)))) for c in range(len(NAMES))]
    ortho = sum(abs(r - 1) for r in rows) / len(NAMES)
    loss = ent_loss + lam * ortho
    (grad,) = torch.autograd.grad(loss, ctx0)
    ctx1 = (ctx0 * (1 - LR * WD) - LR * grad / (grad.abs() + 1e-8)).detach()

    assert out.extras["selected"] == selected
    assert out.extras["entropy_loss"] == pytest.approx(float(ent_loss), abs=1e-5)
    assert out.extras["orthogonality"] == pytest.approx(float(ortho), abs=1e-5)
    assert out.extras["loss"] == pytest.approx(float(loss), abs=2e-5)
    err = float((rec.grad[0][0] - grad).abs().max())
    assert err <= 1e-3 * float(grad.abs().max())
    torch.testing.assert_close(rec.param[0][0], ctx1, rtol=0, atol=1e-6)
    with torch.no_grad():
        tuned = hand_text(model, ctx1)
    torch.testing.assert_close(out.logits, model.clip.logit_scale.exp() * feats[0] @ tuned.T, rtol=0, atol=1e-4)
    assert out.extras["orthogonality_after"] == pytest.approx(float(orthogonality_penalty(tuned)), abs=1e-5)
    json.dumps(out.extras)


def test_zero_lambda_is_tpt_and_lambda_matters(model, heads):
    c = make_context(model, heads, 1)
    tpt = shiftlab.create_method("tpt", model, NAMES, heads=heads)
    otpt0 = shiftlab.create_method("otpt", model, NAMES, heads=heads, lambda_ortho=0.0)
    otpt = shiftlab.create_method("otpt", model, NAMES, heads=heads)
    assert otpt.config.lambda_ortho == 2.0
    a, b, o = tpt.predict_context(c), otpt0.predict_context(c), otpt.predict_context(c)
    assert a.extras["loss"] == b.extras["loss"] == b.extras["entropy_loss"]
    torch.testing.assert_close(b.logits, a.logits, rtol=0, atol=1e-5)
    assert o.extras["loss"] == pytest.approx(o.extras["entropy_loss"] + 2.0 * o.extras["orthogonality"], abs=1e-5)
    assert (o.logits - a.logits).abs().max() > 1e-3
    # the penalty goes down with the step that minimises it
    assert o.extras["orthogonality_after"] < o.extras["orthogonality"]


def test_batched_tuning_equals_one_at_a_time(model, heads):
    ctxs = [make_context(model, heads, s) for s in range(3)]
    single = shiftlab.create_method("otpt", model, NAMES, heads=heads)
    batched = shiftlab.create_method("otpt", model, NAMES, heads=heads, batch_size=3)
    ones = [single.predict_context(c) for c in ctxs]
    many = batched.predict_batch(ctxs)
    for a, b in zip(ones, many):
        torch.testing.assert_close(b.logits, a.logits, rtol=0, atol=1e-5)
        assert a.extras["selected"] == b.extras["selected"]
        for key in ("loss", "entropy_loss", "orthogonality", "orthogonality_after"):
            assert b.extras[key] == pytest.approx(a.extras[key], abs=1e-5), key


def test_config_and_facts():
    with pytest.raises(ValueError, match="lambda_ortho"):
        shiftlab.create_method("otpt", make_tiny_model(seed=0), NAMES, lambda_ortho=-1.0)
    from shiftlab.methods.catalogue.declarations import spec
    s = spec("otpt")
    assert s.dataset_values["imagenet-r"]["lambda_ortho"] == 2.0
    assert s.dataset_values["dtd"]["lambda_ortho"] == 18.0
    assert {(p["metric"], p["value"]) for p in s.published} == {("top1", 72.55), ("ece20", 1.46)}


# -- golden checks: the authors' code ---------------------------------------------------------------------------

VARIANTS = {"otpt_ds": {"lambda_ortho": 2.0}, "otpt_fg": {"lambda_ortho": 18.0},
            "otpt_steps2": {"lambda_ortho": 18.0, "steps": 2}}
SAMPLES = range(4)
SCALARS = ("loss", "entropy_loss")   # the extras their code saved per sample


@pytest.fixture(scope="module")
def golden(golden_dir, one_thread_module):
    expected = torch.load(FIXTURES / "otpt" / "otpt.pt", weights_only=True)
    info = json.loads((golden_dir / "golden.json").read_text())
    inputs = torch.load(golden_dir / "inputs.pt", weights_only=True)["views_unit"]
    model = shiftlab.load_model("shiftlab-tiny", str(golden_dir / "tiny_clip_openai.pt"))
    got = run_variants("otpt", model, info["classnames"], inputs, VARIANTS, SAMPLES, SCALARS)
    return {"expected": expected, "got": got}


@pytest.mark.golden
@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_golden_key(golden, variant):
    failures = key_failures(golden["expected"], golden["got"], variant, n_samples=len(SAMPLES),
                            steps=VARIANTS[variant].get("steps", 1), scalars=SCALARS,
                            scalar_tol=lambda want: max(LOSS, OTPT_LOSS_REL * float(want.abs())), logits_tol=LOGITS)
    assert not failures, "\n".join(failures)

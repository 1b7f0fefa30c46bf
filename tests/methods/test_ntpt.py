"""N-TPT: its simplex penalty against a plain computation, one tuning step against a plain-torch computation, and
TTABC's own ntpt.py on the golden tiny CLIP (tests/fixtures/golden/ntpt, made by the driver beside it: TTABC's
`NTPT.test_time_adapt_eval`, float32 on the CPU, lambda 10, one and two steps, 4 samples of 32 views).

Golden tolerances: tests/_golden.py's (the logits after two steps: TUNED_LOGITS); the selected views as a set
after a margin check, as tests/methods/test_tpt.py.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import (
    FIXTURES,
    LOGITS,
    LOSS,
    TUNED_LOGITS,
    OptimizerStepRecorder,
)
from _imports import lazy_module
from _prompt_tuning_golden import key_failures, run_variants
from shiftlab import ClassHeads, SampleContext
from shiftlab.methods.ntpt.method import simplex_penalty

open_clip = lazy_module("open_clip", optional=False)   # imported by the first test that reads it

NAMES = ["goldfish", "great white shark", "hammerhead shark", "stingray", "cock", "hen", "ostrich", "brambling"]
N_VIEWS = 20
LR, WD = 5e-3, 0.01

pytestmark = pytest.mark.usefixtures("one_thread")


def test_simplex_penalty_is_the_mean_squared_gap_to_the_simplex_cosine():
    gen = torch.Generator().manual_seed(0)
    raw = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    text = F.normalize(raw, dim=-1)
    k, target = 6, 1 / (1 - 6)
    off = sum((float(text[i] @ text[j]) - target) ** 2 for i in range(k) for j in range(k) if i != j)
    # the diagonal, set to 0, adds k * target^2 (their arithmetic): a constant
    want = (off + k * target ** 2) / (k * (k - 1))
    assert float(simplex_penalty(raw)) == pytest.approx(want, abs=1e-12)
    # a regular simplex (pairwise cosine 1/(1-K)) leaves only the constant
    simplex = torch.eye(4, dtype=torch.float64) - 0.25
    assert float(simplex_penalty(simplex)) == pytest.approx(4 * (1 / 3) ** 2 / 12, abs=1e-12)
    both = torch.stack([raw, raw.flip(0)])
    torch.testing.assert_close(simplex_penalty(both), simplex_penalty(raw).expand(2))


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


def test_one_step_matches_hand_computation(tiny_model):
    model = tiny_model
    heads = ClassHeads(model, NAMES)
    ctx = make_context(model, heads, 0)
    feats = ctx.image_features
    lam = 3.0
    method = shiftlab.create_method("ntpt", model, NAMES, heads=heads, lambda_simplex=lam)
    with OptimizerStepRecorder() as rec:
        out = method.predict_context(ctx)
    # written out: TPT's marginal entropy over the 2 lowest-entropy views + lambda * the simplex penalty
    ids = open_clip.tokenize(["a photo of a"])[0, 1:5]
    ctx0 = model.clip.token_embedding.weight[ids].detach().clone().requires_grad_(True)
    text = hand_text(model, ctx0)
    probs = (model.clip.logit_scale.exp() * feats @ text.T).softmax(-1)
    ent = -(probs * probs.log()).sum(-1)
    selected = sorted(range(N_VIEWS), key=lambda v: float(ent[v].detach()))[:int(N_VIEWS * 0.1)]
    avg = probs[selected].mean(0)
    ent_loss = -(avg * avg.log()).sum()
    k = len(NAMES)
    cos = text @ text.T
    gap = sum((cos[i, j] - 1 / (1 - k)) ** 2 for i in range(k) for j in range(k) if i != j)
    penalty = (gap + k / (1 - k) ** 2) / (k * (k - 1))
    loss = ent_loss + lam * penalty
    (grad,) = torch.autograd.grad(loss, ctx0)
    ctx1 = (ctx0 * (1 - LR * WD) - LR * grad / (grad.abs() + 1e-8)).detach()

    assert out.extras["selected"] == selected
    assert out.extras["entropy_loss"] == pytest.approx(float(ent_loss.detach()), abs=1e-5)
    assert out.extras["simplex"] == pytest.approx(float(penalty.detach()), abs=1e-6)
    assert out.extras["loss"] == pytest.approx(float(loss.detach()), abs=2e-5)
    err = float((rec.grad[0][0] - grad).abs().max())
    assert err <= 1e-3 * float(grad.abs().max())
    torch.testing.assert_close(rec.param[0][0], ctx1, rtol=0, atol=1e-6)
    with torch.no_grad():
        tuned = hand_text(model, ctx1)
    torch.testing.assert_close(out.logits, model.clip.logit_scale.exp() * feats[0] @ tuned.T, rtol=0, atol=1e-4)
    # the step lowers the penalty it minimises
    assert out.extras["simplex_after"] < out.extras["simplex"]


def test_config_and_facts(tiny_model):
    with pytest.raises(ValueError, match="lambda_simplex"):
        shiftlab.create_method("ntpt", tiny_model, NAMES, lambda_simplex=-1.0)
    assert shiftlab.create_method("ntpt", tiny_model, NAMES).config.lambda_simplex == 10.0


# -- golden checks: the authors' code ---------------------------------------------------------------------------

VARIANTS = {"ntpt": {}, "ntpt_steps2": {"steps": 2}}
SAMPLES = range(4)
SCALARS = ("loss", "entropy_loss", "simplex")   # the extras their code saved per sample


@pytest.fixture(scope="module")
def golden(golden_dir, golden_model, one_thread_module):
    expected = torch.load(FIXTURES / "ntpt" / "ntpt.pt", weights_only=True)
    model, classnames = golden_model
    inputs = torch.load(golden_dir / "inputs.pt", weights_only=True)["views_unit"]
    got = run_variants("ntpt", model, classnames, inputs, VARIANTS, SAMPLES, SCALARS)
    return {"expected": expected, "got": got}


@pytest.mark.golden
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_golden_key(golden, variant):
    steps = VARIANTS[variant].get("steps", 1)
    # after two steps the logits read a prompt the tuning moved twice: TUNED_LOGITS (3.5e-4 measured)
    failures = key_failures(golden["expected"], golden["got"], variant, n_samples=len(SAMPLES), steps=steps,
                            scalars=SCALARS, scalar_tol=lambda want: LOSS,
                            logits_tol=TUNED_LOGITS if steps > 1 else LOGITS)
    assert not failures, "\n".join(failures)

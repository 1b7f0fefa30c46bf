"""CLIP-OT: its Sinkhorn codes and loss against a straightforward computation, the refusal on a tower without
LayerNorms, and its authors' code (github.com/shambhavicodes/CLIPOT: `clipot.py`, `modeling/models.py`, main.py's
loop) on the golden tiny ViT (tests/fixtures/golden/clip_ot, made by the driver beside the fixtures, float32 on the
CPU).

Golden: 24 images in 3 batches of 8, three templates (the ones whose tokens the compact tiny ViT keeps), continual;
their lr and Sinkhorn settings and a faster variant that moves the LayerNorms ~100 times more. After every batch the
logits (LOGITS: measured 8e-6), every adapted LayerNorm parameter (NORM_PARAMS: measured 8e-7) and the first
template step's loss (LOSS: measured 5e-7); the predictions exactly after a top-1 margin check.
"""
from __future__ import annotations

import json

import pytest
import torch

import shiftlab
from _golden import LOGITS, LOSS, NORM_PARAMS, assert_close, assert_top1_margin, stream_views
from shiftlab.methods.clip_ot.method import sinkhorn_codes, soft_cross_entropy
from shiftlab.methods.context import SampleContext

pytestmark = pytest.mark.usefixtures("one_thread")

TEMPLATES = ("a photo of a {}.", "a {}.", "a photo of {}.")
# the driver's variants (tests/fixtures/golden/clip_ot/clip_ot.json), as shiftlab configs
VARIANTS = {"clip_ot": {"lr": 1e-4, "temperature": 0.01, "epsilon": 0.7},
            "clip_ot_fast": {"lr": 1e-2, "temperature": 0.05, "epsilon": 0.5}}


def _sinkhorn_by_hand(s: torch.Tensor, eps: float, iters: int) -> torch.Tensor:
    q = [[float(torch.exp(v / eps)) for v in row] for row in s]           # (B, C)
    b, c = len(q), len(q[0])
    q = [[v / sum(row) for v in row] for row in q]                        # each image's column sums to 1
    for _ in range(iters):
        class_sums = [sum(q[i][k] for i in range(b)) for k in range(c)]
        q = [[q[i][k] * (1 / c) / (class_sums[k] + 1e-8) for k in range(c)] for i in range(b)]
        image_sums = [sum(row) for row in q]
        q = [[v * (1 / b) / (image_sums[i] + 1e-8) for v in q[i]] for i in range(b)]
    return torch.tensor([[v / sum(row) for v in row] for row in q])


def test_sinkhorn_codes_match_a_loop_by_hand_and_balance_the_classes():
    s = torch.tensor([[0.9, 0.1, 0.0], [0.8, 0.2, 0.1], [0.7, 0.0, 0.3], [0.1, 0.6, 0.2]])
    codes = sinkhorn_codes(s, 0.3, 3, stable=False)
    torch.testing.assert_close(codes, _sinkhorn_by_hand(s, 0.3, 3), rtol=0, atol=1e-6)
    torch.testing.assert_close(codes.sum(1), torch.ones(4))
    many = sinkhorn_codes(s, 0.3, 200)
    torch.testing.assert_close(many.sum(0), torch.full((3,), 4 / 3), rtol=0, atol=1e-4)   # equal class mass
    torch.testing.assert_close(sinkhorn_codes(s, 0.3, 3, stable=True), codes, rtol=0, atol=1e-6)


def test_the_stable_codes_stay_finite_where_theirs_overflow():
    s = torch.tensor([[1.0, 0.2], [0.1, 0.9]]) / 0.01          # cosines at temperature 0.01: exp(s / 0.7) overflows
    assert torch.isnan(sinkhorn_codes(s, 0.7, 3, stable=False)).any()
    stable = sinkhorn_codes(s, 0.7, 3, stable=True)
    assert torch.isfinite(stable).all() and stable.argmax(1).tolist() == [0, 1]


def test_the_loss_is_the_soft_cross_entropy():
    codes = torch.tensor([[0.7, 0.3], [0.2, 0.8]])
    logits = torch.tensor([[2.0, 0.0], [0.5, 1.5]])
    want = -sum(float(codes[i] @ logits[i].log_softmax(0)) for i in range(2)) / 2
    assert float(soft_cross_entropy(codes, logits)) == pytest.approx(want, abs=1e-6)


def test_a_resnet_is_refused_in_one_line_before_and_at_load(tiny_model):
    from shiftlab.engine.config import RunConfig, settings_problem
    with pytest.raises(ValueError, match=r"^clip_ot: runs on a ViT image tower only, and shiftlab-tiny is a ResNet: "):
        shiftlab.create_method("clip_ot", tiny_model, ["a", "b"])
    problem = settings_problem(RunConfig(dataset="imagenet-r", model="RN50", methods=["clip_ot"]))
    assert problem.startswith("clip_ot: runs on a ViT image tower only, and RN50 is a ResNet: it adapts the "
                              "tower's LayerNorms") and "\n" not in problem


def test_more_steps_than_templates_are_refused(tiny_vit_model):
    with pytest.raises(ValueError, match="clip_ot.steps: 3 steps need as many templates, 2 given"):
        shiftlab.create_method("clip_ot", tiny_vit_model, ["a", "b"], templates=("a {}.", "b {}."), steps=3)


def test_the_first_batch_adapts_against_template_zero_and_later_ones_against_the_mean(tiny_vit_model):
    model = tiny_vit_model
    method = shiftlab.create_method("clip_ot", model, ["cat", "dog", "car"], steps=1)
    assert not method.averaged_head
    torch.testing.assert_close(method.adaptation_head(),
                               torch.nn.functional.normalize(method.template_features[:, 0], dim=-1))
    batch = model.normalize(torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1)))
    method.adapt_batch([SampleContext(model, method.heads, batch[i:i + 1]) for i in range(2)])
    assert method.averaged_head and method.state_dict()["extra"] == {"averaged_head": True}
    torch.testing.assert_close(method.adaptation_head(), method.head)
    method.reset()
    assert not method.averaged_head


# -- their code (tests/fixtures/golden/clip_ot) --------------------------------------------------------------


def test_the_fixture_ran_their_settings(golden_dir):
    info = json.loads((golden_dir / "clip_ot" / "clip_ot.json").read_text())
    assert info["reference"]["commit"] == "81b8a4e8bb47534d6f8f9c820f4fc53a2d87a4b6"
    assert info["fixtures"]["clip_ot"]["lr"] == 1e-4 and info["fixtures"]["clip_ot"]["epsilon"] == 0.7
    assert info["fixtures"]["clip_ot"]["templates"] == list(TEMPLATES)


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_clip_ot_matches_their_code_batch_by_batch(golden_vit, golden_dir, variant):
    model, names, heads = golden_vit
    want = torch.load(golden_dir / "clip_ot" / f"{variant}.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "clip_ot" / "clip_ot.json").read_text())["fixtures"][variant]
    method = shiftlab.create_method("clip_ot", model, names, heads=heads, templates=TEMPLATES, steps=3,
                                    **VARIANTS[variant])
    assert_close(method.template_features, want["text_embeddings"], LOGITS, "unnormalised text features")
    assert method.tower.parameter_names == info["adapted"]
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    for b in range(info["n_batches"]):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[8 * b:8 * b + 8]])
        logits = torch.stack([o.logits for o in outs])
        assert_close(logits, want[f"{b}/logits"], LOGITS, f"batch {b} logits")
        assert outs[0].extras["loss"] == pytest.approx(float(want[f"{b}/loss/0"]), abs=LOSS)
        assert outs[0].extras["last_loss"] == pytest.approx(float(want[f"{b}/loss/2"]), abs=LOSS)
        for name, value in method.tower.norm_state().items():
            assert_close(value, want[f"{b}/norm/{name}"], NORM_PARAMS, f"batch {b} {name}")
        assert_top1_margin(want[f"{b}/logits"], LOGITS, f"batch {b}")
        assert torch.equal(logits.argmax(1), want[f"{b}/logits"].argmax(1))

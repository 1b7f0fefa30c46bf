"""VTE: its computation against a plain one on synthetic features, and mariodoebler/test-time-adaptation's own
`methods/vte.py` on its ZeroShotCLIP, run on the golden tiny CLIP (tests/fixtures/golden/vte, made by the driver
beside it: the 80-template ensemble with selection 0.1 and one template with 0.25, 4 samples of 32 views).

Golden tolerances: tests/_golden.py's; the selected views as a set after a margin check, as tests/methods/test_tpt.py.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FEATURES, FIXTURES, LOGITS, assert_close, assert_selection_margin, entropy_tolerance
from shiftlab import ClassHeads, SampleContext
from shiftlab.methods.common.confidence import entropy
from shiftlab.methods.vte.method import vte

pytestmark = pytest.mark.usefixtures("one_thread")


def test_vte_is_the_mean_confident_feature_against_the_head():
    gen = torch.Generator().manual_seed(0)
    feats = F.normalize(torch.randn(20, 8, generator=gen, dtype=torch.float64), dim=-1).float()
    head = F.normalize(torch.randn(5, 8, generator=gen, dtype=torch.float64), dim=-1).float()
    res = vte(feats, head, 30.0, 0.25)
    # written out: entropy of every view, the 5 lowest, their plain mean (no re-normalisation), scaled cosines
    probs = (30.0 * feats.double() @ head.double().T).softmax(-1)
    ent = -(probs * probs.log()).sum(-1)
    order = sorted(range(20), key=lambda v: float(ent[v]))[:5]
    mean = feats.double()[order].mean(0)
    assert res.selected.tolist() == order
    assert float(mean.norm()) < 0.99          # the mean of unit vectors is shorter, and kept so
    torch.testing.assert_close(res.logits.double(), 30.0 * mean @ head.double().T, rtol=0, atol=1e-5)
    # batched: one result per sample
    both = vte(torch.stack([feats, feats.flip(0)]), head, 30.0, 0.25)
    torch.testing.assert_close(both.logits[0], res.logits)
    assert both.selected[1].tolist() == [19 - v for v in order]
    # a ratio that truncates to no view still averages one (their code would average none: NaN)
    assert vte(feats, head, 30.0, 0.01).selected.tolist() == order[:1]


def test_method_reads_the_head_its_config_names(tiny_model):
    model = tiny_model
    names = ["goldfish", "great white shark", "stingray", "hen"]
    heads = ClassHeads(model, names)
    gen = torch.Generator().manual_seed(1)
    ctx = SampleContext(model, heads, torch.zeros(12, 3, 64, 64),
                        image_features=F.normalize(torch.randn(12, heads.zeroshot.shape[1], generator=gen), dim=-1))
    ens = shiftlab.create_method("vte", model, names, heads=heads)
    one = shiftlab.create_method("vte", model, names, heads=heads, text_head="zeroshot", selection_ratio=0.5)
    assert (ens.config.text_head, ens.config.selection_ratio) == ("ensemble", 0.1)
    a, b = ens.predict_context(ctx), one.predict_context(ctx)
    torch.testing.assert_close(a.logits, vte(ctx.image_features, heads.ensemble, model.logit_scale, 0.1).logits)
    torch.testing.assert_close(b.logits, vte(ctx.image_features, heads.zeroshot, model.logit_scale, 0.5).logits)
    assert len(a.extras["selected"]) == 1 and len(b.extras["selected"]) == 6
    with pytest.raises(ValueError, match="selection_ratio"):
        shiftlab.create_method("vte", model, names, selection_ratio=0.0)


# -- golden checks: mariodoebler's code ---------------------------------------------------------------------------

VARIANTS = {"ensemble": {}, "single": {"text_head": "zeroshot", "selection_ratio": 0.25}}
SAMPLES = range(4)


@pytest.fixture(scope="module")
def golden(golden_dir, golden_model, one_thread_module):
    expected = torch.load(FIXTURES / "vte" / "vte.pt", weights_only=True)
    model, classnames = golden_model
    inputs = torch.load(golden_dir / "inputs.pt", weights_only=True)["views_unit"]
    heads = ClassHeads(model, classnames)
    got: dict[str, torch.Tensor] = {}
    for variant, config in VARIANTS.items():
        method = shiftlab.create_method("vte", model, classnames, heads=heads, **config)
        head = heads.ensemble if variant == "ensemble" else heads.zeroshot
        got[f"{variant}/text_features"] = head
        for i in SAMPLES:
            ctx = SampleContext(model, heads, model.normalize(inputs[i]))
            out = method.predict_context(ctx)
            p = f"{variant}/{i}/"
            got[p + "view_logits"] = model.logit_scale * ctx.image_features @ head.T
            got[p + "selected"] = torch.tensor(out.extras["selected"])
            got[p + "logits"] = out.logits[None]
    return {"expected": expected, "got": got}


@pytest.mark.golden
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_golden_key(golden, variant):
    expected, got = golden["expected"], golden["got"]
    keys = sorted(k for k in expected if k.startswith(variant + "/"))
    assert len(keys) == 1 + 3 * len(SAMPLES), keys
    for key in keys:
        name = key.rsplit("/", 1)[-1]
        have, want = got[key].detach().float(), expected[key]
        assert have.shape == want.shape, f"{key}: shape {tuple(have.shape)} != {tuple(want.shape)}"
        if name == "selected":
            view_logits = got[key.rsplit("/", 1)[0] + "/view_logits"]
            assert_selection_margin(entropy(view_logits), len(want), entropy_tolerance(view_logits, LOGITS), key)
            assert sorted(have.tolist()) == sorted(want.tolist()), f"{key}: {have.tolist()} != {want.tolist()}"
        elif name == "text_features":
            assert_close(have, want, FEATURES, key)
        else:
            assert_close(have, want, LOGITS, key)

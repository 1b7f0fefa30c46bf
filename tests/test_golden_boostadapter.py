"""BoostAdapter against its authors' own code on the 24-sample stream (tests/fixtures/golden/online).

The fixtures (tools/golden/make_golden.py with tools/golden/driver_boostadapter.py, from
taolinzhang/BoostAdapter, float32 on the CPU) hold, after every sample, the authors' output, their
historical positive and negative caches and the boosted positive cache their read-out used.
`boostadapter`: configs/imagenet_r.yaml on the ImageNet-R path (the sample is the mean of its
confident views); `boostadapter_original`: configs/caltech101.yaml on the fine-grained path (view 0
is the sample); `boostadapter_small`: one-entry caches, delta 1, the negative cache open to all.

Tolerances as tests/test_golden_online.py (float32): logits 2e-4, features 1e-5, entropies and
probabilities 1e-5; labels, view indices and cache orders exactly.
"""
from __future__ import annotations

import pytest
import torch

import shiftlab
from _golden import online_fixture, stream_views
from shiftlab.methods.boostadapter.method import BoostAdapter
from shiftlab.methods.context import ClassHeads, SampleContext

LOGITS, FEATURES, FINE = 2e-4, 1e-5, 1e-5


pytestmark = [pytest.mark.golden, pytest.mark.usefixtures("one_thread")]


def _close(got: torch.Tensor, want: torch.Tensor, atol: float, what: str) -> float:
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    torch.testing.assert_close(got, want, rtol=0, atol=atol, msg=lambda m: f"{what}: {m}")
    return float((got - want).abs().max()) if got.numel() else 0.0


def _settings(cfg: dict, sample_view: str) -> dict:
    pos, neg = cfg["positive"], cfg["negative"]
    return {"logit_scale": 100.0,   # the authors' literal 100 (utils.py:84)
            "pos_capacity": pos["shot_capacity"], "pos_alpha": pos["alpha"], "pos_beta": pos["beta"],
            "neg_capacity": neg["shot_capacity"], "neg_alpha": neg["alpha"], "neg_beta": neg["beta"],
            "neg_entropy_lower": neg["entropy_threshold"]["lower"],
            "neg_entropy_upper": neg["entropy_threshold"]["upper"],
            "neg_mask_lower": neg["mask_threshold"]["lower"], "neg_mask_upper": neg["mask_threshold"]["upper"],
            "delta": cfg["delta"], "sample_view": sample_view}


def _check_cache(got: dict, want: dict, key: str, i: int, what: str, worst: dict) -> None:
    assert got["labels"] == want[f"{i}/{key}/labels"].tolist(), f"sample {i}: {what} labels"
    if got["labels"]:
        _close(torch.tensor(got["losses"]), want[f"{i}/{key}/losses"], FINE, f"{i} {what} losses")
        worst["features"] = max(worst.get("features", 0), _close(
            got["features"], want[f"{i}/{key}/features"], FEATURES, f"{i} {what} features"))
        if "probs" in got:
            _close(got["probs"], want[f"{i}/{key}/probs"], FINE, f"{i} {what} probs")


@pytest.mark.slow
@pytest.mark.parametrize("name,sample_view", [("boostadapter", "confident"), ("boostadapter_original", "original"),
                                              ("boostadapter_small", "confident")])
def test_boostadapter_matches_the_authors_code_sample_by_sample(golden_model, golden_dir, name, sample_view):
    model, classnames = golden_model
    want, info = online_fixture(golden_dir, name)
    assert info["repository"] == "https://github.com/taolinzhang/BoostAdapter"
    heads = ClassHeads(model, classnames, templates=info["templates"])
    _close(heads.ensemble, want["text_features"], FEATURES, "text features")
    ba = shiftlab.create_method("boostadapter", model, classnames, heads=heads,
                                **_settings(info["config"], sample_view))
    worst: dict[str, float] = {}
    boost_evicted = neg_seen = 0
    for i, views in enumerate(stream_views(golden_dir, info["n_views"])):
        assert bool(want[f"{i}/infer_ori_image"]) == (sample_view == "original")
        ctx = SampleContext(model, heads, model.normalize(views))
        b = ba.summarize_boost(ctx.image_features)
        assert b.boost_views.tolist() == want[f"{i}/boost_idx"].tolist(), f"sample {i}: boosting views"
        assert b.sample.pred == int(want[f"{i}/pred"]), f"sample {i}: pseudo-label"
        _close(b.sample.feature, want[f"{i}/feature"], FEATURES, f"{i} sample feature")
        _close(torch.tensor(b.sample.loss), want[f"{i}/loss"], FINE, f"{i} sample entropy")
        out = ba.predict_context(ctx)
        worst["logits"] = max(worst.get("logits", 0), _close(out.logits, want[f"{i}/logits"], LOGITS, f"{i} logits"))
        state = ba.state_dict()
        _check_cache(state["positive"], want, "pos", i, "positive cache", worst)
        _check_cache(state["negative"], want, "neg", i, "negative cache", worst)
        _check_cache(BoostAdapter._cache_state(ba.last_boosted, False), want, "boost", i, "boosted cache", worst)
        n_boost = len(b.boost_labels)
        boost_evicted += int(len(want[f"{i}/boost/labels"]) < len(want[f"{i}/pos/labels"]) + n_boost)
        neg_seen += int(len(state["negative"]["labels"]) > 0)
    assert boost_evicted > 0                                    # the stream exercises the boosted capacity
    if name == "boostadapter_small":
        assert neg_seen > 0                                     # ... and the negative cache
    print(name, "largest differences:", worst)

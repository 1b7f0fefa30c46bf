"""DPE's pieces (shiftlab.methods.dpe.method) against straightforward computations; the whole method against its
authors' code is the golden checks below.

Golden checks (marked `golden`): DPE against its authors' own code on the 24-sample stream
(tests/fixtures/golden/online, dpe*.pt).

tools/golden/make_golden.py (driver tests/fixtures/golden/dpe/driver.py) ran zhangce01/DPE-CLIP's
`main_dpe.run_test_dpe` float32 on the CPU: `dpe` with configs/imagenet_r.yaml (align 0, readout on
view 0), `dpe_a` with configs/imagenet_a.yaml and dataset 'A' (align 2.5, so the InfoNCE term
trains the residuals; readout on the views selected again). After every sample the fixture holds the
final logits, the cache, the cache prototypes, both residuals after the AdamW step and the evolved
text head; shiftlab runs the same stream and must match them.

Tolerances: those of test_tda.py (logits 2e-4, features 1e-5, entropies 1e-5), and for
the residuals 2e-6 absolute (they are ~lr = 6e-4 in size; one AdamW step from zero moves each
entry by lr * g / (|g| + 1e-3), so a gradient that differs in the 7th digit moves it by ~1e-9;
the largest difference measured was below 1e-7). Labels, counts and the evolution decisions exactly."""
from __future__ import annotations

import json
import math
import random

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FEATURES, LOGITS, LOSS, online_fixture, stream_views
from _golden import assert_close as _close
from shiftlab.methods.catalogue.protocols import method_overrides
from shiftlab.methods.common.tda_cache import CacheEntry, update_cache
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.methods.dpe.method import (
    DPE,
    PrototypeCache,
    adamw_first_step,
    cache_readout,
    info_nce,
    prediction_entropy,
)

CLASSNAMES = ["cat", "dog", "car", "tree", "boat", "house"]


def test_adamw_first_step_is_a_fresh_torch_adamw_step():
    gen = torch.Generator().manual_seed(0)
    for start in (torch.zeros(5, 7), torch.randn(5, 7, generator=gen) * 1e-3):
        grad = torch.randn(5, 7, generator=gen) * torch.logspace(-6, 0, 7)   # |g| below and above eps
        param = torch.nn.Parameter(start.clone())
        opt = torch.optim.AdamW([param], lr=6e-4, eps=1e-3, weight_decay=0.1)
        param.grad = grad.clone()
        opt.step()
        torch.testing.assert_close(adamw_first_step(start, grad, 6e-4, 0.1, 1e-3), param.detach(), rtol=0, atol=1e-12)


def test_info_nce_is_the_cross_entropy_of_the_diagonal():
    gen = torch.Generator().manual_seed(1)
    q, p = torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen)
    sim = F.normalize(q, dim=-1) @ F.normalize(p, dim=-1).T / 0.01
    want = -torch.stack([sim[i].log_softmax(-1)[i] for i in range(4)]).mean()
    torch.testing.assert_close(info_nce(q, p, 0.01), want)


def test_prediction_entropy_and_its_gradient():
    z = torch.tensor([3.0, -1.0, 0.5, 2.0], requires_grad=True)
    p = z.softmax(-1)
    torch.testing.assert_close(prediction_entropy(z), -(p * p.log()).sum())
    (g,) = torch.autograd.grad(prediction_entropy(z), z)
    logp = z.detach().log_softmax(-1)
    h = -(logp.exp() * logp).sum()
    torch.testing.assert_close(g, -logp.exp() * (logp + h))     # dH/dz_i = -p_i (log p_i + H)


def test_cache_readout_is_the_one_hot_product():
    gen = torch.Generator().manual_seed(2)
    f = torch.randn(8, generator=gen)
    keys = F.normalize(torch.randn(3, 8, generator=gen), dim=-1)
    labels = torch.tensor([0, 2, 5])
    want = 3.0 * (-(8.0 - 8.0 * (f @ keys.T))).exp() @ F.one_hot(labels, 6).float()
    torch.testing.assert_close(cache_readout(f, keys, labels, 3.0, 8.0, 6), want)


def test_prototype_cache_follows_tdas_rule_and_averages_each_class():
    rng = random.Random(0)
    cache, ref = PrototypeCache(4, 3), {}
    for step in range(60):
        label, loss = rng.randrange(4), rng.choice([0.1, 0.2, 0.3, rng.random()])    # ties too
        feat = torch.full((5,), float(step))
        assert cache.add(label, feat, loss) == update_cache(ref, label, CacheEntry(feat, loss), 3)
        labels, losses, feats = cache.entries()
        want = [(k, e) for k in sorted(ref) for e in ref[k]]
        assert labels == [k for k, _ in want] and losses == [e.loss for _, e in want]
        assert torch.equal(feats, torch.stack([e.feature for _, e in want]))
    proto_labels, protos = cache.prototypes()
    assert proto_labels.tolist() == sorted(ref)
    for k, proto in zip(proto_labels.tolist(), protos):
        torch.testing.assert_close(proto, torch.stack([e.feature for e in ref[k]]).mean(0))


def _reference_sample(head0: torch.Tensor, feats: torch.Tensor, keys: torch.Tensor, labels: torch.Tensor, cfg,
                      scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sample of DPE written plainly: parameters, the loss, torch's AdamW, the readout of view 0."""
    r_text = torch.nn.Parameter(torch.zeros_like(head0))
    r_keys = torch.nn.Parameter(torch.zeros_like(keys))
    values = F.one_hot(labels, head0.shape[0]).float()
    w0 = F.normalize(head0, dim=-1)
    logits = scale * feats @ w0.T
    h = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    kept = torch.argsort(h, stable=True)[:max(1, int(len(feats) * cfg.view_ratio))]
    f = feats[kept].mean(0)
    w = F.normalize(head0 + r_text, dim=-1)
    k = F.normalize(keys + r_keys, dim=-1)
    final = (scale * feats[kept] @ w.T).mean(0) + cfg.pos_alpha * (cfg.pos_beta * (k @ f) - cfg.pos_beta).exp() @ values
    p = final.softmax(-1)
    loss = -(p * final.log_softmax(-1)).sum() + cfg.align * info_nce(k, w[labels], cfg.temperature)
    opt = torch.optim.AdamW([{"params": [r_text], "lr": cfg.lr_text}, {"params": [r_keys], "lr": cfg.lr_image}],
                            eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
    loss.backward()
    opt.step()
    with torch.no_grad():
        w = F.normalize(head0 + r_text, dim=-1)
        k = F.normalize(keys + r_keys, dim=-1)
        out = scale * feats[0] @ w.T + cfg.pos_alpha * (cfg.pos_beta * (k @ feats[0]) - cfg.pos_beta).exp() @ values
    return out, r_text.detach(), r_keys.detach()


def _stream(model, heads, n, views=8, seed=3):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        centre = heads.zeroshot[int(torch.randint(0, len(CLASSNAMES), (1,), generator=gen))]
        feats = F.normalize(centre + 0.5 * torch.randn(views, centre.shape[0], generator=gen), dim=-1)
        out.append(SampleContext(model, heads, torch.zeros(views, 3, 1, 1), image_features=feats))
    return out


@pytest.mark.parametrize("align", [0.0, 2.5])
def test_one_sample_matches_a_plain_implementation(tiny_model, align):
    heads = ClassHeads(tiny_model, CLASSNAMES)
    dpe = shiftlab.create_method("dpe", tiny_model, CLASSNAMES, heads=heads, text_head="zeroshot", align=align)
    ctxs = _stream(tiny_model, heads, 12)
    for ctx in ctxs[:-1]:
        dpe.predict_context(ctx)
    head0 = dpe.text_global.clone()
    state = dpe.state_dict()
    out = dpe.predict_context(ctxs[-1])
    labels, keys = dpe.memory.prototypes()
    assert len(labels) >= 2                               # the InfoNCE term has negatives
    want, r_text, r_keys = _reference_sample(head0, ctxs[-1].image_features, keys, labels, dpe.config,
                                             tiny_model.logit_scale)
    torch.testing.assert_close(dpe.last_residuals[0], r_text, rtol=0, atol=1e-7)
    torch.testing.assert_close(dpe.last_residuals[1], r_keys, rtol=0, atol=1e-7)
    torch.testing.assert_close(out.logits, want, rtol=0, atol=1e-4)
    # the evolution: a running average with the adapted head when the output is confident
    k = state["evolutions"]
    adapted = F.normalize(head0 + dpe.last_residuals[0], dim=-1)
    expect = head0 * (k / (k + 1)) + adapted / (k + 1) if out.extras["evolved"] else head0
    torch.testing.assert_close(dpe.text_global, expect)
    h = -(out.logits.softmax(-1) * out.logits.log_softmax(-1)).sum() / math.log2(len(CLASSNAMES))
    assert out.extras["final_entropy"] == pytest.approx(float(h), abs=1e-6)
    assert out.extras["evolved"] == (out.extras["final_entropy"] < 0.1)


def test_the_head_evolves_only_on_confident_outputs(tiny_model):
    heads = ClassHeads(tiny_model, CLASSNAMES)
    always = shiftlab.create_method("dpe", tiny_model, CLASSNAMES, heads=heads, text_head="zeroshot",
                                    evolve_threshold=2.0)
    never = shiftlab.create_method("dpe", tiny_model, CLASSNAMES, heads=heads, text_head="zeroshot",
                                   evolve_threshold=0.0)
    for ctx in _stream(tiny_model, heads, 5):
        always.predict_context(ctx)
        never.predict_context(ctx)
    assert always.evolutions == 5 and never.evolutions == 0
    assert torch.equal(never.text_global, heads.zeroshot)
    assert not torch.equal(always.text_global, heads.zeroshot)


def test_confident_readout_reads_the_views_selected_with_the_adapted_head(tiny_model):
    heads = ClassHeads(tiny_model, CLASSNAMES)
    ctx = _stream(tiny_model, heads, 1, views=20)[0]
    dpe = shiftlab.create_method("dpe", tiny_model, CLASSNAMES, heads=heads, text_head="zeroshot", readout="confident")
    out = dpe.predict_context(ctx)
    w = F.normalize(heads.zeroshot + dpe.last_residuals[0], dim=-1)
    logits = tiny_model.logit_scale * ctx.image_features @ w.T
    h = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    kept = torch.argsort(h, stable=True)[:2]
    labels, keys = dpe.memory.prototypes()
    protos = F.normalize(keys + dpe.last_residuals[1], dim=-1)
    f = ctx.image_features[kept].mean(0)
    want = logits[kept].mean(0) + cache_readout(f, protos, labels, 3.0, 8.0, len(CLASSNAMES))
    torch.testing.assert_close(out.logits, want)


def test_paper_protocol_is_the_authors_recipe_per_dataset():
    r = method_overrides("paper", DPE, dataset="imagenet-r")
    assert (r["precision"], r["views"], r["text_head"], r["logit_scale"]) == (
        "fp16-pure", {"n_views": 64, "augmix": True}, "tip_cupl", 100.0)
    assert (r["pos_alpha"], r["pos_beta"], r["lr_text"], r["align"]) == (3.0, 8.0, 0.0006, 0.0)
    assert "templates" not in r                            # CLIP's 80, DPE's default
    a = method_overrides("paper", DPE, dataset="imagenet-a")
    assert a["readout"] == "confident" and a["align"] == 2.5 and len(a["templates"]) == 7
    flowers = method_overrides("paper", DPE, dataset="flowers102")
    assert flowers["views"]["n_views"] == 1 and flowers["templates"] == ("a photo of a {}, a type of flower.",)
    cars = method_overrides("paper", DPE, dataset="stanford-cars")
    assert cars["templates"][0] == "a photo of a {}." and len(cars["templates"]) == 2
    assert method_overrides("leaderboard", DPE, dataset="imagenet-r") == {}


def test_bad_settings_are_refused_in_one_line(tiny_model):
    for bad, match in (({"readout": "all"}, "readout"), ({"steps": 0}, "steps"), ({"view_ratio": 0.0}, "view_ratio"),
                       ({"text_head": "cupl"}, "text_head"), ({"text_head": "tip_cupl"}, "cupl_file")):
        with pytest.raises(ValueError, match=match):
            shiftlab.create_method("dpe", tiny_model, CLASSNAMES, **bad)


def test_more_steps_start_each_from_a_fresh_adamw(tiny_model):
    heads = ClassHeads(tiny_model, CLASSNAMES)
    ctx = _stream(tiny_model, heads, 1)[0]
    one = shiftlab.create_method("dpe", tiny_model, CLASSNAMES, heads=heads, text_head="zeroshot")
    two = shiftlab.create_method("dpe", tiny_model, CLASSNAMES, heads=heads, text_head="zeroshot", steps=2)
    one.predict_context(ctx)
    two.predict_context(ctx)
    r1, r2 = one.last_residuals[0], two.last_residuals[0]
    # the second step moves each entry by at most lr after decaying the first by (1 - lr * wd)
    assert float((r2 - r1 * (1 - 6e-4 * 0.1)).abs().max()) <= 6e-4 * (1 + 1e-6)
    assert not torch.equal(r1, r2)


# -- golden checks: the authors' code --------------------------------------------------------------------------

RESIDUALS = 1e-6
FIXTURES = {"dpe": {}, "dpe_a": {"readout": "confident"}}


def _config(cfg: dict) -> dict:
    pos, lr = cfg["positive"], cfg["learning_rate"]
    return {"pos_capacity": pos["shot_capacity"], "pos_alpha": float(pos["alpha"]), "pos_beta": float(pos["beta"]),
            "lr_text": lr["text"], "lr_image": lr["image"], "align": float(lr["align"])}


@pytest.mark.golden
@pytest.mark.usefixtures("one_thread")
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_dpe_matches_the_authors_code_sample_by_sample(golden_model, golden_dir, tmp_path, name):
    model, classnames = golden_model
    want, info = online_fixture(golden_dir, name)
    cupl_file = tmp_path / "cupl.json"          # the stand-in descriptions, as a user would supply CuPL's file
    cupl_file.write_text(json.dumps(info["descriptions"]))
    heads = ClassHeads(model, classnames)
    dpe = shiftlab.create_method("dpe", model, classnames, heads=heads, text_head="tip_cupl",
                                 cupl_file=str(cupl_file), templates=tuple(info["templates"]), logit_scale=100.0,
                                 **_config(info["config"]), **FIXTURES[name])
    _close(dpe.class_head(), want["text_features"], FEATURES, "text features (80 templates + descriptions)")
    worst: dict[str, float] = {}
    evolved = evicted = 0

    def track(key: str, got: torch.Tensor, ref: torch.Tensor, atol: float, what: str) -> None:
        worst[key] = max(worst.get(key, 0.0), _close(got, ref, atol, what))

    for i, views in enumerate(stream_views(golden_dir, info["n_views"])):
        out = dpe.predict_context(SampleContext(model, heads, model.normalize(views)))
        state = dpe.state_dict()
        track("logits", out.logits, want[f"{i}/logits"], LOGITS, f"{i} logits")
        assert out.extras["norm_entropy"] == pytest.approx(float(want[f"{i}/cache_entropy"]), abs=LOSS)
        assert out.extras["final_entropy"] == pytest.approx(float(want[f"{i}/final_entropy"]), abs=LOSS)
        assert out.extras["evolved"] == (float(want[f"{i}/final_entropy"]) < 0.1), f"sample {i}: evolution"
        pos = state["positive"]
        assert pos["labels"] == want[f"{i}/pos/labels"].tolist(), f"sample {i}: cache labels"
        _close(torch.tensor(pos["losses"]), want[f"{i}/pos/losses"], LOSS, f"{i} cache losses")
        track("cache features", pos["features"], want[f"{i}/pos/features"], FEATURES, f"{i} cache features")
        labels, keys = dpe.memory.prototypes()
        track("prototypes", keys, want[f"{i}/cache_keys"], FEATURES, f"{i} cache prototypes")
        r_text, r_keys = dpe.last_residuals
        track("text residual", r_text, want[f"{i}/text_residual"], RESIDUALS, f"{i} text residual")
        track("cache residual", r_keys, want[f"{i}/cache_residual"], RESIDUALS, f"{i} cache residual")
        track("text head", state["text_global"], want[f"{i}/text_global"], FEATURES, f"{i} evolved text head")
        evolved += int(out.extras["evolved"])
        evicted += int(len(pos["labels"]) < i + 1)
    assert evicted > 0 and evolved > 0          # the stream exercises the replacement rule and the evolution
    assert float(want["23/cache_residual"].abs().max()) > 0 and float(want["23/text_residual"].abs().max()) > 0
    print(name, "evolved", evolved, "largest differences:", worst)

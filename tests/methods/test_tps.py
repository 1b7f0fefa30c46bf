"""TPS (shiftlab.methods.tps.method): behaviour and pieces; the whole method against its authors' code is
the golden checks below.

Golden checks (marked `golden`): TPS against its authors' own code on the golden stream
(tests/fixtures/golden/online, tps*.pt).

tools/golden/make_golden.py (driver tests/fixtures/golden/tps/driver.py) ran elaine-sui/TPS's
`shift_classification.test_time_adapt_eval` float32 on the CPU, 64 views per sample: `tps` with the
README's recipe (CLIP's 80 templates + descriptor sentences, one step, 24 samples; the descriptors a
stand-in), `tps_steps` with the template prototypes and three steps (8 samples). The fixture holds the
prototypes, the first step's view logits (samples 0-1) and gradient (samples 0-7), every step's kept
views and loss, the shifts after tuning and the final logits.

Tolerances (tests/_golden.py): prototypes FEATURES, logits LOGITS, losses LOSS, gradients GRAD_RTOL of
their largest entry, shifts PARAMS. One AdamW step from zero moves a shift entry by lr * g / (|g| + 1e-8):
where |g| is within a factor ~100 of 1e-8 (here most entries: the tiny CLIP is confident) the entry
follows the gradient's last digits, so shifts are compared at PARAMS only where the gradient is large
enough for GRAD_RTOL to pin them (`_pinned`), and the end-to-end logits allow, on top of LOGITS, what
the measured shift difference can move them by. The logits of the authors' own shifts are compared at
LOGITS. Kept views and predictions exactly, after a margin check."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import (
    FEATURES,
    GRAD_RTOL,
    LOGITS,
    LOSS,
    PARAMS,
    assert_selection_margin,
    assert_top1_margin,
    entropy_tolerance,
    online_fixture,
    stream_views,
)
from _golden import assert_close as _close
from shiftlab.methods.common.confidence import entropy, marginal_entropy, marginal_entropy_as_tpt
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.methods.tps import method as tps_module
from shiftlab.methods.tps.method import TPS, descriptor_sentence, load_descriptors

CLASSNAMES = ["cat", "dog", "hen", "tree", "boat"]


def _views(model, seed: int, n: int = 16) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return model.normalize(torch.rand(n, 3, model.image_size, model.image_size, generator=gen))


@pytest.fixture(scope="module")
def heads(tiny_model):
    return ClassHeads(tiny_model, CLASSNAMES)


def _tps(model, heads, **kw):
    kw.setdefault("views", 16)
    return shiftlab.create_method("tps", model, CLASSNAMES, heads=heads, **kw)


def test_episodic_a_b_a_gives_a_twice(tiny_model, heads):
    tps = _tps(tiny_model, heads, lr=0.05)
    a, b = _views(tiny_model, 0), _views(tiny_model, 1)
    first = tps.predict(a)
    shift_a = tps.last_shifts.clone()
    tps.predict(b)
    assert not torch.equal(tps.last_shifts, shift_a)          # b moved the shifts elsewhere
    assert torch.equal(tps.predict(a), first)
    assert torch.equal(tps.last_shifts, shift_a)


def test_batch_equals_one_at_a_time(tiny_model, heads):
    for kw in ({}, {"steps": 3, "lr": 0.05}, {"shift": "shared"}):
        tps = _tps(tiny_model, heads, **kw)
        ctxs = [SampleContext(tiny_model, heads, _views(tiny_model, s)) for s in (2, 3, 4, 5)]
        singles = [tps.predict_context(c) for c in ctxs]
        batched = tps.predict_batch(ctxs)
        for s, b in zip(singles, batched):
            torch.testing.assert_close(b.logits, s.logits, rtol=0, atol=1e-6)
            assert b.extras["selected"] == s.extras["selected"]
            assert b.extras["loss"] == pytest.approx(s.extras["loss"], abs=1e-7)


def test_it_reads_only_view_features(tiny_model, heads):
    """A feature store hands over features without pixels: the same prediction."""
    assert TPS.spec.needs_pixels is False
    tps = _tps(tiny_model, heads)
    views = _views(tiny_model, 6)
    with_pixels = tps.predict_context(SampleContext(tiny_model, heads, views))
    feats = tiny_model.encode_views(views)
    stored = tps.predict_context(SampleContext(tiny_model, heads, None, image_features=feats))
    assert torch.equal(stored.logits, with_pixels.logits)


def test_one_step_is_a_fresh_adamw_step_from_zero(tiny_model, heads):
    """A fresh AdamW's first step from zero: -lr * g / (|g| + eps), weight decay inert at zero."""
    tps = _tps(tiny_model, heads, lr=0.01)
    feats = tiny_model.encode_views(_views(tiny_model, 7))[None]
    protos = tps.prototypes()
    shift0 = torch.zeros(1, *protos.shape, requires_grad=True)
    losses, kept = tps.objective(protos, shift0, feats)
    (g,) = torch.autograd.grad(losses.sum(), shift0)
    tuned, extras = tps.tune(feats)
    torch.testing.assert_close(tuned, -0.01 * g / (g.abs() + 1e-8), rtol=0, atol=1e-8)
    assert kept.shape == (1, 1) and extras["selected"].tolist() == kept.tolist()   # int(16 x 0.1) = 1 view


def test_zero_steps_is_the_prototypes_zero_shot(tiny_model, heads):
    tps = _tps(tiny_model, heads, steps=0)
    views = _views(tiny_model, 8)
    out = tps.predict_context(SampleContext(tiny_model, heads, views))
    want = tiny_model.logit_scale * tiny_model.encode_views(views)[0] @ heads.ensemble.T
    torch.testing.assert_close(out.logits, want, rtol=0, atol=1e-4)
    assert out.extras == {}


def test_shared_shift_is_one_vector_for_every_class(tiny_model, heads):
    tps = _tps(tiny_model, heads, shift="shared")
    tps.predict(_views(tiny_model, 9))
    dim = heads.ensemble.shape[1]
    assert tps.last_shifts.shape == (1, 1, dim)
    per_class = _tps(tiny_model, heads)
    per_class.predict(_views(tiny_model, 9))
    assert per_class.last_shifts.shape == (1, len(CLASSNAMES), dim)


def test_the_loss_is_the_marginal_entropy():
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(3, 6, 10, generator=gen) * 5
    torch.testing.assert_close(marginal_entropy_as_tpt(z), marginal_entropy(z))


@pytest.mark.parametrize("kw, message", [
    ({"steps": -1}, "tps.steps: -1 is out of range; must be an integer >= 0"),
    ({"lr": float("nan")}, "tps.lr: nan is not finite"),
    ({"selection_ratio": 0.0}, "tps.selection_ratio: 0.0"),
    ({"shift": "per_view"}, "tps.shift: 'per_view' is not a choice; must be one of 'per_class', 'shared'"),
    ({"text_head": "cupl"}, "tps.text_head: 'cupl' is not a choice"),
    ({"text_head": "ensemble_descriptors"}, "tps.descriptors_file: text_head 'ensemble_descriptors' needs"),
    # a file its head does not read was silently ignored: the run went on without the user's descriptors
    ({"descriptors_file": "d.json"}, "tps.descriptors_file is set but tps.text_head is 'ensemble': the file would "
                                     "not be read; set tps's text_head='ensemble_descriptors'"),
    ({"precision": "fp16-pure"}, "tps.precision: 'fp16-pure'"),
])
def test_bad_values_are_refused_in_one_line(tiny_model, kw, message):
    with pytest.raises(ValueError) as err:
        shiftlab.create_method("tps", tiny_model, CLASSNAMES, **kw)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_descriptor_sentences_follow_their_rules():
    assert descriptor_sentence("hen", "a red comb") == "hen, which is a red comb"
    assert descriptor_sentence("hen", "antlers") == "hen, which is antlers"          # their startswith('a')
    assert descriptor_sentence("hen", "can fly short distances") == "hen, which can fly short distances"
    assert descriptor_sentence("hen", "used for eggs") == "hen, which is used for eggs"
    assert descriptor_sentence("hen", "feathers") == "hen, which has feathers"


def test_descriptors_are_found_by_name_then_by_position(tmp_path, monkeypatch):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"Dog": ["x"], "cat": ["y", "z"], "hot_dog": ["w"]}))
    assert load_descriptors(str(path), ["cat", "hot dog"]) == [["y", "z"], ["w"]]
    path.write_text(json.dumps({"eft": ["x"], "cat": ["y"]}))           # their zip: entry i is class i
    assert load_descriptors(str(path), ["newt", "cat"]) == [["x"], ["y"]]
    # their ImageNet file names class 1 'eft' (shiftlab: 'newt'): a subset pairs by ImageNet index
    monkeypatch.setattr("shiftlab.datasets.classnames", lambda name: ["tench", "newt", "cat", "dog"])
    path.write_text(json.dumps({"tench": ["a"], "eft": ["b"], "cat": ["c"], "dog": ["d"]}))
    assert load_descriptors(str(path), ["dog", "newt"]) == [["d"], ["b"]]
    with pytest.raises(ValueError, match=r"has no entry for 1 of 2 classes \('owl'\)"):
        load_descriptors(str(path), ["cat", "owl"])
    with pytest.raises(ValueError, match="is a directory"):
        load_descriptors(str(tmp_path), ["cat"])
    path.write_text(json.dumps({"cat": []}))
    with pytest.raises(ValueError, match="no descriptor for 1 classes: 'cat'"):
        load_descriptors(str(path), ["cat"])


def test_descriptor_heads_average_the_two_unnormalised_means(tiny_model, tmp_path):
    from shiftlab.datasets.classes import load_templates
    from shiftlab.models.text import encode_texts
    names = ["cat", "dog"]
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"cat": ["whiskers", "a tail"], "dog": ["can bark"]}))
    heads = ClassHeads(tiny_model, names)
    both = shiftlab.create_method("tps", tiny_model, names, heads=heads, text_head="ensemble_descriptors",
                                  descriptors_file=str(path)).prototypes()
    only = shiftlab.create_method("tps", tiny_model, names, heads=heads, text_head="descriptors",
                                  descriptors_file=str(path)).prototypes()
    sentences = [["cat, which has whiskers", "cat, which is a tail"], ["dog, which can bark"]]
    desc = torch.stack([encode_texts(tiny_model, s).mean(0) for s in sentences])
    temp = torch.stack([encode_texts(tiny_model, [t.format(n) for t in load_templates()]).mean(0) for n in names])
    torch.testing.assert_close(only, F.normalize(desc, dim=-1), rtol=0, atol=1e-6)
    torch.testing.assert_close(both, F.normalize(desc + temp, dim=-1), rtol=0, atol=1e-6)
    assert float((both - F.normalize(F.normalize(desc, dim=-1) + F.normalize(temp, dim=-1), dim=-1)).abs().max()) > 1e-4


# -- golden checks: the authors' code --------------------------------------------------------------------------

ADAM_EPS = 1e-8       # torch.optim.AdamW's default, which their code keeps


def _method(golden_model, info, tmp_path):
    model, classnames = golden_model
    kw = {"steps": info["tta_steps"], "lr": info["lr"], "selection_ratio": info["selection_p"], "precision": "fp32"}
    if info["descriptors"]:
        path = tmp_path / "imagenet-gpt4.json"     # the stand-in, as a user passes their gpt4_descriptors file
        path.write_text(json.dumps(info["descriptors"]))
        kw.update(text_head="ensemble_descriptors", descriptors_file=str(path))
    heads = ClassHeads(model, classnames)
    return shiftlab.create_method("tps", model, classnames, heads=heads, **kw), heads


def _pinned(grad: torch.Tensor, lr: float) -> torch.Tensor:
    """Entries whose first-step shift a gradient error of GRAD_RTOL x max|g| moves by at most PARAMS / 2:
    |d shift / d g| = lr * eps / (|g| + eps)^2."""
    dg = GRAD_RTOL * float(grad.abs().max())
    low = (grad.abs() - dg).clamp_min(0) + ADAM_EPS
    return lr * ADAM_EPS * dg / low ** 2 <= PARAMS / 2


@pytest.mark.golden
@pytest.mark.usefixtures("one_thread")
@pytest.mark.slow
@pytest.mark.parametrize("name", ["tps", "tps_steps"])
def test_tps_matches_the_authors_code_sample_by_sample(golden_model, golden_dir, tmp_path, monkeypatch, name):
    model, _ = golden_model
    want, info = online_fixture(golden_dir, name)
    tps, heads = _method(golden_model, info, tmp_path)
    protos = tps.prototypes()
    _close(protos, want["text_features"], FEATURES, "prototypes")
    steps, lr = info["tta_steps"], info["lr"]
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = tps_module.marginal_entropy_as_tpt

    def recording(selected):
        losses = original(selected)
        seen.append((losses.detach().clone(), selected.detach().clone()))
        return losses
    monkeypatch.setattr(tps_module, "marginal_entropy_as_tpt", recording)
    kept_steps: list[torch.Tensor] = []
    select = tps_module.select_confident

    def select_recording(logits, ratio):
        kept = select(logits, ratio)
        scores = entropy(logits[0])
        assert_selection_margin(scores, kept.shape[-1], entropy_tolerance(logits[0]), f"{name} kept views")
        kept_steps.append(kept[0].clone())
        return kept
    monkeypatch.setattr(tps_module, "select_confident", select_recording)

    worst: dict[str, float] = {}
    reselected = 0
    for i, views in enumerate(stream_views(golden_dir, info["n_views"])[:info["n_samples"]]):
        ctx = SampleContext(model, heads, model.normalize(views))
        feats = ctx.image_features
        zero = protos.new_zeros(1, 1, protos.shape[1])
        if f"{i}/view_logits" in want:
            _close(tps.logits(protos, zero, feats[None])[0], want[f"{i}/view_logits"], LOGITS, f"{i} view logits")
        if f"{i}/grad" in want:
            shift0 = torch.zeros(1, *protos.shape, requires_grad=True)
            with torch.enable_grad():
                losses, _ = tps.objective(protos, shift0, feats[None])
                (grad,) = torch.autograd.grad(losses.sum(), shift0)
            scale = float(want[f"{i}/grad"].abs().max())
            worst["grad"] = max(worst.get("grad", 0.0), _close(grad[0], want[f"{i}/grad"], GRAD_RTOL * scale,
                                                               f"{i} gradient") / scale)
        seen.clear()
        kept_steps.clear()
        out = tps.predict_context(ctx)
        assert len(seen) == len(kept_steps) == steps
        for j, ((loss, _), kept) in enumerate(zip(seen, kept_steps)):
            assert float(loss[0]) == pytest.approx(float(want[f"{i}/loss"][j]), abs=LOSS), f"{i} loss, step {j}"
            assert sorted(kept.tolist()) == sorted(want[f"{i}/kept"][j].tolist()), f"{i} kept views, step {j}"
        reselected += int(any(set(want[f"{i}/kept"][j].tolist()) != set(want[f"{i}/kept"][0].tolist())
                              for j in range(steps)))
        shift, theirs = tps.last_shifts[0], want[f"{i}/shift"]
        assert float(shift.abs().max()) <= steps * lr * (1 + 1e-5)
        if steps == 1 and f"{i}/grad" in want:
            pinned = _pinned(want[f"{i}/grad"], lr)
            assert int(pinned.sum()) > 100, f"{i}: too few entries pinned to compare"
            worst["shift"] = max(worst.get("shift", 0.0), _close(shift[pinned], theirs[pinned], PARAMS, f"{i} shift"))
        # their shifts read out on view 0: the readout alone
        f0 = feats[:1][None]
        _close(tps.logits(protos, theirs[None], f0)[0, 0], want[f"{i}/logits"], LOGITS, f"{i} logits of their shift")
        # end to end: LOGITS plus what the shift difference moves each class's logit by (first order)
        moved = model.logit_scale * ((shift - theirs).abs() @ feats[0].abs()) / (protos + theirs).norm(dim=-1)
        tol = LOGITS + 1.1 * float(moved.max())
        worst["logits"] = max(worst.get("logits", 0.0), _close(out.logits, want[f"{i}/logits"], tol, f"{i} logits"))
        assert_top1_margin(want[f"{i}/logits"], tol, f"{i} prediction")
        assert int(out.logits.argmax()) == int(want[f"{i}/pred"]), f"{i} prediction"
    if steps > 1:
        assert reselected > 0      # the stream exercises the per-step selection
    assert worst["logits"] < 10 * LOGITS, worst


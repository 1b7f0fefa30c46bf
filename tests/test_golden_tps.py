"""TPS against its authors' own code on the golden stream (tests/fixtures/golden/online, tps*.pt).

tools/golden/make_golden.py (driver tools/golden/driver_tps.py) ran elaine-sui/TPS's
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
LOGITS. Kept views and predictions exactly, after a margin check.
"""
from __future__ import annotations

import json

import pytest
import torch

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
from shiftlab.methods.common.confidence import entropy
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.methods.tps import method as tps_module

ADAM_EPS = 1e-8       # torch.optim.AdamW's default, which their code keeps


pytestmark = [pytest.mark.golden, pytest.mark.usefixtures("one_thread")]


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


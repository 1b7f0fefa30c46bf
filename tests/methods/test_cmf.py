"""CMF: its filter's gain against a straightforward computation, and CMF as mariodoebler/test-time-adaptation runs
it on CLIP (`classification/methods/cmf.py` on its ZeroShotCLIP) over the golden tiny ViT and tiny ResNet
(tests/fixtures/golden/cmf, made by the driver beside the fixtures, float32 on the CPU): 24 images in 3 batches of 8,
SGD (Nesterov), without the consistency loss and, in tests/fixtures/golden/roid_consistency, with it (their
default; their global generator seeded before each update as shiftlab seeds its generator), CMF.Q raised so that
the filter's gain stays below 1 on the tiny towers. After every batch: the logits (TUNED_LOGITS), the norm
parameters and the hidden ones (NORM_PARAMS), SGD's momentum buffers (GRAD_RTOL of their largest), the running
mean prediction (LOSS) and the filter's variance (a float computed in Python by both: 1e-12)."""
from __future__ import annotations

import pytest
import torch

import shiftlab
from _golden import (
    FEATURES,
    GRAD_RTOL,
    LOSS,
    NORM_PARAMS,
    ROID_RESNET_GRAD_RTOL,
    TUNED_LOGITS,
    assert_close,
    batch_fixture,
    fixture_model,
    stream_views,
)
from shiftlab.methods.context import SampleContext

pytestmark = pytest.mark.usefixtures("one_thread")

VARIANTS = {"cmf_vit": {"lr": 0.01, "q": 0.5, "use_consistency": False},
            "cmf_vit_episodic": {"lr": 0.01, "steps": 2, "episodic": True, "q": 2.0, "gamma": 0.9,
                                 "use_consistency": False, "use_prior_correction": False},
            "cmf_resnet": {"lr": 0.001, "q": 0.5, "alpha": 0.95, "use_consistency": False}}
# tests/fixtures/golden/roid_consistency: their default consistency loss on, their global generator seeded per update
CONSISTENCY_VARIANTS = {"cmf_vit_consistency": {"lr": 0.01, "q": 0.5}}
GOLDEN = [("cmf", v, o) for v, o in sorted(VARIANTS.items())] + \
    [("roid_consistency", v, o) for v, o in sorted(CONSISTENCY_VARIANTS.items())]


def test_filter_gain_against_a_straightforward_computation():
    from shiftlab.methods.cmf.method import filter_gain
    assert filter_gain(0.02, 0.01) == pytest.approx(0.99 / 1.01)
    assert filter_gain(0.5, 0.01) == 0.89                    # raised to 0.89
    assert filter_gain(1e-6, 1e-6) == 1.0                    # from 0.9999 on: 1 (the model left out)


def test_a_scaled_q_of_one_or_more_is_refused_in_one_line(golden_vit):
    model, names, heads = golden_vit
    with pytest.raises(ValueError, match=r"^cmf.q: 40.0 scaled by 1408 adapted parameters / 38400 is 1.47; the "
                                         r"filter needs it below 1: use q < 27.3$"):
        shiftlab.create_method("cmf", model, names, heads=heads, q=40.0)


@pytest.mark.golden
@pytest.mark.parametrize(("folder", "variant", "options"), GOLDEN, ids=[v for _, v, _ in GOLDEN])
def test_cmf_matches_their_code_batch_by_batch(golden_vit, golden_model, golden_dir, folder, variant, options):
    want, info = batch_fixture(golden_dir, folder, variant)
    assert info["n_batches"] == 3 and info["reference"]["commit"].startswith("8b2ed63")
    consistency = info["argv"][info["argv"].index("ROID.USE_CONSISTENCY") + 1]
    assert consistency is options.get("use_consistency", True)
    options = {**options, "augment_seed": info.get("seed", 0)}
    model, names, heads = fixture_model(info, golden_vit, golden_model)
    method = shiftlab.create_method("cmf", model, names, heads=heads, **options)
    assert method.tower.parameter_names == info["adapted"]
    assert method.q == pytest.approx(info["q"], rel=1e-12)      # their count: the tower's norms and ln_final
    assert_close(heads.zeroshot, want["prototypes"], FEATURES, "text head")
    grad_rtol = GRAD_RTOL if info["model"] == "shiftlab-tiny-vit" else ROID_RESNET_GRAD_RTOL
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    for b in range(info["n_batches"]):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[8 * b:8 * b + 8]])
        assert_close(torch.stack([o.logits for o in outs]), want[f"{b}/logits"], TUNED_LOGITS, f"batch {b} logits")
        assert_close(method.class_probs, want[f"{b}/class_probs"], LOSS, f"batch {b} mean prediction")
        assert method.variance == pytest.approx(float(want[f"{b}/variance"]), rel=1e-12, abs=1e-12)
        momentum = method.optimizer.state_dict()["state"]
        moved = 0.0
        for i, (name, value) in enumerate(method.tower.norm_state().items()):
            assert_close(value, want[f"{b}/norm/{name}"], NORM_PARAMS, f"batch {b} {name}")
            assert_close(method.hidden[i], want[f"{b}/hidden/{name}"], NORM_PARAMS, f"batch {b} hidden {name}")
            moved = max(moved, float((want[f"{b}/norm/{name}"] - method._initial_norm[name]).abs().max()))
            theirs_m = want[f"{b}/momentum/{name}"]
            scale = max(float(theirs_m.abs().max()), 1e-3)
            assert_close(momentum[i]["momentum_buffer"], theirs_m, grad_rtol * scale, f"batch {b} momentum {name}")
        assert moved > 10 * NORM_PARAMS, f"batch {b}: the parameters moved"

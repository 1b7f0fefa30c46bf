"""AdaContrast: its pieces against straightforward computations, its augmentations' draws, and CLIPTTA's AdaContrast
(github.com/MarcLafon/cliptta `ttavlm/methods/adacontrast.py`) on the golden tiny ViT (tests/fixtures/golden/
adacontrast, made by the driver beside the fixtures, float32 on the CPU).

Golden: 24 images in 3 continual batches of 8 (199 of the golden classes: see the driver), Adam at lr 1e-2, a
queue of 12 keys (it wraps in batch 1), their random initial queue loaded into shiftlab's; 1 step with 3
neighbours, and 2 steps with 5. Their augmentations draw from torch's and Python's global generators, so both sides
run the same fixed views (weak: identity, query: a horizontal flip, key: a vertical flip). After every batch the
queue's labels exactly, its keys (FEATURES), the logits (TUNED_LOGITS), the recorded OOD scores (FEATURES), every
adapted and key-encoder normalisation parameter (NORM_PARAMS), the predictions exactly.
"""
from __future__ import annotations

import json

import pytest
import torch

import shiftlab
from _golden import FEATURES, NORM_PARAMS, TUNED_LOGITS, assert_close, assert_top1_margin, stream_views
from shiftlab.methods.context import SampleContext

pytestmark = pytest.mark.usefixtures("one_thread")
LEFT_OUT = 42       # the golden class the tiny ViT gives every image at first, left out by the driver

COMMON = {"lr": 1e-2, "queue_size": 12, "logit_scale": 100.0}     # their output x --logit_scale 100
# the variants of the driver, as shiftlab configs (their argv: tests/fixtures/golden/adacontrast/adacontrast.json)
VARIANTS = {"adacontrast": COMMON, "adacontrast_s2": {**COMMON, "steps": 2, "n_neighbors": 5}}


def test_refined_pseudo_labels_average_the_nearest_bank_entries():
    from shiftlab.methods.adacontrast.method import refined_pseudo_labels  # (imports torchvision: not at collection)
    bank = torch.tensor([[0.0, 0.0], [1.0, 0.0], [5.0, 5.0], [6.0, 5.0]])
    probs = torch.tensor([[0.9, 0.1], [0.7, 0.3], [0.2, 0.8], [0.4, 0.6]])
    labels, refined = refined_pseudo_labels(torch.tensor([[0.2, 0.1], [5.5, 4.0]]), bank, probs, 2, "euclidean")
    assert labels.tolist() == [0, 1]
    assert torch.allclose(refined, torch.tensor([[0.8, 0.2], [0.3, 0.7]]))


def test_instance_loss_leaves_out_negatives_of_the_same_pseudo_label():
    from shiftlab.methods.adacontrast.method import instance_loss
    q = torch.nn.functional.normalize(torch.tensor([[1.0, 0.2]]), dim=-1)
    k = torch.nn.functional.normalize(torch.tensor([[0.9, 0.3]]), dim=-1)
    queue = torch.nn.functional.normalize(torch.tensor([[0.0, 1.0], [1.0, 0.0], [-1.0, 0.5]]), dim=-1).T
    same = torch.tensor([[False, True, False]])
    logits = torch.stack([(q * k).sum(), q[0] @ queue[:, 0], q[0] @ queue[:, 2]]) / 0.1
    want = -torch.log_softmax(logits, 0)[0]
    assert torch.allclose(instance_loss(q, k, queue, same, 0.1), want)


def test_augmentations_are_drawn_from_the_generator_alone():
    from shiftlab.methods.common.moco_augment import adacontrast_views, resized_crop_box
    x = torch.randn(3, 3, 32, 32)
    a = adacontrast_views(x, torch.Generator().manual_seed(5))
    b = adacontrast_views(x, torch.Generator().manual_seed(5))
    c = adacontrast_views(x, torch.Generator().manual_seed(6))
    assert all(torch.equal(u, v) for u, v in zip(a, b)) and not all(torch.equal(u, v) for u, v in zip(a, c))
    assert all(v.shape == x.shape for v in a)
    top, left, h, w = resized_crop_box(torch.Generator().manual_seed(0), 32, 32)
    assert 0.2 * 1024 * 0.9 <= h * w <= 1024 and 0 <= top <= 32 - h and 0 <= left <= 32 - w


def test_bad_values_are_refused_in_one_line(tiny_model):
    for kw, match in (({"queue_size": 0}, "adacontrast.queue_size"), ({"aug_type": "simclr"}, "adacontrast.aug_type"),
                      ({"distance": "l1"}, "adacontrast.distance"), ({"m": 2.0}, "adacontrast.m")):
        with pytest.raises(ValueError, match=match):
            shiftlab.create_method("adacontrast", tiny_model, ["a", "b"], **kw)


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_adacontrast_matches_cliptta_batch_by_batch(golden_vit, golden_dir, variant):
    model, names, _ = golden_vit
    names = names[:LEFT_OUT] + names[LEFT_OUT + 1:]          # as the driver (its LEFT_OUT)
    want = torch.load(golden_dir / "adacontrast" / f"{variant}.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "adacontrast" / "adacontrast.json").read_text())["fixtures"][variant]
    method = shiftlab.create_method("adacontrast", model, names, **VARIANTS[variant])
    heads = method.heads
    assert_close(heads.zeroshot, want["prototypes"], FEATURES, "text head")
    assert method.tower.parameter_names == info["adapted"]
    method.queue, method.queue_labels = want["initial/queue"].clone(), want["initial/queue_labels"].clone()
    method.augment = lambda pixels, g: (pixels, pixels.flip(-1), pixels.flip(-2))     # the driver's fixed views
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    for b in range(info["n_batches"]):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[8 * b:8 * b + 8]])
        assert method.queue_labels.tolist() == want[f"{b}/queue_labels"].tolist(), f"batch {b} queue labels"
        assert_close(method.queue, want[f"{b}/queue"], FEATURES, f"batch {b} queue")
        logits = torch.stack([o.logits for o in outs])
        assert_close(logits, want[f"{b}/logits"], TUNED_LOGITS, f"batch {b} logits")
        assert_close(torch.tensor([o.ood_score for o in outs]), want[f"{b}/scores"], FEATURES, f"batch {b} scores")
        for name, value in method.tower.norm_state().items():
            assert_close(value, want[f"{b}/norm/{name}"], NORM_PARAMS, f"batch {b} {name}")
        for name, value in method.keys.state().items():
            assert_close(value, want[f"{b}/key_norm/{name}"], NORM_PARAMS, f"batch {b} key {name}")
        assert_top1_margin(want[f"{b}/logits"], TUNED_LOGITS, f"batch {b}")
        assert torch.equal(logits.argmax(1), want[f"{b}/logits"].argmax(1))

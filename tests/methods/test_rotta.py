"""RoTTA: its category-balanced memory against straightforward expectations, and CLIPTTA's RoTTA
(github.com/MarcLafon/cliptta `ttavlm/methods/rotta.py`, `memory/cstu.py`) on the golden tiny ViT
(tests/fixtures/golden/rotta, made by the driver beside the fixtures, float32 on the CPU).

Golden: 24 images in 3 continual batches of 8 (199 of the golden classes: see the driver), Adam at lr 3e-2, a
memory of 400, EMA weight 0.2: an update after every batch (frequency 8, 1 step) and, with 2 steps and frequency
12, an update whenever the count reaches 24 (batch 1's first step, batch 2's second). After every batch the
memory's images and ages exactly, the logits (TUNED_LOGITS), the recorded OOD scores (FEATURES), every adapted
normalisation parameter of the student and of the EMA teacher (NORM_PARAMS), the predictions exactly.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

import shiftlab
from _golden import FEATURES, NORM_PARAMS, TUNED_LOGITS, assert_close, assert_top1_margin, stream_views
from shiftlab.methods.context import SampleContext
from shiftlab.methods.rotta.memory import CategoryBalancedMemory
from shiftlab.methods.rotta.method import timeliness

pytestmark = pytest.mark.usefixtures("one_thread")
LEFT_OUT = 42       # the golden class the tiny ViT gives every image at first, left out by the driver

COMMON = {"lr": 3e-2, "capacity": 400, "nu": 0.2, "logit_scale": 100.0}   # their output x --logit_scale 100
# the variants of the driver, as shiftlab configs (their argv: tests/fixtures/golden/rotta/rotta.json)
VARIANTS = {"rotta": {**COMMON, "update_frequency": 8}, "rotta_f12s2": {**COMMON, "update_frequency": 12, "steps": 2}}


def test_memory_balances_classes_and_displaces_the_old_and_uncertain():
    memory = CategoryBalancedMemory(num_classes=2, capacity=4, lambda_t=1.0, lambda_u=1.0)   # 2 a class
    image = [torch.full((1,), float(i)) for i in range(8)]
    assert [memory.add(image[i], 0, 0.1) for i in range(2)] == [True, True]
    # class 0 holds its share: a newcomer must outscore the stored images' best heuristic (older, so higher)
    assert not memory.add(image[2], 0, 0.9)          # too uncertain: 0.5 + 0.9 / log 2 > sigmoid(2/4) + 0.1 / log 2
    assert [item.age for item in memory.items[0]] == [3, 2]
    assert memory.add(image[3], 0, 0.1)              # the oldest (highest score) gives way
    assert [float(item.image) for item in memory.items[0]] == [1.0, 3.0]
    assert memory.add(image[4], 1, 0.5) and memory.add(image[5], 1, 0.5)
    # full (4) and class 1 holds its share: class 1's oldest makes room
    assert memory.add(image[6], 1, 0.0) and [float(i.image) for i in memory.items[1]] == [5.0, 6.0]
    images, ages = memory.contents()
    assert images.flatten().tolist() == [1.0, 3.0, 5.0, 6.0]
    assert ages.tolist() == [a / 4 for a in (6, 4, 2, 1)]
    want = 1 / (1 + math.exp(-6 / 4)) + 0.1 / math.log(2)
    assert memory.heuristic(6, 0.1) == pytest.approx(want)


def test_memory_takes_room_from_the_largest_class_when_full():
    memory = CategoryBalancedMemory(num_classes=4, capacity=3, lambda_t=1.0, lambda_u=0.0)      # 0.75 a class
    for i, c in enumerate((0, 0, 1)):
        memory.per_class = 2                       # let class 0 take two while there is room
        memory.add(torch.full((1,), float(i)), c, 0.0)
    memory.per_class = 0.75
    assert memory.add(torch.full((1,), 3.0), 2, 0.0)           # class 2 empty, memory full: class 0's oldest goes
    assert [[float(i.image) for i in per] for per in memory.items] == [[1.0], [2.0], [3.0], []]


def test_timeliness_weights_halve_at_age_zero_and_decay():
    w = timeliness(torch.tensor([0.0, 1.0, 5.0]))
    assert w[0] == 0.5 and w[1] == pytest.approx(math.exp(-1) / (1 + math.exp(-1))) and w[2] < w[1]


def test_memory_state_round_trips():
    memory = CategoryBalancedMemory(num_classes=3, capacity=3, lambda_t=1.0, lambda_u=1.0)
    for i in range(5):
        memory.add(torch.full((2,), float(i)), i % 3, 0.1 * i)
    copy = CategoryBalancedMemory(num_classes=3, capacity=3, lambda_t=1.0, lambda_u=1.0)
    copy.load(memory.state())
    for i in range(5, 9):
        assert memory.add(torch.full((2,), float(i)), i % 2, 0.05) == copy.add(torch.full((2,), float(i)), i % 2, 0.05)
    assert torch.equal(memory.contents()[0], copy.contents()[0]) and torch.equal(memory.contents()[1],
                                                                                  copy.contents()[1])


def test_bad_values_are_refused_in_one_line(tiny_model):
    for kw, match in (({"capacity": 0}, "rotta.capacity"), ({"nu": 1.5}, "rotta.nu"),
                      ({"teacher_target": "probs"}, "rotta.teacher_target"),
                      ({"update_schedule": "never"}, "rotta.update_schedule")):
        with pytest.raises(ValueError, match=match):
            shiftlab.create_method("rotta", tiny_model, ["a", "b"], **kw)


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rotta_matches_cliptta_batch_by_batch(golden_vit, golden_dir, variant):
    model, names, _ = golden_vit
    names = names[:LEFT_OUT] + names[LEFT_OUT + 1:]          # as the driver (its LEFT_OUT)
    want = torch.load(golden_dir / "rotta" / f"{variant}.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "rotta" / "rotta.json").read_text())["fixtures"][variant]
    method = shiftlab.create_method("rotta", model, names, **VARIANTS[variant])
    heads = method.heads
    assert_close(heads.zeroshot, want["prototypes"], FEATURES, "text head")
    assert method.tower.parameter_names == info["adapted"]
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    pixels = torch.cat([v[:1] for v in views])
    updates = []
    for b in range(info["n_batches"]):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[8 * b:8 * b + 8]])
        updates.append(outs[0].extras["updates"])
        images, ages = method.memory.contents()
        stored = [int((pixels == im).flatten(1).all(1).nonzero()[0]) for im in images]
        assert stored == want[f"{b}/memory"].tolist(), f"batch {b} memory"
        assert [round(a * method.config.capacity) for a in ages.tolist()] == want[f"{b}/ages"].tolist()
        logits = torch.stack([o.logits for o in outs])
        assert_close(logits, want[f"{b}/logits"], TUNED_LOGITS, f"batch {b} logits")
        assert_close(torch.tensor([o.ood_score for o in outs]), want[f"{b}/scores"], FEATURES, f"batch {b} scores")
        for name, value in method.tower.norm_state().items():
            assert_close(value, want[f"{b}/norm/{name}"], NORM_PARAMS, f"batch {b} {name}")
        for name, value in method.teacher.state().items():
            assert_close(value, want[f"{b}/teacher/{name}"], NORM_PARAMS, f"batch {b} teacher {name}")
        assert_top1_margin(want[f"{b}/logits"], TUNED_LOGITS, f"batch {b}")
        assert torch.equal(logits.argmax(1), want[f"{b}/logits"].argmax(1))
    assert updates == ([1, 1, 1] if variant == "rotta" else [0, 1, 1])


def test_bit_da_choices_update_per_image_and_predict_with_the_teacher(golden_vit):
    model = golden_vit[0]
    method = shiftlab.create_method("rotta", model, [f"class {i}" for i in range(5)], update_frequency=3,
                                    update_schedule="instance", output="teacher", teacher_target="softmax",
                                    loss_logit_scale=100.0, capacity=8, nu=0.5, lr=1e-2)
    views = torch.rand(8, 1, 3, model.image_size, model.image_size, generator=torch.Generator().manual_seed(0))
    pixels = model.normalize(views[:, 0])
    with torch.no_grad():
        teacher_before = method.cosines(pixels, method.teacher.tower)
    outs = method.adapt_batch([SampleContext(model, method.heads, model.normalize(v)) for v in views])
    assert [o.extras["updates"] for o in outs] == [2] * 8                  # after images 3 and 6
    assert_close(torch.stack([o.logits for o in outs]), method.scale * teacher_before, 1e-5, "teacher's output")
    assert method.counted == 8 and outs[0].extras["last_loss"] is not None    # the count is never restarted
    teacher, student = method.teacher.state(), method.tower.norm_state()
    assert any(not torch.equal(teacher[k], student[k]) for k in student)          # the teacher lags the student


def test_softmax_target_loss_is_the_weighted_cross_entropy_to_the_teacher_softmax(golden_vit):
    model = golden_vit[0]
    method = shiftlab.create_method("rotta", model, [f"class {i}" for i in range(5)], teacher_target="softmax",
                                    loss_logit_scale=10.0, capacity=8, update_frequency=100)
    views = torch.rand(4, 3, model.image_size, model.image_size, generator=torch.Generator().manual_seed(1))
    for i, image in enumerate(model.normalize(views)):
        method.memory.add(image, i % 5, 0.5)
    images, ages = method.memory.contents()
    with torch.no_grad():
        target = (10.0 * method.cosines(images, method.teacher.tower)).softmax(-1)
        student = 10.0 * method.cosines(images)
    w = torch.exp(-ages) / (1 + torch.exp(-ages))
    want = (w * -(target * student.log_softmax(-1)).sum(-1)).mean()
    assert method.update() == pytest.approx(float(want), rel=1e-5)


def test_episodic_resets_the_parameters_but_keeps_the_memory_and_teacher(golden_vit):
    model = golden_vit[0]
    method = shiftlab.create_method("rotta", model, [f"class {i}" for i in range(5)], episodic=True, capacity=8,
                                    update_frequency=2, nu=0.5, lr=1e-2)
    initial = method.tower.norm_state()
    views = torch.rand(2, 2, 1, 3, model.image_size, model.image_size, generator=torch.Generator().manual_seed(2))
    for batch in views:
        method.adapt_batch([SampleContext(model, method.heads, model.normalize(v)) for v in batch])
    assert len(method.memory) > 2          # both batches' images: the memory ran on
    method.episodic_reset()
    assert all(torch.equal(v, initial[k]) for k, v in method.tower.norm_state().items())
    assert any(not torch.equal(v, initial[k]) for k, v in method.teacher.state().items())

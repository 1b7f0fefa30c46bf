"""DeYO: its disruptions, PLPD and sample weights against straightforward computations, its state (the shuffles'
generator included) across a resume, and DeYO as mariodoebler/test-time-adaptation runs it on CLIP
(`classification/methods/deyo.py` on its ZeroShotCLIP) and as its authors' code runs it (Jhyun17/DeYO
`methods/deyo.py`) on the golden tiny ViT (tests/fixtures/golden/deyo, made by the driver beside the fixtures,
float32 on the CPU).

Golden: 24 images in 3 batches of 8, margins and a PLPD threshold at which both filters keep part of every batch:
patch shuffle (continual), pixel shuffle (episodic, 2 steps), occlusion, and the authors' code (patch, SGD without
Nesterov). Their shuffles draw from torch's global generator seeded before the first batch; shiftlab's generator,
seeded alike, must draw the same numbers (compared exactly). After every batch: the logits (DEYO_LOGITS: measured
8.1e-6), the PLPD of every kept image (LOSS: 5.5e-7) against the one their model's outputs give, which images pass
each filter (exactly, after a margin check), the norm parameters (NORM_PARAMS: 1.2e-7) and SGD's momentum buffers
(GRAD_RTOL of their largest: 3.3e-6 absolute).
"""
from __future__ import annotations

import json
import math

import pytest
import torch

import shiftlab
from _golden import (
    GRAD_RTOL,
    LOSS,
    NORM_PARAMS,
    assert_close,
    check_margin,
    entropy_tolerance,
    fixture_tolerances,
    stream_views,
)
from _imports import lazy_module
from shiftlab.methods.context import SampleContext
from shiftlab.synthetic import tiny_clip, tiny_vit

DEYO_LOGITS = fixture_tolerances("deyo")["logits"]  # tests/fixtures/golden/deyo/tolerances.json

# its method module imports torchvision (torch._dynamo): read when a test first needs it, not at collection
deyo = lazy_module("shiftlab.methods.deyo.method", optional=False)

pytestmark = pytest.mark.usefixtures("one_thread")

CLASSES = ["cat", "dog", "car", "bus"]
_COMMON = {"entropy_margin": 0.82, "plpd_threshold": 0.0, "lr": 0.003, "shuffle_seed": 0}
# the driver's variants as shiftlab configs (their options: tests/fixtures/golden/deyo/deyo.json); the occluded
# square of 32 px at row 16, column 8 of the 64 px images
VARIANTS = {"deyo_patch": _COMMON,
            "deyo_pixel": {**_COMMON, "augmentation": "pixel", "steps": 2, "episodic": True},
            "deyo_occ": {**_COMMON, "augmentation": "occ", "occlusion_size": 0.5, "occlusion_row": 0.25,
                         "occlusion_column": 0.125},
            "authors": {**_COMMON, "nesterov": False}}


def contexts(model, method, pixels):
    return [SampleContext(model, method.heads, pixels[i:i + 1]) for i in range(pixels.shape[0])]


def test_patch_shuffle_moves_whole_patches_by_each_images_own_permutation():
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    out = deyo.shuffle_patches(x, 2, torch.Generator().manual_seed(5))
    orders = torch.argsort(torch.rand(2, 4, generator=torch.Generator().manual_seed(5)), dim=-1)
    for i in range(2):
        for slot in range(4):
            src = int(orders[i, slot])
            r, c, sr, sc = 4 * (slot // 2), 4 * (slot % 2), 4 * (src // 2), 4 * (src % 2)
            assert torch.equal(out[i, :, r:r + 4, c:c + 4], x[i, :, sr:sr + 4, sc:sc + 4])
    # 10 px with 4 patches a side: resized to 8 (torchvision's Resize, bilinear, antialiased), shuffled, and back
    import torchvision.transforms as T
    y = torch.rand(2, 3, 10, 10, generator=torch.Generator().manual_seed(1))
    small = deyo.shuffle_patches(T.Resize((8, 8))(y), 4, torch.Generator().manual_seed(2))
    torch.testing.assert_close(deyo.shuffle_patches(y, 4, torch.Generator().manual_seed(2)), T.Resize((10, 10))(small),
                               rtol=0, atol=1e-6)


def test_pixel_shuffle_moves_every_image_by_one_permutation():
    x = torch.rand(2, 3, 4, 4)
    out = deyo.shuffle_pixels(x, torch.Generator().manual_seed(1))
    order = torch.randperm(16, generator=torch.Generator().manual_seed(1))
    assert torch.equal(out.flatten(2), x.flatten(2)[:, :, order])


def test_occlusion_fills_the_authors_square_with_the_mean_colour():
    x = torch.rand(2, 3, 224, 224)
    out = deyo.occlude(x, 0.5, 0.25, 0.25)          # their 112 px at (56, 56) on 224 px images
    mean = x.mean(dim=(2, 3))
    assert torch.equal(out[:, :, 56:168, 56:168], mean[:, :, None, None].expand(2, 3, 112, 112))
    mask = torch.ones(224, 224, dtype=torch.bool)
    mask[56:168, 56:168] = False
    assert torch.equal(out[:, :, mask], x[:, :, mask]) and not torch.equal(out, x)


def test_plpd_and_the_weights_against_a_straightforward_computation():
    before = torch.tensor([[2.0, 0.0, 1.0], [0.0, 0.5, 3.0]])
    after = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 2.5]])
    p, q = before.softmax(-1), after.softmax(-1)
    want = torch.tensor([p[0, 0] - q[0, 0], p[1, 2] - q[1, 2]])
    torch.testing.assert_close(deyo.plpd(before, after), want)
    h = torch.tensor([0.7, 1.2])
    torch.testing.assert_close(deyo.sample_weights(h, want, 0.4, True, True),
                               torch.exp(0.4 - h) + torch.exp(want))
    torch.testing.assert_close(deyo.sample_weights(h, want, 0.4, False, True), torch.exp(want))


def test_no_image_kept_means_no_step():
    model = tiny_vit(0)
    method = shiftlab.create_method("deyo", model, CLASSES, entropy_margin=0.01, lr=1.0)
    before = method.tower.norm_state()
    x = model.normalize(torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(2)))
    outs = method.adapt_batch(contexts(model, method, x))
    assert all(o.extras == {"plpd": None, "selected": False} for o in outs)
    assert all(torch.equal(v, before[k]) for k, v in method.tower.norm_state().items())
    assert not method.optimizer.state_dict()["state"]


def test_a_resume_from_the_state_continues_the_shuffles_exactly():
    model = tiny_vit(0)
    x = model.normalize(torch.rand(6, 3, 64, 64, generator=torch.Generator().manual_seed(4)))
    config = {"entropy_margin": 10.0, "plpd_threshold": -1.0, "lr": 0.01, "shuffle_seed": 3}
    first = shiftlab.create_method("deyo", model, CLASSES, **config)
    first.adapt_batch(contexts(model, first, x[:3]))
    state = first.state_dict()
    straight = first.adapt_batch(contexts(model, first, x[3:]))
    resumed = shiftlab.create_method("deyo", model, CLASSES, **config)
    resumed.load_state_dict(state)
    again = resumed.adapt_batch(contexts(model, resumed, x[3:]))
    assert [o.extras for o in again] == [o.extras for o in straight]
    assert torch.equal(torch.stack([o.logits for o in again]), torch.stack([o.logits for o in straight]))
    fresh = shiftlab.create_method("deyo", model, CLASSES, **config)     # without the generator's state: others
    fresh.tower.load_norm_state(state["norm"])
    fresh.optimizer.load_state_dict(state["optimizer"])
    other = fresh.adapt_batch(contexts(model, fresh, x[3:]))
    assert [o.extras["plpd"] for o in other] != [o.extras["plpd"] for o in straight]


def test_the_top_layers_stay_frozen_as_their_collect_params():
    model = tiny_clip(0)       # a ModifiedResNet with a layer4
    every = shiftlab.create_method("deyo", model, CLASSES, skip_top_layers="none").tower.parameter_names
    kept = shiftlab.create_method("deyo", model, CLASSES).tower.parameter_names
    assert any(n.startswith("layer4.") for n in every)
    assert kept == [n for n in every if not n.startswith("layer4.")]


def test_config_refuses_an_occlusion_outside_the_image_and_paper_is_the_authors_recipe():
    with pytest.raises(ValueError, match=r"deyo.occlusion_row \+ deyo.occlusion_size: 0.75 \+ 0.5"):
        shiftlab.create_method("deyo", tiny_vit(0), CLASSES, occlusion_row=0.75)
    from shiftlab.methods.base import describe
    paper = describe("paper", "deyo")["config"]
    assert (paper["optimizer"], paper["lr"], paper["momentum"], paper["nesterov"], paper["plpd_threshold"],
            paper["entropy_margin"], paper["weight_margin"]) == ("sgd", 0.001, 0.9, False, 0.2, 0.5, 0.4)


# -- their code (tests/fixtures/golden/deyo) ---------------------------------------------------------------


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_deyo_matches_their_code_batch_by_batch(golden_vit, golden_dir, variant, monkeypatch):
    model, names, heads = golden_vit
    want = torch.load(golden_dir / "deyo" / f"{variant}.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "deyo" / "deyo.json").read_text())["fixtures"][variant]
    assert info["n_batches"] == 3 and info["seed"] == 0
    config = VARIANTS[variant]
    method = shiftlab.create_method("deyo", model, names, heads=heads, **config)
    assert method.tower.parameter_names == info["adapted"]
    assert_close(heads.zeroshot, want["prototypes"], 1e-5, "text head")
    draws: list[torch.Tensor] = []
    rand, randperm = torch.rand, torch.randperm

    def recording(draw):
        def wrapped(*a, **k):
            out = draw(*a, **k)
            draws.append(out.flatten().float())
            return out
        return wrapped
    monkeypatch.setattr(torch, "rand", recording(rand))
    monkeypatch.setattr(torch, "randperm", recording(randperm))
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    log_c = math.log(len(names))
    steps = config.get("steps", 1)
    rejected: list[tuple[int, int]] = []      # per batch: images the entropy filter drops, then the PLPD filter
    for b in range(info["n_batches"]):
        draws.clear()
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[8 * b:8 * b + 8]])
        if f"{b}/draws" in want:       # the same numbers from shiftlab's generator as from their global one
            assert torch.equal(torch.cat(draws), want[f"{b}/draws"]), f"batch {b}: shuffle draws"
        else:
            assert not draws
        assert_close(torch.stack([o.logits for o in outs]), want[f"{b}/logits"], DEYO_LOGITS, f"batch {b} logits")
        # their last step's forwards: the batch, then its kept images disrupted
        forwards = [want[f"{b}/forward/{i}"] for i in range(2 * steps) if f"{b}/forward/{i}" in want]
        assert len(forwards) == 2 * steps, f"batch {b}: every step keeps an image"
        logits, disrupted = forwards[-2], forwards[-1]
        h = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
        gap, tol = (h - 0.82 * log_c).abs(), entropy_tolerance(logits, DEYO_LOGITS)
        i = int((gap / tol).argmin())
        check_margin(float(gap[i]), float(tol[i]), f"batch {b}: entropy filter (image {i})")
        kept = h < 0.82 * log_c
        theirs = deyo.plpd(logits[kept], disrupted)
        ours = torch.tensor([o.extras["plpd"] for o, k in zip(outs, kept.tolist()) if k])
        assert [o.extras["plpd"] is not None for o in outs] == kept.tolist(), f"batch {b}: entropy filter"
        assert_close(ours, theirs, LOSS, f"batch {b} PLPD")
        check_margin(float(theirs.abs().min()), LOSS, f"batch {b}: PLPD filter")
        selected = kept.clone()
        selected[kept] = theirs > 0.0
        assert [o.extras["selected"] for o in outs] == selected.tolist(), f"batch {b}: PLPD filter"
        rejected.append((int((~kept).sum()), int((kept & ~selected).sum())))
        momentum = method.optimizer.state_dict()["state"]
        for i, (name, value) in enumerate(method.tower.norm_state().items()):
            assert_close(value, want[f"{b}/norm/{name}"], NORM_PARAMS, f"batch {b} {name}")
            theirs_m = want.get(f"{b}/momentum/{name}")
            assert (theirs_m is None) == (i not in momentum), f"batch {b} {name}: momentum buffer"
            if theirs_m is not None:
                scale = max(float(theirs_m.abs().max()), 1e-3)
                assert_close(momentum[i]["momentum_buffer"], theirs_m, GRAD_RTOL * scale, f"batch {b} momentum {name}")
    assert all(by_entropy for by_entropy, _ in rejected) and any(by_plpd for _, by_plpd in rejected), rejected


def test_the_library_run_adapts_deyo_on_whole_batches(tmp_path, tiny_model):
    from _runs import json_lines
    from _synthetic import make_image_folder
    from shiftlab.datasets import build_dataset
    from shiftlab.engine.config import RunConfig
    root = make_image_folder(tmp_path / "data", ["cat", "dog"], per_class=2, size=(48, 40))
    dataset = build_dataset("imagefolder", root)
    config = {"entropy_margin": 10.0, "plpd_threshold": -1.0, "lr": 0.01}
    shiftlab.run(RunConfig(dataset="imagefolder", methods=["deyo"], workers=0, progress=False, batch_size=4, seed=1,
                           out=str(tmp_path / "run"), device="cpu", method_config={"deyo": config}),
                 model=tiny_model, dataset=dataset)
    records = sorted(json_lines(tmp_path / "run" / "records.jsonl"), key=lambda r: r["id"])
    assert len(records) == 4 and all(r["extras"]["selected"] for r in records)
    assert len({r["extras"]["plpd"] for r in records}) == 4          # each image its own shuffle


@pytest.mark.slow
def test_cli_runs_deyo_on_batches_and_refuses_what_does_not_fit_the_image(tmp_path, tiny_checkpoint, capsys):
    from _runs import json_lines
    from _synthetic import make_imagenet_r
    from shiftlab.cli import main as cli_main
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 50), per_class=2, size=(72, 64))
    flags = ["--dataset", "imagenet-r", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained",
             str(tiny_checkpoint), "--workers", "0", "--no-progress", "--allow-partial", "--methods", "deyo",
             "--set", "deyo.entropy_margin=10", "--set", "deyo.plpd_threshold=-1", "--batch-size", "4"]
    assert cli_main(["run", *flags, "--out", str(tmp_path / "run")]) == 0
    records = json_lines(tmp_path / "run" / "records.jsonl")
    assert len(records) == 8 and {r["method"] for r in records} == {"deyo"}
    assert all(r["extras"]["selected"] and -1 <= r["extras"]["plpd"] <= 1 for r in records)
    capsys.readouterr()
    assert cli_main(["run", *flags, "--set", "deyo.occlusion_row=0.75", "--out", str(tmp_path / "bad")]) != 0
    err = capsys.readouterr().err.strip()
    assert "deyo.occlusion_row + deyo.occlusion_size: 0.75 + 0.5" in err and "Traceback" not in err
    assert len(err.splitlines()) == 1
    assert cli_main(["run", *flags, "--set", "deyo.patch_len=65", "--out", str(tmp_path / "big")]) != 0
    err = capsys.readouterr().err.strip()
    errors = [line for line in err.splitlines() if "warning" not in line]     # the model is loaded after the listing
    assert len(errors) == 1 and "deyo.patch_len: 65 patches per side of the model's 64 px images" in errors[0]

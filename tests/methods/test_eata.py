"""EATA: its filters and Fisher against straightforward computations, and CLIPTTA's ETA (github.com/MarcLafon/cliptta
`ttavlm/methods/eata.py`, the CLIP version issue #32 follows) on the golden tiny ViT (tests/fixtures/golden/eata, made
by the driver beside the fixtures, float32 on the CPU).

Golden: 24 images in 3 batches of 8, continual, with their argparse defaults (1 Adam step; the redundancy filter
on the unscaled cosines' probabilities then rejects every later image) and a stronger variant (3 steps, lr 0.01,
margin 0.9999, where the filter keeps some and rejects some); after every batch the logits (TUNED_LOGITS: measured
3.7e-4), the norm parameters (NORM_PARAMS: 4.1e-5), the moving average (FEATURES: 1.4e-9) and the counters of
reliable and selected images exactly (the logits would move far beyond their tolerance had one image gone the
other way).
"""
from __future__ import annotations

import json
import random

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FEATURES, NORM_PARAMS, TUNED_LOGITS, assert_close, stream_views
from _synthetic import make_image_folder
from shiftlab.methods.context import SampleContext
from shiftlab.methods.eata.method import select_samples, updated_average
from shiftlab.synthetic import tiny_vit

pytestmark = pytest.mark.usefixtures("one_thread")

VARIANTS = {"eata": {}, "eata_strong": {"steps": 3, "lr": 0.01, "redundancy_margin": 0.9999}}


def test_filters_keep_the_reliable_images_unlike_the_moving_average():
    entropies = torch.tensor([0.1, 2.0, 0.3, 0.2])
    probs = torch.tensor([[0.9, 0.1], [0.5, 0.5], [0.1, 0.9], [0.8, 0.2]])
    assert select_samples(entropies, probs, None, 1.0, 0.05).tolist() == [True, False, True, True]
    average = torch.tensor([1.0, 0.0])
    cos = F.cosine_similarity(average[None], probs, dim=1)
    want = [bool(e < 1.0 and abs(c) < 0.5) for e, c in zip(entropies.tolist(), cos.tolist())]
    assert select_samples(entropies, probs, average, 1.0, 0.5).tolist() == want == [False, False, True, False]
    torch.testing.assert_close(updated_average(None, probs[:2], 0.9), probs[:2].mean(0))
    torch.testing.assert_close(updated_average(average, probs[2:], 0.9), 0.9 * average + 0.1 * probs[2:].mean(0))
    assert updated_average(average, probs[:0], 0.9) is average


def test_fisher_is_the_mean_squared_gradient_of_the_pseudo_label_loss_and_penalises_drift():
    model = tiny_vit(0)
    classes = ["cat", "dog", "car"]
    method = shiftlab.create_method("eata", model, classes, fisher_alpha=2.0, steps=1)
    gen = torch.Generator().manual_seed(5)
    batches = [model.normalize(torch.rand(2, 3, 64, 64, generator=gen)) for _ in range(2)]
    method.compute_fisher(batches)
    name = "ln_post.weight"
    p = method.tower.visual.get_parameter(name)
    want = torch.zeros_like(p)
    for batch in batches:
        logits = method.logits(batch)
        (g,) = torch.autograd.grad(F.cross_entropy(logits, logits.argmax(1)), [p])
        want += g ** 2
    torch.testing.assert_close(method.fishers[name][0], want / 2, rtol=1e-5, atol=1e-12)
    assert float(method.fisher_penalty().detach()) == 0.0       # no drift yet
    with torch.no_grad():
        p.add_(0.1)
    want_penalty = float((method.fishers[name][0] * 0.01).sum())
    assert float(method.fisher_penalty().detach()) == pytest.approx(want_penalty, rel=1e-4)


def test_fisher_alpha_without_a_fisher_is_refused_in_one_line():
    model = tiny_vit(0)
    method = shiftlab.create_method("eata", model, ["a", "b"], fisher_alpha=1.0)
    ctx = SampleContext(model, method.heads, model.normalize(torch.rand(1, 3, 64, 64)))
    with pytest.raises(ValueError, match=r"^eata.fisher_alpha > 0 needs the Fisher information"):
        method.adapt_batch([ctx])


def test_paper_protocol_is_eatas_own_recipe():
    from shiftlab.methods.base import describe
    paper = describe("paper", "eata")["config"]
    assert (paper["optimizer"], paper["lr"], paper["momentum"], paper["skip_empty_step"],
            paper["redundancy_on_scaled_logits"], paper["mean_entropy_weight"]) \
        == ("sgd", 0.00025, 0.9, True, True, 0.0)


# -- the Fisher from clean source images (eata/fisher_source.py) ---------------------------------------------


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """4 clean 'source' images in 2 class folders."""
    return make_image_folder(tmp_path_factory.mktemp("eata_source") / "clean", ["cat", "dog"], per_class=2,
                             size=(40, 32))


def _view0(path, model):
    """An image file as a run reads view 0: RGB, the shorter side resized to the model's size (bicubic), centre
    cropped, in [0, 1], normalised."""
    from PIL import Image
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF
    image = Image.open(path).convert("RGB")
    image = TF.center_crop(TF.resize(image, model.image_size, interpolation=InterpolationMode.BICUBIC),
                           model.image_size)
    return model.normalize(TF.pil_to_tensor(image).float().div(255))


def test_the_fisher_of_source_images_is_the_straightforward_computation(source):
    """fisher_source: a seeded subset of the folder, in batches of fisher_batch_size; the Fisher at the initial
    parameters = the mean over batches of the squared gradient of the cross-entropy against the logits' argmax."""
    import hashlib
    model = tiny_vit(0)
    classes = ["cat", "dog", "car"]
    settings = dict(fisher_alpha=2.0, fisher_source=str(source), fisher_images=4, fisher_batch_size=2, fisher_seed=7)
    method = shiftlab.create_method("eata", model, classes, **settings)
    method.prepare()
    files = sorted(p.relative_to(source).as_posix() for p in source.rglob("*.png"))
    order = list(range(len(files)))
    random.Random(7).shuffle(order)                         # EATA's random.shuffle of the indices, seeded
    assert method.source.paths == [files[i] for i in order]
    reference = shiftlab.create_method("eata", model, classes)   # the initial parameters
    params = reference.tower.adapted_parameters()
    sums = [torch.zeros_like(p) for p in params]
    for batch in (method.source.paths[:2], method.source.paths[2:]):
        logits = reference.logits(torch.cat([_view0(source / p, model).reshape(1, 3, 64, 64) for p in batch]))
        grads = torch.autograd.grad(F.cross_entropy(logits, logits.argmax(1)), params)
        for total, g in zip(sums, grads):
            total += g ** 2
    for name, total, p in zip(reference.tower.parameter_names, sums, params):
        fisher, initial = method.fishers[name]
        torch.testing.assert_close(fisher, total / 2, rtol=1e-4, atol=1e-10)
        assert torch.equal(initial, p.detach())
    # which images: run.json's identity
    digest = hashlib.sha256("".join(f"{p}\t{hashlib.sha256((source / p).read_bytes()).hexdigest()}\n"
                                    for p in method.source.paths).encode()).hexdigest()
    assert method.loaded_weights() == {"fisher_images_used": 4, "fisher_images_sha256": digest}
    # the same seed, the same images; fewer images: a prefix of that order (batches of 2, then the last one of 1)
    again = shiftlab.create_method("eata", model, classes, **{**settings, "fisher_images": 3})
    again.prepare()
    assert again.source.paths == method.source.paths[:3]
    assert [b.shape[0] for b in again.source.batches(model, 2)] == [2, 1]


def test_the_fisher_source_is_refused_in_one_line_when_missing_or_unused(source, tmp_path, capsys):
    from shiftlab.cli import main as cli_main
    model = tiny_vit(0)
    for settings, words in (({"fisher_alpha": 1.0}, "eata.fisher_alpha > 0 needs the Fisher information of clean "
                                                    "source images: eata's fisher_source='FOLDER'"),
                            ({"fisher_alpha": 1.0, "fisher_source": str(tmp_path / "nowhere")},
                             f"eata.fisher_source does not exist: {tmp_path / 'nowhere'}"),
                            ({"fisher_source": str(source)}, "eata.fisher_source is set but eata.fisher_alpha is 0")):
        method = shiftlab.create_method("eata", model, ["a", "b"], **settings)
        with pytest.raises(ValueError) as info:
            method.prepare()
        assert str(info.value).startswith(words) and "\n" not in str(info.value), str(info.value)
    # from the CLI: before the run directory is made, naming the flag
    data = make_image_folder(tmp_path / "data", ["a", "b"], per_class=1)
    argv = ["run", "--dataset", "imagefolder", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained", "none",
            "--methods", "eata", "--batch-size", "2", "--workers", "0", "--no-progress", "--out", str(tmp_path / "out"),
            "--set", "eata.fisher_alpha=2000"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("shiftlab run: error: eata.fisher_alpha > 0 needs the Fisher information") and \
        "--set eata.fisher_source=FOLDER" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_a_fisher_batch_of_one_image_on_batchnorm_is_refused_in_one_line(source):
    """3 source images in batches of 2 on the tiny ResNet at 32 px (last feature map 1x1): the last batch of one has
    no batch statistics; the refusal names the Fisher's settings, not --batch-size."""
    from shiftlab.models import load_model
    from shiftlab.models.architectures import builtin_configs
    config = builtin_configs()["shiftlab-tiny"]
    config["vision_cfg"]["image_size"] = 32
    model = load_model("shiftlab-tiny-32px", None, model_config=config)
    settings = dict(fisher_alpha=1.0, fisher_source=str(source), fisher_images=3, fisher_batch_size=2)
    method = shiftlab.create_method("eata", model, ["a", "b"], **settings)
    with pytest.raises(ValueError) as info:
        method.prepare()
    message = str(info.value)
    assert message.startswith("eata: the Fisher's 3 source images in batches of 2 leave a batch of one image") \
        and "fisher_images=2" in message and "\n" not in message, message
    method = shiftlab.create_method("eata", model, ["a", "b"], **{**settings, "fisher_images": 4})
    method.prepare()
    assert method.fishers is not None


@pytest.mark.slow
def test_a_run_with_the_fisher_killed_mid_stream_resumes_exactly(source, tmp_path, tiny_model, tiny_checkpoint):
    """fisher_alpha > 0 from a source folder, from the CLI and through RunConfig alike: the Fisher is recomputed on
    resume (at the initial parameters, before the checkpoint's state is restored), the records those of an
    uninterrupted run; run.json records which source images."""
    from _runs import Crash, comparable, crash_before_step, json_lines
    from shiftlab.cli import main as cli_main
    from shiftlab.datasets import build_dataset
    from shiftlab.engine.config import RunConfig
    from shiftlab.engine.loop import run
    folder = make_image_folder(tmp_path / "data", ["a", "b", "c"], per_class=2, seed=4)
    data = build_dataset("imagefolder", folder)
    fisher = {"fisher_alpha": 50.0, "fisher_source": str(source), "fisher_images": 4, "fisher_batch_size": 2,
              "lr": 0.05, "entropy_margin": 10.0, "redundancy_margin": 2.0}   # every image selected: the state moves

    def config(out, **kw):
        return RunConfig(**{**dict(dataset="imagefolder", methods=["eata"], method_config={"eata": fisher}, workers=0,
                                   progress=False, batch_size=2, seed=1, device="cpu", online_checkpoint_seconds=0,
                                   out=str(out)), **kw})
    # the uninterrupted run from the CLI (the tiny model's checkpoint: the same weights as `tiny_model`)
    sets = [a for field, value in fisher.items() for a in ("--set", f"eata.{field}={value}")]
    argv = ["run", "--dataset", "imagefolder", "--data", str(folder), "--model", "shiftlab-tiny", "--pretrained",
            str(tiny_checkpoint), "--methods", "eata", "--batch-size", "2", "--seed", "1", "--workers", "0",
            "--device", "cpu", "--no-progress", *sets, "--out", str(tmp_path / "whole")]
    assert cli_main(argv) == 0
    whole = json_lines(tmp_path / "whole" / "records.jsonl")

    with pytest.raises(Crash):
        run(config(tmp_path / "cut"), model=tiny_model, dataset=data, hooks=crash_before_step(1))
    assert 0 < len(json_lines(tmp_path / "cut" / "records.jsonl")) < len(whole) == 6
    run(config(tmp_path / "cut", resume=True), model=tiny_model, dataset=data)
    assert comparable(json_lines(tmp_path / "cut" / "records.jsonl")) == comparable(whole)
    recorded = json.loads((tmp_path / "cut" / "run.json").read_text())["methods"]["eata"]
    assert recorded["fisher_images_used"] == 4 and len(recorded["fisher_images_sha256"]) == 64
    assert recorded["fisher_source"] == str(source)
    # the Fisher is in play: without it the same stream ends elsewhere
    run(config(tmp_path / "eta", method_config={"eata": {**fisher, "fisher_alpha": 0.0, "fisher_source": None}}),
        model=tiny_model, dataset=data)
    assert comparable(json_lines(tmp_path / "eta" / "records.jsonl")) != comparable(whole)


# -- CLIPTTA's code (tests/fixtures/golden/eata) -------------------------------------------------------------


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_eata_matches_cliptta_batch_by_batch(golden_vit, golden_dir, variant):
    model, names, heads = golden_vit
    want = torch.load(golden_dir / "eata" / f"{variant}.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "eata" / "eata.json").read_text())["fixtures"][variant]
    assert info["argv"][info["argv"].index("--adaptation") + 1] == "eta" and info["n_batches"] == 3
    method = shiftlab.create_method("eata", model, names, heads=heads, logit_scale=100.0, **VARIANTS[variant])
    assert method.tower.parameter_names == info["adapted"]
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    kept = []
    for b in range(info["n_batches"]):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[8 * b:8 * b + 8]])
        assert_close(torch.stack([o.logits for o in outs]), want[f"{b}/logits"], TUNED_LOGITS, f"batch {b} logits")
        for name, value in method.tower.norm_state().items():
            assert_close(value, want[f"{b}/norm/{name}"], NORM_PARAMS, f"batch {b} {name}")
        assert_close(method.average, want[f"{b}/average"], FEATURES, f"batch {b} moving average")
        assert (method.selected_total, method.reliable_total) == (int(want[f"{b}/selected"]),
                                                                  int(want[f"{b}/reliable"]))
        kept.append(sum(o.extras["selected"] for o in outs))
    if variant == "eata_strong":      # the redundancy filter did decide: some images kept, some rejected
        assert 0 < sum(kept) < 24

"""DiffTPT: its two-stage selection against plain loops, the folder of generated views (its layout, the refusals, the
run identity), and the authors' own code on the golden tiny CLIP (tests/fixtures/golden/difftpt, made by the driver
beside it from chunmeifeng/DiffTPT's `test_time_adapt_eval` with `--aug_mode difftpt`, float32 on the CPU: 4
samples of the 32 golden views + 16 stand-in generated views each; 4 steps as their script, one step with another
cosine share, and none generated).

Golden tolerances: tests/_golden.py's; the selected views as a set after a margin check on both stages (the cosine
cut and the entropy cut).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import shiftlab
from _golden import FIXTURES, LOGITS, LOSS, assert_close, fixture_tolerances
from _prompt_tuning_golden import key_failures, run_variants
from shiftlab import ClassHeads, SampleContext
from shiftlab.methods.difftpt.method import cosine_then_confident
from shiftlab.methods.difftpt.views_folder import view0_key
from shiftlab.views.generator import base_view, to_uint8_tensor

NAMES = ["goldfish", "great white shark", "hammerhead shark", "stingray", "cock", "hen", "ostrich", "brambling"]

pytestmark = pytest.mark.usefixtures("one_thread")


def test_selection_is_the_cosine_filter_then_the_entropy_selection():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 21, 5, generator=gen, dtype=torch.float64) * 3
    got = cosine_then_confident(logits, 0.8, 0.3)
    for b in range(2):
        z = logits[b]
        cos = [float(z[0] @ z[i] / (z[0].norm() * z[i].norm())) for i in range(1, 21)]
        kept = sorted(range(1, 21), key=lambda i: -cos[i - 1])[:int(20 * 0.8)]
        candidates = [0] + kept
        ent = {v: float(-(z[v].softmax(-1) * z[v].log_softmax(-1)).sum()) for v in candidates}
        want = sorted(candidates, key=lambda v: ent[v])[:int(len(candidates) * 0.3)]
        assert got[b].tolist() == want
    # a view far from view 0 is never selected, however confident
    logits[0, 5] = -20 * logits[0, 0]      # cosine -1 to view 0, and the lowest entropy of all
    assert int(cosine_then_confident(logits, 1.0, 0.01)[0, 0]) == 5
    assert 5 not in cosine_then_confident(logits, 0.5, 1.0)[0].tolist()


# -- the folder of generated views ------------------------------------------------------------------------------

def write_folder(folder, views: dict[str, list[Image.Image]], image_size: int) -> None:
    """A diffusion-views folder in the documented layout (methods/difftpt/views_folder.py)."""
    images = {}
    for key, pics in views.items():
        (folder / key).mkdir(parents=True)
        shas = []
        for i, pic in enumerate(pics):
            pic.save(folder / key / f"{i}.png")
            shas.append(hashlib.sha256((folder / key / f"{i}.png").read_bytes()).hexdigest())
        images[key] = {"source": f"test image {key}", "views": shas}
    (folder / "manifest.json").write_text(json.dumps({"format": 1, "image_size": image_size,
                                                      "generator": {"stand_in": "random pixels"}, "images": images}))


def random_image(seed: int, size: int) -> Image.Image:
    gen = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (size, size, 3), generator=gen, dtype=torch.uint8).numpy())


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tiny_model):
    root = tmp_path_factory.mktemp("diffusion")
    image = random_image(0, 80)
    view0 = to_uint8_tensor(base_view(image, tiny_model.image_size, tiny_model.preprocess))
    generated = [random_image(10 + i, 72) for i in range(3)]
    write_folder(root, {view0_key(view0.numpy().tobytes()): generated}, tiny_model.image_size)
    return {"root": root, "image": image, "generated": generated}


def test_generated_views_are_appended_after_the_augmented_ones(tiny_model, folder):
    config = {"steps": 2, "views": 6, "cosine_ratio": 0.5, "selection_ratio": 0.5}
    method = shiftlab.create_method("difftpt", tiny_model, NAMES, n_diffusion=3, diffusion_views=str(folder["root"]),
                                    **config)
    got = method.predict_image(folder["image"])
    # the same tuning handed the 6 views + the 3 generated ones (their Resize + CenterCrop) as one view set
    from shiftlab.views.generator import ViewConfig, ViewGenerator
    views = ViewGenerator(ViewConfig(n_views=6), 0, preprocess=tiny_model.preprocess)(folder["image"], 0)
    generated = torch.stack([to_uint8_tensor(base_view(g, tiny_model.image_size, tiny_model.preprocess))
                             for g in folder["generated"]])
    heads = ClassHeads(tiny_model, NAMES)
    plain = shiftlab.create_method("difftpt", tiny_model, NAMES, heads=heads, n_diffusion=0, **config)
    ctx = SampleContext(tiny_model, heads, tiny_model.normalize(torch.cat([views, generated]).float() / 255))
    want = plain.predict_context(ctx)
    torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-5)
    assert method.loaded_weights() == {
        "diffusion_views_sha256": hashlib.sha256((folder["root"] / "manifest.json").read_bytes()).hexdigest()}
    assert method.frozen_encoder().identity["manifest_sha256"] == method.loaded_weights()["diffusion_views_sha256"]


def test_a_missing_or_damaged_folder_is_refused_in_one_line(tiny_model, folder, tmp_path):
    with pytest.raises(ValueError, match=r"diffusion_views is unset.*n_diffusion"):
        shiftlab.create_method("difftpt", tiny_model, NAMES)
    with pytest.raises(ValueError, match="no such folder of diffusion views"):
        shiftlab.create_method("difftpt", tiny_model, NAMES, diffusion_views=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="manifest.json: missing"):
        shiftlab.create_method("difftpt", tiny_model, NAMES, diffusion_views=str(tmp_path))
    with pytest.raises(ValueError, match="holds 3 generated views for some image, fewer than n_diffusion=63"):
        shiftlab.create_method("difftpt", tiny_model, NAMES, diffusion_views=str(folder["root"]))
    # an image the folder has no views for, and a view that is not the one its manifest names
    method = shiftlab.create_method("difftpt", tiny_model, NAMES, n_diffusion=3, diffusion_views=str(folder["root"]),
                                    steps=1, views=2)
    with pytest.raises(ValueError, match="holds no generated views for this image"):
        method.predict_image(random_image(5, 80))
    damaged = tmp_path / "damaged"
    import shutil
    shutil.copytree(folder["root"], damaged)
    png = next(damaged.glob("*/1.png"))
    random_image(99, 72).save(png)
    method = shiftlab.create_method("difftpt", tiny_model, NAMES, n_diffusion=3, diffusion_views=str(damaged),
                                    steps=1, views=2)
    with pytest.raises(ValueError, match="1.png differs from its SHA-256"):
        method.predict_image(folder["image"])


def test_a_run_plan_refuses_the_unset_folder_before_torch():
    from shiftlab.engine.config import RunConfig
    from shiftlab.engine.run_plan import PlanError, resolve_plan
    with pytest.raises(PlanError, match="diffusion_views is unset"):
        resolve_plan(RunConfig(methods=["difftpt"], dataset="imagenet-r", model="shiftlab-tiny"))
    plan = resolve_plan(RunConfig(methods=["difftpt"], dataset="imagenet-r", model="shiftlab-tiny",
                                  method_config={"difftpt": {"n_diffusion": 0}}))
    assert plan.method_configs()["difftpt"].n_diffusion == 0


def test_an_attacked_run_refuses_the_generated_views_and_all_leaves_them_out(folder):
    from shiftlab.engine.config import RunConfig
    from shiftlab.engine.run_plan import PlanError, resolve_plan
    given = {"difftpt": {"diffusion_views": str(folder["root"]), "n_diffusion": 3}}
    attacked = {"dataset": "imagenet-r", "model": "shiftlab-tiny", "attack": {"name": "pgd"}}
    clean = {k: v for k, v in attacked.items() if k != "attack"}
    assert "difftpt" in resolve_plan(RunConfig(methods=["difftpt"], method_config=given, **clean)).method_plans()
    with pytest.raises(PlanError, match="generated views of an attacked image need the diffusion model"):
        resolve_plan(RunConfig(methods=["difftpt"], method_config=given, **attacked))
    assert "difftpt" not in resolve_plan(RunConfig(methods=["all"], method_config=given, **attacked)).method_plans()
    plan = resolve_plan(RunConfig(methods=["difftpt"], method_config={"difftpt": {"n_diffusion": 0}}, **attacked))
    assert plan.method_configs()["difftpt"].n_diffusion == 0


def test_all_leaves_it_out_without_its_folder_and_says_so(caplog, folder):
    import logging

    from shiftlab.engine.config import RunConfig, expand_methods
    from shiftlab.engine.run_plan import resolve_plan
    with caplog.at_level(logging.WARNING):
        names = expand_methods(["all"])
    assert "difftpt" not in names and "tpt" in names
    assert "methods 'all' leaves out difftpt (difftpt: diffusion_views is unset" in caplog.text
    assert "difftpt" not in resolve_plan(RunConfig(methods=["all"], model="shiftlab-tiny")).method_plans()
    given = {"difftpt": {"diffusion_views": str(folder["root"]), "n_diffusion": 3}}
    assert "difftpt" in expand_methods(["all"], method_config=given)
    plan = resolve_plan(RunConfig(methods=["all"], model="shiftlab-tiny", method_config=given))
    assert "difftpt" in plan.method_plans()
    assert "difftpt" in expand_methods(["all"], method_config={"difftpt": {"n_diffusion": 0}})


# -- golden checks: the authors' code ---------------------------------------------------------------------------

def _driver():
    loc = importlib.util.spec_from_file_location("difftpt_driver", FIXTURES / "difftpt" / "driver.py")
    module = importlib.util.module_from_spec(loc)
    loc.loader.exec_module(module)
    return module


DRIVER = _driver()
VARIANTS = {v: {"steps": steps, "cosine_ratio": cos, "selection_ratio": ent, "n_diffusion": 0}
            for v, (steps, cos, ent, _) in DRIVER.VARIANTS.items()}
SAMPLES = range(4)
SCALARS = ("loss", "entropy_loss")   # the values their code saved per sample: the loss is the entropy loss


@pytest.fixture(scope="module")
def golden(golden_dir, golden_model, one_thread_module):
    expected = torch.load(FIXTURES / "difftpt" / "difftpt.pt", weights_only=True)
    model, classnames = golden_model
    views_u8 = torch.load(golden_dir / "inputs.pt", weights_only=True)["views_unit"].mul(255).round().to(torch.uint8)
    got = {}
    for variant, config in VARIANTS.items():
        n = DRIVER.VARIANTS[variant][3]
        generated = DRIVER.stand_in_generated(views_u8, n) if n else views_u8[:, :0]
        inputs = torch.cat([views_u8, generated], 1).float() / 255
        got.update(run_variants("difftpt", model, classnames, inputs, {variant: config}, SAMPLES, ("loss",)))
        for i in SAMPLES:
            got[f"{variant}/{i}/entropy_loss"] = got[f"{variant}/{i}/loss"]
            # the entropy cut is among view 0 + the cosine-kept views: its margin is checked there
            logits = got[f"{variant}/{i}/view_logits"]
            cos = F.cosine_similarity(logits[1:], logits[:1], dim=-1)
            k1 = int((logits.shape[0] - 1) * config["cosine_ratio"])
            ranked = cos.sort(descending=True).values
            assert float(ranked[k1 - 1] - ranked[k1]) > 1e-4, f"{variant}/{i}: the cosine cut is within rounding"
            kept = 1 + cos.argsort(descending=True, stable=True)[:k1]
            got[f"{variant}/{i}/view_logits"] = logits[torch.cat([torch.zeros(1, dtype=kept.dtype), kept])]
            got[f"{variant}/{i}/selected"] = _as_candidate_positions(got[f"{variant}/{i}/selected"], kept)
            expected[f"{variant}/{i}/selected"] = _as_candidate_positions(expected[f"{variant}/{i}/selected"], kept)
    return {"expected": expected, "got": got}


def _as_candidate_positions(selected: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """View indices -> positions among view 0 + the kept views (what the entropy margin check indexes)."""
    order = [0, *kept.tolist()]
    return torch.tensor([order.index(int(v)) for v in selected])


TOLERANCES = fixture_tolerances("difftpt")   # tests/fixtures/golden/difftpt/tolerances.json: rounding through Adam


@pytest.mark.golden
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_golden_key(golden, variant):
    steps = VARIANTS[variant]["steps"]
    failures = key_failures(golden["expected"], golden["got"], variant, n_samples=len(SAMPLES), steps=steps,
                            scalars=SCALARS, scalar_tol=lambda want: LOSS, logits_tol=LOGITS)
    # past AdamW's first step, the contexts and the tuned logits under the fixture's tolerances (why: its json)
    later = {f"{variant}/{i}/s{s}/ctx": TOLERANCES["ctx_after_step_1"] for i in SAMPLES for s in range(1, steps)}
    if steps > 1:
        later.update({f"{variant}/{i}/logits": TOLERANCES["logits_after_steps"] for i in SAMPLES})
    rest = []
    for line in failures:
        key = line.split(":", 1)[0]
        if key in later:
            assert_close(golden["got"][key].detach().float(), golden["expected"][key], later[key], key)
        else:
            rest.append(line)
    assert not rest, "\n".join(rest)


def test_the_fixture_names_its_stand_in_views_and_their_entry_point():
    info = json.loads((FIXTURES / "difftpt" / "difftpt.json").read_text())
    assert info["reference"]["repository"] == "https://github.com/chunmeifeng/DiffTPT"
    assert info["fixtures"]["r"]["n_generated"] == 16 and "stand-ins" in info["fixtures"]["r"]["generated_views"]
    assert info["fixtures"]["r"]["tta_steps"] == 4 and info["fixtures"]["r"]["aug_mode"] == "difftpt"


# -- the generator script: its refusals (no diffusion model runs in the tests) --------------------------------

def _generate(tmp_path, extra_path: str | None = None):
    import os
    import subprocess
    import sys
    root = FIXTURES.parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [extra_path, str(root / "src")]))}
    (tmp_path / "images").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, str(root / "tools" / "generate_diffusion_views.py"), "--images",
                           str(tmp_path / "images"), "--out", str(tmp_path / "views")],
                          capture_output=True, text=True, env=env, timeout=120)


def test_the_generator_says_in_one_line_that_diffusers_is_missing(tmp_path):
    import importlib.util as iu
    if iu.find_spec("diffusers") is not None:
        pytest.skip("diffusers is installed here")
    done = _generate(tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("generate_diffusion_views: error: diffusers is not installed")
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_generator_says_in_one_line_that_the_weights_are_missing(tmp_path):
    fake = tmp_path / "fake"
    (fake / "diffusers").mkdir(parents=True)
    (fake / "diffusers" / "__init__.py").write_text(
        "class StableDiffusionImageVariationPipeline:\n"
        "    @classmethod\n"
        "    def from_pretrained(cls, name, revision=None):\n"
        "        raise OSError(f'{name} does not appear to have a file named model_index.json.\\nmore')\n")
    done = _generate(tmp_path, str(fake))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip() == (
        "generate_diffusion_views: error: cannot load lambdalabs/sd-image-variations-diffusers (revision v2.0): "
        "lambdalabs/sd-image-variations-diffusers does not appear to have a file named model_index.json.; download "
        "its weights (or point HF_HOME at a cache holding them) and run again")


# -- a run: the generated views' encoding in a feature store, their folder in the run identity -------------------

def test_a_run_reads_the_folder_stores_its_encoding_and_records_its_identity(tmp_path, tiny_model, capsys):
    from _runs import comparable, json_lines
    from _synthetic import make_image_folder
    from shiftlab import RunConfig, run
    from shiftlab.datasets import build_dataset
    from shiftlab.datasets.imageio import decode_image
    from shiftlab.engine.features import encode
    from shiftlab.rundir.feature_store import FeatureStore
    root = make_image_folder(tmp_path / "data", ["cat", "dog", "car"], size=(40, 30))
    data = build_dataset("imagefolder", root)
    views = {}
    for k, path in enumerate(sorted(root.rglob("*.png"))):
        view0 = to_uint8_tensor(base_view(decode_image(path), tiny_model.image_size, tiny_model.preprocess))
        views[view0_key(view0.numpy().tobytes())] = [random_image(100 + 3 * k + i, 48) for i in range(2)]
    write_folder(tmp_path / "generated", views, tiny_model.image_size)
    difftpt = {"n_diffusion": 2, "diffusion_views": str(tmp_path / "generated"), "steps": 1}

    def config(out, store=True):
        return RunConfig(dataset="imagefolder", methods=["difftpt"], method_config={"difftpt": difftpt}, views=3,
                         workers=0, progress=False, batch_size=2, out=str(tmp_path / out), device="cpu",
                         features=str(tmp_path / "fs") if store else None, features_dtype="fp32")
    run(config("plain", store=False), model=tiny_model, dataset=data)
    digest = hashlib.sha256((tmp_path / "generated" / "manifest.json").read_bytes()).hexdigest()
    identity = json.loads((tmp_path / "plain" / "run.json").read_text())
    assert identity["methods"]["difftpt"]["diffusion_views_sha256"] == digest
    assert encode(config("unused"), model=tiny_model, dataset=data)["encoded"] == 3
    capsys.readouterr()
    run(config("stored"), model=tiny_model, dataset=data)
    assert "3 sample(s) read from the store" in capsys.readouterr().err
    reference = comparable(json_lines(tmp_path / "plain" / "records.jsonl"))
    assert len(reference) == 3 and all("error" not in r for r in json_lines(tmp_path / "plain" / "records.jsonl"))
    assert comparable(json_lines(tmp_path / "stored" / "records.jsonl")) == reference
    (entry,) = [e for e in FeatureStore(tmp_path / "fs") if "encoder" in e.key]
    assert entry.key["encoder"]["manifest_sha256"] == digest and entry.features(0).shape[0] == 1


def test_a_replaced_view_is_an_error_record_of_its_sample_and_the_run_goes_on(tmp_path, tiny_model):
    # the folder's views are verified when read: one that is not its manifest's fails DiffTPT on that image alone
    from _runs import json_lines
    from _synthetic import make_image_folder
    from shiftlab import RunConfig, run
    from shiftlab.datasets import build_dataset
    from shiftlab.datasets.imageio import decode_image
    root = make_image_folder(tmp_path / "data", ["cat", "dog", "car"], size=(40, 30))
    data = build_dataset("imagefolder", root)
    keys = []
    for path in sorted(root.rglob("*.png")):
        view0 = to_uint8_tensor(base_view(decode_image(path), tiny_model.image_size, tiny_model.preprocess))
        keys.append(view0_key(view0.numpy().tobytes()))
    write_folder(tmp_path / "generated", {k: [random_image(100 + 2 * i + j, 48) for j in range(2)]
                                          for i, k in enumerate(keys)}, tiny_model.image_size)
    replaced = data.samples.index(next(s for s in data.samples if s[0].startswith("dog/")))
    random_image(999, 48).save(tmp_path / "generated" / keys[replaced] / "1.png")
    config = RunConfig(dataset="imagefolder", methods=["difftpt", "zeroshot"], views=3, workers=0, progress=False,
                       method_config={"difftpt": {"n_diffusion": 2, "diffusion_views": str(tmp_path / "generated"),
                                                  "steps": 1}},
                       batch_size=2, out=str(tmp_path / "out"), device="cpu")
    run(config, model=tiny_model, dataset=data)
    records = json_lines(tmp_path / "out" / "records.jsonl")
    errors = [r for r in records if "error" in r]
    assert [(r["id"], r["method"]) for r in errors] == [(replaced, "difftpt")]
    assert "1.png differs from its SHA-256" in errors[0]["error"]
    assert sorted((r["id"], r["method"]) for r in records if "error" not in r) == sorted(
        [(i, "zeroshot") for i in range(3)] + [(i, "difftpt") for i in range(3) if i != replaced])

"""What a run's plan lists beside the configs (engine/run_plan.py): the feature-store entries a run reads and writes,
equal to those the run then writes; each method's own files, models and frozen encoder; all printed by
`shiftlab run --dry-run`."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch
from PIL import Image

from _synthetic import make_image_folder
from shiftlab.cli import main as cli_main
from shiftlab.engine.run_plan import key_line, resolve_plan

pytestmark = pytest.mark.usefixtures("one_thread")
KEY_FIELDS = ("recipe", "n_views", "precision", "seed", "storage")   # what the plan decides of a key


def _generated_views(folder, data, model) -> None:
    """A DiffTPT folder of 2 random 'generated' views per image of `data` (methods/difftpt/views_folder.py)."""
    from shiftlab.datasets.imageio import decode_image
    from shiftlab.methods.difftpt.views_folder import view0_key
    from shiftlab.views.generator import base_view, to_uint8_tensor
    images = {}
    for k, path in enumerate(sorted(data.rglob("*.png"))):
        view0 = to_uint8_tensor(base_view(decode_image(path), model.image_size, model.preprocess))
        key = view0_key(view0.numpy().tobytes())
        (folder / key).mkdir(parents=True)
        shas = []
        for i in range(2):
            pixels = torch.randint(0, 256, (48, 48, 3), generator=torch.Generator().manual_seed(10 * k + i))
            Image.fromarray(pixels.to(torch.uint8).numpy()).save(folder / key / f"{i}.png")
            shas.append(hashlib.sha256((folder / key / f"{i}.png").read_bytes()).hexdigest())
        images[key] = {"source": str(path), "views": shas}
    (folder / "manifest.json").write_text(json.dumps({"format": 1, "image_size": model.image_size,
                                                      "generator": {"stand_in": "random pixels"}, "images": images}))


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model):
    root = tmp_path_factory.mktemp("plan-store")
    data = make_image_folder(root / "data", ["cat", "dog"], size=(40, 30))
    _generated_views(root / "generated", data, tiny_model)
    torch.save(tiny_model.clip.state_dict(), root / "tiny.pt")
    return root


def _argv(root, out, *extra):
    return ["run", "--data", str(root / "data"), "--dataset", "imagefolder", "--model", "shiftlab-tiny",
            "--pretrained", str(root / "tiny.pt"), "--workers", "0", "--device", "cpu", "--no-progress",
            "--out", str(out), *extra]


@pytest.mark.slow
def test_dry_run_lists_the_store_keys_the_run_then_writes_and_the_frozen_encoders_folder(setup, capsys):
    # three encodings: zero-shot's and DiffTPT's default family at 3 views (fp32 on the CPU, whatever each asks),
    # TDA's AugMix family, and DiffTPT's generated views (its frozen encoder of view 0, keyed by the folder)
    argv = _argv(setup, setup / "run", "--methods", "zeroshot,tda,difftpt", "--views", "3", "--features",
                 str(setup / "fs"), "--features-dtype", "fp32", "--set", "tda.views={'augmix': True}",
                 "--set", "difftpt.precision=fp32", "--set", "difftpt.n_diffusion=2", "--set", "difftpt.steps=1",
                 "--set", f"difftpt.diffusion_views={setup / 'generated'}")
    capsys.readouterr()
    assert cli_main([*argv, "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert not (setup / "run").exists() and not (setup / "fs").exists()
    tiny = hashlib.sha256((setup / "tiny.pt").read_bytes()).hexdigest()[:16]
    assert f"model: shiftlab-tiny ({setup / 'tiny.pt'}: file, sha256 {tiny}); device cpu" in printed
    assert f"    difftpt reads diffusion_views={setup / 'generated'} (folder)" in printed
    assert f"  feature store {setup / 'fs'}: entries keyed by" in printed
    assert cli_main(argv) == 0
    from shiftlab.rundir.feature_store import FeatureStore
    stored = [e.key for e in FeatureStore(setup / "fs")]
    assert len(stored) == 3 and sum("encoder" in k for k in stored) == 1
    # the encoder entry's key, identity included, is the one planned and printed: the folder's manifest digest
    (encoder,) = [k["encoder"] for k in stored if "encoder" in k]
    manifest = hashlib.sha256((setup / "generated" / "manifest.json").read_bytes()).hexdigest()
    assert encoder == {"encoder": "difftpt-diffusion-views", "manifest_sha256": manifest, "n_views": 2}
    assert f"    difftpt reads view 0 through its frozen encoder {json.dumps(encoder, sort_keys=True)}" in printed
    written = sorted(key_line({**{f: k[f] for f in KEY_FIELDS},
                               **({"encoder": k["encoder"], "encoder_of": "difftpt"} if "encoder" in k else {})}, None)
                     for k in stored)
    listed = sorted(line.strip() for line in printed.splitlines() if line.startswith("    ") and " recipe {" in line)
    assert listed == written
    assert sorted(k["n_views"] for k in stored) == [1, 3, 3]
    assert {k["precision"] for k in stored} == {"fp32"}


def test_the_plans_keys_follow_the_device_and_the_run_precision():
    config = dict(methods=["zeroshot", "tda"], views=4, features="fs", method_config={"tda": {"precision": "fp32"}})
    from shiftlab.engine.config import RunConfig
    plan = resolve_plan(RunConfig(**config))
    # on the CPU both run fp32: one encoding of 4 views; on CUDA zero-shot's "auto" is fp16 autocast: two
    assert [(k["n_views"], k["precision"]) for k in plan.store_keys("cpu")] == [(4, "fp32")]
    assert [(k["n_views"], k["precision"]) for k in plan.store_keys("cuda")] == [(1, "fp16"), (4, "fp32")]
    assert plan.device_types() == ["cuda", "cpu"]
    assert resolve_plan(RunConfig(**config, precision="fp32")).store_keys("cuda") == plan.store_keys("cpu")
    attacked = resolve_plan(RunConfig(**config, attack={"name": "pgd"}))
    assert attacked.store_keys("cpu") == [] and "attacked setting" in attacked.store_skipped()
    assert "no feature store" in resolve_plan(RunConfig(methods=["zeroshot"])).text()


def test_the_plan_keys_a_frozen_encoder_by_its_identity_only_where_the_config_uses_one(tiny_model, tmp_path):
    from shiftlab import create_method
    from shiftlab.engine.config import RunConfig

    def plan(**cosmic):
        return resolve_plan(RunConfig(methods=["zeroshot", "cosmic"], views=8, features="fs",
                                      method_config={"cosmic": cosmic}))
    clip_only = plan(dino_model=None)   # the CLIP-only variant: no DINOv2, no entry of its own
    assert not clip_only.method_plans()["cosmic"].reads_frozen_encoder
    assert [k for k in clip_only.store_keys("cpu") if "encoder" in k or "encoder_of" in k] == []
    assert "    cosmic uses no frozen encoder of its own under this config" in clip_only.text()
    (tmp_path / "dino.pth").write_bytes(b"not really weights")
    dino = plan(dino_pretrained=str(tmp_path / "dino.pth"))
    assert dino.method_plans()["cosmic"].reads_frozen_encoder
    (entry,) = [k for k in dino.store_keys("cpu") if "encoder" in k]
    assert entry["encoder"]["checkpoint_sha256"] == hashlib.sha256(b"not really weights").hexdigest()
    assert (entry["n_views"], entry["encoder_of"]) == (1, "cosmic")
    built = create_method("cosmic", tiny_model, ["cat", "dog"], dino_pretrained=str(tmp_path / "dino.pth"))
    assert entry["encoder"] == built.frozen_encoder().key_fields()     # what the run keys its entry with
    # a checkpoint that is not there: the dry run says so in one line, as the run would
    text = plan(dino_pretrained=str(tmp_path / "nope.pth")).text()
    (line,) = [line for line in text.splitlines() if "cosmic reads view 0" in line]
    assert line.startswith("    cosmic reads view 0 through its frozen encoder, which cannot be had: cosmic: DINOv2 "
                           f"weights '{tmp_path / 'nope.pth'}' not found")


def test_dry_run_lists_a_methods_own_model_and_files(setup, capsys, tmp_path):
    (tmp_path / "means.pt").write_bytes(b"statistics")
    argv = _argv(setup, tmp_path / "run", "--methods", "rlcf,tpt", "--set", "rlcf.reward_model=shiftlab-tiny",
                 "--set", "rlcf.reward_pretrained=none", "--set", "rlcf.reward_seed=3",
                 "--set", f"tpt.ctx_checkpoint={tmp_path / 'means.pt'}", "--features", str(tmp_path / "fs"),
                 "--dry-run")
    capsys.readouterr()
    assert cli_main(argv) == 0
    printed = capsys.readouterr().out
    assert "    rlcf loads its own model shiftlab-tiny (random weights, seed 3)" in printed
    digest = hashlib.sha256(b"statistics").hexdigest()[:16]
    assert f"    tpt reads ctx_checkpoint={tmp_path / 'means.pt'} (file, sha256 {digest})" in printed
    assert "  feature store: no feature store read or written: rlcf read pixels" in printed


@pytest.fixture
def resolutions(monkeypatch):
    """The method lists of every `resolve_plan` call (a command's checks, the run, `encode`, later orders)."""
    from shiftlab.engine import loop, run_plan
    calls = []
    real = run_plan.resolve_plan

    def counting(*args, **kwargs):
        calls.append(list(args[0].methods))
        return real(*args, **kwargs)

    monkeypatch.setattr(run_plan, "resolve_plan", counting)
    monkeypatch.setattr(loop, "resolve_plan", counting)
    return calls


@pytest.mark.slow
def test_encode_and_later_orders_are_handed_the_checks_plan(setup, tmp_path, resolutions):
    # `shiftlab encode` narrows the plan to the methods it stores (RLCF reads pixels); `--orders 2` runs its second
    # order of the online methods with the first's plan
    argv = _argv(setup, tmp_path / "enc", "--methods", "zeroshot,rlcf", "--features", str(tmp_path / "fs"),
                 "--set", "rlcf.reward_model=shiftlab-tiny", "--set", "rlcf.reward_pretrained=none")
    argv[0] = "encode"
    assert cli_main(argv) == 0 and resolutions == [["zeroshot", "rlcf"]]
    resolutions.clear()
    argv = _argv(setup, tmp_path / "orders", "--methods", "zeroshot,tda", "--orders", "2", "--views", "2")
    assert cli_main(argv) == 0
    assert resolutions == [["zeroshot", "tda"]]
    assert (tmp_path / "orders" / "orders.md").is_file()


@pytest.mark.slow
def test_a_suite_hands_each_dataset_its_part_of_the_checks_plan(setup, tmp_path, resolutions):
    from shiftlab.synthetic import make_imagenet_r
    from test_suites import make_imagenet_a
    make_imagenet_r(tmp_path / "data", classes=[0, 40])
    make_imagenet_a(tmp_path / "data", 2)
    argv = ["run", "--data", str(tmp_path / "data"), "--datasets", "imagenet-r,imagenet-a", "--model",
            "shiftlab-tiny", "--pretrained", str(setup / "tiny.pt"), "--workers", "0", "--device", "cpu",
            "--no-progress", "--allow-partial", "--methods", "zeroshot,tda", "--views", "2", "--out",
            str(tmp_path / "suite")]
    assert cli_main(argv) == 0
    assert resolutions == [["zeroshot", "tda"]]
    assert all((tmp_path / "suite" / d / "summary.json").is_file() for d in ("imagenet-r", "imagenet-a"))

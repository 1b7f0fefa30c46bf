"""TENT: its loss against a straightforward computation, the CLI under `--batch-size`, and CLIPTTA's Tent
(github.com/MarcLafon/cliptta `ttavlm/methods/tent.py`, the CLIP version issue #32 follows) on the golden tiny ViT
(tests/fixtures/golden/tent, made by the driver beside the fixtures, float32 on the CPU).

Golden: 24 images in 3 batches of 8, their closed-set script's settings (10 Adam steps per batch, continual) and
an episodic SGD variant with the mean-entropy term; after every batch the logits (held to TUNED_LOGITS: measured
2.9e-4 after 30 Adam steps) and every adapted normalisation parameter (NORM_PARAMS: measured 1.6e-5), the
predictions exactly after a top-1 margin check. The shared machinery's own tests: test_norm_adaptation.py.
"""
from __future__ import annotations

import json

import pytest
import torch

import shiftlab
from _golden import FEATURES, NORM_PARAMS, TUNED_LOGITS, assert_close, assert_top1_margin, stream_views
from shiftlab.methods.context import SampleContext
from shiftlab.methods.tent.method import tent_loss
from shiftlab.synthetic import tiny_vit

pytestmark = pytest.mark.usefixtures("one_thread")

# the variants of the driver, as shiftlab configs (their argv: tests/fixtures/golden/tent/tent.json)
VARIANTS = {"tent": {},
            "tent_sgd": {"episodic": True, "optimizer": "sgd", "lr": 0.01, "steps": 2, "mean_entropy_weight": 0.1}}


def test_loss_is_the_mean_entropy_minus_the_weighted_entropy_of_the_mean():
    logits = torch.tensor([[3.0, 1.0, 0.0], [0.0, 2.0, 0.5], [1.0, 1.0, 1.0]])
    p = logits.softmax(-1)
    mean_h = float(-(p * p.log()).sum(-1).mean())
    pm = p.mean(0)
    assert float(tent_loss(logits, 0.0)) == pytest.approx(mean_h, abs=1e-6)
    assert float(tent_loss(logits, 0.3)) == pytest.approx(mean_h - 0.3 * float(-(pm * (pm + 1e-6).log()).sum()),
                                                          abs=1e-6)


def test_without_predict_after_update_one_step_returns_the_unadapted_logits():
    model = tiny_vit(0)
    classes = ["cat", "dog", "car"]
    batch = model.normalize(torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(3)))
    method = shiftlab.create_method("tent", model, classes, steps=1, predict_after_update=False, lr=0.1)
    outs = method.adapt_batch([SampleContext(model, method.heads, batch[i:i + 1]) for i in range(3)])
    with torch.no_grad():
        want = model.logit_scale * torch.nn.functional.normalize(model.clip.encode_image(batch), dim=-1) \
            @ method.heads.zeroshot.T
    torch.testing.assert_close(torch.stack([o.logits for o in outs]), want, rtol=0, atol=1e-4)
    after = shiftlab.create_method("tent", model, classes, steps=1, lr=0.1)
    moved = after.adapt_batch([SampleContext(model, after.heads, batch[i:i + 1]) for i in range(3)])
    assert float((torch.stack([o.logits for o in moved]) - want).abs().max()) > 1e-3
    assert outs[0].extras["loss"] == pytest.approx(float(tent_loss(want, 0.0)), abs=1e-5)


def test_paper_protocol_is_the_original_tent_recipe():
    from shiftlab.methods.base import describe
    paper = describe("paper", "tent")["config"]
    assert (paper["steps"], paper["optimizer"], paper["lr"], paper["adam_eps"], paper["predict_after_update"]) \
        == (1, "adam", 1e-3, 1e-8, False)
    default = describe("leaderboard", "tent")["config"]
    assert (default["steps"], default["adam_eps"], default["predict_after_update"]) == (10, 1e-6, True)


def test_bad_values_are_refused_in_one_line(tiny_model):
    for kw, match in (({"steps": 0}, "tent.steps"), ({"optimizer": "rmsprop"}, "tent.optimizer"),
                      ({"lr": -1.0}, "tent.lr"), ({"momentum": 1.0}, "tent.momentum")):
        with pytest.raises(ValueError, match=match):
            shiftlab.create_method("tent", tiny_model, ["a", "b"], **kw)


def test_cli_runs_tent_on_batches_and_records_the_batch_size(tmp_path, tiny_checkpoint, capsys):
    from _runs import json_lines
    from _synthetic import make_imagenet_r
    from shiftlab.cli import main as cli_main
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 50), per_class=2, size=(72, 64))
    flags = ["--dataset", "imagenet-r", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained",
             str(tiny_checkpoint), "--workers", "0", "--no-progress", "--allow-partial", "--methods", "tent",
             "--set", "tent.steps=1", "--batch-size", "4", "--out", str(tmp_path / "run")]
    assert cli_main(["run", *flags]) == 0
    records = json_lines(tmp_path / "run" / "records.jsonl")
    assert len(records) == 8 and {r["method"] for r in records} == {"tent"}
    assert all(r["extras"]["loss"] > 0 for r in records)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["shared"]["batch_size"] == 4
    capsys.readouterr()


# -- CLIPTTA's code (tests/fixtures/golden/tent) -------------------------------------------------------------


def test_the_fixture_ran_their_scripts_settings(golden_dir):
    info = json.loads((golden_dir / "tent" / "tent.json").read_text())
    assert info["reference"]["commit"] == "f4221f4f2b3bfbd220f8836411bbd3774758933d"
    argv = info["fixtures"]["tent"]["argv"]
    assert argv[argv.index("--steps") + 1] == "10" and argv[argv.index("--beta_reg") + 1] == "0.0"
    assert info["fixtures"]["tent"]["n_batches"] == 3 and "--episodic" in info["fixtures"]["tent_sgd"]["argv"]


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_tent_matches_cliptta_batch_by_batch(golden_vit, golden_dir, variant):
    model, names, heads = golden_vit
    want = torch.load(golden_dir / "tent" / f"{variant}.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "tent" / "tent.json").read_text())["fixtures"][variant]
    assert_close(heads.zeroshot, want["prototypes"], FEATURES, "text head")
    method = shiftlab.create_method("tent", model, names, heads=heads, logit_scale=100.0, **VARIANTS[variant])
    assert method.tower.parameter_names == info["adapted"]
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    for b in range(info["n_batches"]):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[8 * b:8 * b + 8]])
        logits = torch.stack([o.logits for o in outs])
        assert_close(logits, want[f"{b}/logits"], TUNED_LOGITS, f"batch {b} logits")
        for name, value in method.tower.norm_state().items():
            assert_close(value, want[f"{b}/norm/{name}"], NORM_PARAMS, f"batch {b} {name}")
        assert_top1_margin(want[f"{b}/logits"], TUNED_LOGITS, f"batch {b}")
        assert torch.equal(logits.argmax(1), want[f"{b}/logits"].argmax(1))

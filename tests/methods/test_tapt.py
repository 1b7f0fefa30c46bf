"""TAPT: the deep visual prompts against open_clip's own tower, the token statistics against a straightforward
computation, the loss written out, the files in their published formats, its refusals, the adaptive prediction,
and its authors' own code on the golden tiny ViT (tests/fixtures/golden/tapt, made by the driver beside the
fixtures from github.com/xinwong/TAPT's `TAPTV.tapt()`, float32 on the CPU).

Golden tolerances (tests/_golden.py): the view logits LOGITS; the loss LOSS relative; the tuned prompts PARAMS
plus lr x 1e-3 per step (a first AdamW step moves each entry by ~lr x sign(grad): an entry whose gradient is
~0 can take the other sign on another machine); the final logits TUNED_LOGITS.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import shiftlab
from _golden import LOGITS, LOSS, PARAMS, TUNED_LOGITS, assert_close, stream_views
from shiftlab.methods.common.deep_visual_prompts import (
    dataset_statistics,
    load_statistics,
    load_vpt_checkpoint,
    prompted_forward,
    view_statistics,
)
from shiftlab.methods.context import SampleContext
from shiftlab.methods.tapt.method import STATISTICS, Statistics, align_loss

CLASSNAMES = ["cat", "dog", "car"]
pytestmark = pytest.mark.usefixtures("one_thread")
DRIVER = Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "tapt" / "driver.py"


def _driver():
    spec = importlib.util.spec_from_file_location("tapt_driver", DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_statistics(tmp: Path, blocks: int, tokens: int, width: int) -> dict[str, str]:
    stats = _driver().stand_in_statistics(blocks, tokens, width)
    paths = {}
    for name, value in stats.items():
        torch.save(value, tmp / f"{name}.pt")
        paths[name] = str(tmp / f"{name}.pt")
    return paths


@pytest.fixture(scope="module")
def vit():
    from shiftlab.synthetic import tiny_vit
    return tiny_vit(0)


# -- the prompted tower ---------------------------------------------------------------------------------------

def test_prompts_inside_the_tower_by_hand(vit):
    """Zero-width prompts are impossible, so: the prompted tower written out with open_clip's own modules, and
    prompts placed at the end (the class token reads them through attention: the features move with them)."""
    visual = vit.clip.visual
    x = vit.normalize(torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0)))
    prompts = torch.randn(3, 2, 64, generator=torch.Generator().manual_seed(1))
    out = prompted_forward(visual, x, prompts)
    h = visual.conv1(x).flatten(2).transpose(1, 2)
    h = torch.cat([visual.class_embedding.expand(2, 1, -1), h], 1) + visual.positional_embedding
    h = visual.ln_pre(torch.cat([h, prompts[0].expand(2, -1, -1)], 1))
    for i, block in enumerate(visual.transformer.resblocks):
        if i in (1, 2):
            h = torch.cat([h[:, :-2], prompts[i].expand(2, -1, -1)], 1)
        assert_close(out.block_inputs[i], h, 1e-6, f"block {i} input")
        h = block(h)
    assert_close(out.features, visual.ln_post(h[:, 0]) @ visual.proj, 1e-6, "features")
    other = prompted_forward(visual, x, prompts * 2).features
    assert not torch.allclose(other, out.features, atol=1e-4)


def test_view_and_dataset_statistics_against_torch():
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(7, 5, 4, generator=gen) for _ in range(3)]
    index = torch.tensor([4, 0, 2])
    mean, var = view_statistics(inputs, index)
    for layer, feats in enumerate(inputs):
        assert_close(mean[layer], feats[index].mean(0), 1e-6, "mean")
        assert_close(var[layer], feats[index].var(0, unbiased=False), 1e-6, "biased variance")
    # a data set in batches of 3, 2 and 2 images: the mean over images and the unbiased variance around it
    batches = [[f[:3] for f in inputs], [f[3:5] for f in inputs], [f[5:] for f in inputs]]
    means, variances = dataset_statistics(batches)
    whole = torch.stack(inputs, dim=1)
    assert_close(means, whole.mean(0), 1e-6, "data set mean")
    assert_close(variances, whole.var(0, unbiased=True), 1e-5, "data set variance")
    with pytest.raises(ValueError, match="two images"):
        dataset_statistics([[f[:1] for f in inputs]])


def test_align_loss_written_out():
    gen = torch.Generator().manual_seed(2)
    out = Statistics(torch.randn(4, 3, 2, generator=gen), torch.rand(4, 3, 2, generator=gen))
    target = Statistics(torch.randn(4, 3, 2, generator=gen), torch.rand(4, 3, 2, generator=gen))
    want = sum(0.5 * (out.means[i] - target.means[i]).abs().mean() + 0.5 * (out.vars[i] - target.vars[i]).abs().mean()
               for i in (1, 2))
    assert_close(align_loss(out, target, range(1, 3)), want, 1e-6, "l1")
    want2 = sum(0.5 * ((out.means[i] - target.means[i]) ** 2).mean()
                + 0.5 * ((out.vars[i] - target.vars[i]) ** 2).mean() for i in range(4))
    assert_close(align_loss(out, target, range(4), "l2"), want2, 1e-6, "l2")


# -- files in their formats and refusals ------------------------------------------------------------------------

def test_statistics_files_and_checkpoints_in_their_format(vit, tmp_path):
    paths = _write_statistics(tmp_path, 4, 19, 64)
    assert load_statistics(paths["means_adv"], 4, 19, 64).shape == (4, 19, 64)
    with pytest.raises(ValueError, match=r"holds \(4, 19, 64\), this tower needs \(12, 199, 768\)"):
        load_statistics(paths["means_adv"], 12, 199, 768)
    with pytest.raises(ValueError, match="does not exist"):
        load_statistics(tmp_path / "nope.pt", 4, 19, 64)
    ckpt = _driver().stand_in_checkpoint(4, 2, 64)
    torch.save(ckpt, tmp_path / "model.pth.tar-1")
    prompts = load_vpt_checkpoint(tmp_path / "model.pth.tar-1", 4, 2, 64)
    assert torch.equal(prompts[2], ckpt["state_dict"]["image_encoder.transformer.resblocks.2.VPT_shallow"])
    with pytest.raises(ValueError, match="resblocks.4.VPT_shallow"):
        load_vpt_checkpoint(tmp_path / "model.pth.tar-1", 5, 2, 64)
    # their reset discards loaded prompts (the default); keep_loaded_prompts starts from them
    discarded = shiftlab.create_method("tapt", vit, CLASSNAMES, align=False, prompts=str(tmp_path / "model.pth.tar-1"))
    kept = shiftlab.create_method("tapt", vit, CLASSNAMES, align=False, prompts=str(tmp_path / "model.pth.tar-1"),
                                  keep_loaded_prompts=True)
    drawn = shiftlab.create_method("tapt", vit, CLASSNAMES, align=False)
    assert torch.equal(discarded.initial, drawn.initial) and torch.equal(kept.initial, prompts)
    assert set(kept.loaded_weights()) == {"prompts_sha256"}


def test_a_statistics_file_that_is_not_one_is_refused_in_one_line(tmp_path):
    (tmp_path / "garbage.pt").write_bytes(b"garbage")
    import argparse
    torch.save(argparse.Namespace(lr=0.1), tmp_path / "object.pt")
    for name in ("garbage", "object"):
        with pytest.raises(ValueError, match=rf"token statistics file .*{name}.pt cannot be read as a torch file"):
            load_statistics(tmp_path / f"{name}.pt", 4, 19, 64)


def test_a_prompt_checkpoint_holding_python_objects_is_not_unpickled_unless_trusted(vit, tmp_path):
    # a pickle beyond plain tensors can run code when loaded: refused as the run's own checkpoint is, unless
    # --trust-checkpoint (trust_checkpoint=True); nothing in it is run to say so
    import argparse
    ckpt = _driver().stand_in_checkpoint(4, 2, 64)
    torch.save({**ckpt, "args": argparse.Namespace(lr=0.1)}, tmp_path / "model.pth.tar-1")
    (tmp_path / "garbage.pth").write_bytes(b"PK\x03\x04 not a zip")
    path = str(tmp_path / "model.pth.tar-1")
    with pytest.raises(ValueError, match=r"model.pth.tar-1: untrusted pickle.*argparse.Namespace.*"
                                         r"pass trust_checkpoint=True if you trust this file"):
        shiftlab.create_method("tapt", vit, CLASSNAMES, align=False, prompts=path)
    with pytest.raises(ValueError, match=r"garbage.pth: corrupt checkpoint: not a readable PyTorch checkpoint"):
        shiftlab.create_method("tapt", vit, CLASSNAMES, align=False, prompts=str(tmp_path / "garbage.pth"))
    trusted = shiftlab.create_method("tapt", vit, CLASSNAMES, align=False, prompts=path, keep_loaded_prompts=True,
                                     trust_checkpoint=True)
    assert torch.equal(trusted.initial[1], ckpt["state_dict"]["image_encoder.transformer.resblocks.1.VPT_shallow"])


@pytest.mark.parametrize("content", [b"\xff not a torch file", b""], ids=["garbage", "empty"])
def test_a_statistics_or_prompt_file_that_is_no_torch_file_is_one_line(tmp_path, content):
    """Such a file used to end in torch.load's traceback (UnpicklingError, EOFError) and its page of advice."""
    path = tmp_path / "V_means.pt"
    path.write_bytes(content)
    for load, says in ((lambda: load_statistics(path, 4, 19, 64), "cannot be read as a torch file"),
                       (lambda: load_vpt_checkpoint(path, 4, 2, 64), "corrupt checkpoint")):
        with pytest.raises(ValueError) as info:
            load()
        msg = str(info.value)
        assert "\n" not in msg and str(path) in msg and says in msg


def test_refusals_in_one_line(vit, tiny_model, tmp_path):
    with pytest.raises(ValueError, match="set means_adv, vars_adv, means_clean, vars_clean") as info:
        shiftlab.create_method("tapt", vit, CLASSNAMES, align_layer_to=4)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="range\\(from, to - 1\\) inside the tower's 4"):   # ViT-B's 9 on 4 blocks
        shiftlab.create_method("tapt", vit, CLASSNAMES, **_write_statistics(tmp_path, 4, 19, 64))
    with pytest.raises(ValueError, match="ViT image tower only"):
        shiftlab.create_method("tapt", tiny_model, CLASSNAMES, align=False)
    tapt = shiftlab.create_method("tapt", vit, CLASSNAMES, align=False)
    with pytest.raises(ValueError, match="pixels"):
        tapt.predict_context(SampleContext(vit, tapt.heads, None, image_features=torch.zeros(1, 32)))


def test_resnet_is_refused_before_torch():
    import subprocess
    import sys
    code = ("import sys; from shiftlab.methods.catalogue.declarations import spec, tower_problem; "
            "print(tower_problem(spec('tapt'), 'resnet', 'RN50')); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0].startswith("tapt: runs on a ViT image tower only, and RN50 is a ResNet") and out[1] == "False"


# -- the method: its steps, and its adaptive prediction ---------------------------------------------------------

def test_tuning_moves_the_prompts_and_the_adaptive_prediction_is_the_methods(vit, tmp_path):
    paths = _write_statistics(tmp_path, 4, 19, 64)
    tapt = shiftlab.create_method("tapt", vit, CLASSNAMES, views=8, align_layer_to=5, lr=1e-2, **paths)
    views01 = torch.rand(8, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    prompts, losses = tapt.tune(vit.normalize(views01))
    assert len(losses) == 1 and not torch.allclose(prompts, tapt.initial)
    from shiftlab.methods.tapt.adaptive import tapt_logits
    x = views01.unsqueeze(0).requires_grad_(True)
    got = tapt_logits(tapt, x)[0]
    assert_close(got, tapt.predict(vit.normalize(views01)), 2e-3, "adaptive vs method")
    (grad,) = torch.autograd.grad(got.logsumexp(-1), x)
    assert grad.abs().sum() > 0


# -- golden: their tapt() on the tiny ViT -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def tapt_golden(golden_dir, golden_vit):
    return golden_vit, json.loads((golden_dir / "tapt" / "tapt.json").read_text())


@pytest.mark.golden
@pytest.mark.parametrize("variant", ["tapt", "tapt_steps"])
def test_tuned_prompts_losses_and_logits_match_their_tapt(tapt_golden, golden_dir, variant, tmp_path):
    (model, names, heads), info = tapt_golden
    meta = info["fixtures"][variant]
    c = meta["config"]
    want = torch.load(golden_dir / "tapt" / f"{variant}.pt", weights_only=True)
    paths = _write_statistics(tmp_path, 4, 19, 64)
    torch.save(_driver().stand_in_checkpoint(want["loaded"].shape[0], c["N_CTX_VISION"], 64), tmp_path / "ckpt.pt")
    tapt = shiftlab.create_method(
        "tapt", model, names, heads=heads, views=meta["n_views"], lr=c["LR"], steps=c["TTA_STEPS"],
        n_ctx=c["N_CTX_VISION"], depth=c["PROMPT_DEPTH_VISION"], selection_ratio=c["TAPT_THRESHOLD"],
        align_ratio=c["ALIGN_THRESHOLD"], align_layer_from=c["ALIGN_LAYER_FROM"], align_layer_to=c["ALIGN_LAYER_TO"],
        align_weight=c["DISTR_LOSS_W"], align_type=c["ALIGN_TYPE"], prompts=str(tmp_path / "ckpt.pt"), **paths)
    assert torch.equal(tapt.loaded, want["loaded"])      # their load_model read the same checkpoint
    assert not torch.equal(want["initial"], want["loaded"])   # and their reset discarded it
    tapt.set_initial_prompts(want["initial"])
    views = stream_views(golden_dir, meta["n_views"])
    tol = PARAMS + c["LR"] * 1e-3 * c["TTA_STEPS"]
    for i in range(meta["n_samples"]):
        x = model.normalize(views[i])
        with torch.no_grad():
            logits, _ = tapt.forward(x, tapt.initial)
        assert_close(logits, want[f"{i}/view_logits"], LOGITS, f"{variant} {i}: view logits")
        prompts, losses = tapt.tune(x)
        for got, theirs in zip(losses, want[f"{i}/losses"].tolist(), strict=True):
            assert abs(got - theirs) <= LOSS * max(1.0, abs(theirs)), (variant, i, losses, want[f"{i}/losses"])
        assert_close(prompts, want[f"{i}/tuned"], tol, f"{variant} {i}: tuned prompts")
        assert_close(tapt.predict(x), want[f"{i}/logits"], TUNED_LOGITS, f"{variant} {i}: logits")


def test_statistics_computed_from_images_load_back_as_their_files(vit, tmp_path):
    from shiftlab.methods.tapt.method import save_statistics
    tapt = shiftlab.create_method("tapt", vit, CLASSNAMES, align=False)
    images = [vit.normalize(torch.rand(n, 3, 64, 64, generator=torch.Generator().manual_seed(n))) for n in (3, 2)]
    stats = tapt.token_statistics(images)
    inputs = prompted_forward(vit.clip.visual, torch.cat(images), tapt.initial).block_inputs
    whole = torch.stack(inputs, dim=1)
    assert_close(stats.means, whole.mean(0), 1e-5, "means") and assert_close(stats.vars, whole.var(0), 1e-5, "vars")
    for variant in ("adv", "clean"):
        save_statistics(stats, tmp_path, "tinyvit", variant)
    files = {f: str(tmp_path / f"V_{f.split('_')[0]}_tinyvit_train_{f.split('_')[1]}.pt") for f in STATISTICS}
    aligned = shiftlab.create_method("tapt", vit, CLASSNAMES, align_layer_to=5, **files)
    assert torch.equal(aligned.targets["clean"].vars, stats.vars.float())
    assert set(aligned.loaded_weights()) == {f"{f}_sha256" for f in STATISTICS}


@pytest.mark.slow
def test_adaptive_gradient_through_the_prompt_steps_matches_finite_differences(vit, tmp_path, monkeypatch):
    """Two AdamW steps of the prompts (lr 5e-2): the autograd gradient of the tuned prediction's loss along a random
    direction agrees with central differences (h 1e-2 and 3e-3: small enough that no view changes rank, so the bpda
    selection is the same on both sides), and differs clearly from the gradient that ignores the prompts' update.
    Measured: autograd -0.00152, differences -0.00150 and -0.00147, without the update -0.00091 (the update carries
    ~40% of the gradient)."""
    from shiftlab.methods.common import prompt_tuning_adaptive
    from shiftlab.methods.tapt import adaptive
    paths = _write_statistics(tmp_path, 4, 19, 64)
    tapt = shiftlab.create_method("tapt", vit, ["cat", "dog", "car", "tree", "boat", "house"], views=8,
                                  align_layer_to=5, lr=5e-2, steps=2, **paths)
    x = torch.rand(1, 8, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([int(tapt.predict(vit.normalize(x[0])).topk(2).indices[1])])     # the runner-up

    def loss(z: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(adaptive.tapt_logits(tapt, z), y)
    v = torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
    v /= v.norm()
    xg = x.clone().requires_grad_(True)
    full = float((torch.autograd.grad(loss(xg), xg)[0] * v).sum())
    with torch.no_grad():
        central = [float((loss(x + h * v) - loss(x - h * v)) / (2 * h)) for h in (1e-2, 3e-3)]
    step = prompt_tuning_adaptive.adamw_step
    monkeypatch.setattr(adaptive, "adamw_step", lambda p, g, *a, **k: step(p, g.detach(), *a, **k))
    xg = x.clone().requires_grad_(True)
    direct = float((torch.autograd.grad(loss(xg), xg)[0] * v).sum())
    for fd in central:
        assert abs(fd - full) <= 0.1 * abs(full), (fd, full, direct)
        assert abs(fd - direct) >= 0.25 * abs(full), (fd, full, direct)

"""PromptAlign: MaPLe's text tower with deep prompts against open_clip's own, the checkpoint and statistics files in
their published formats, the loss written out, its refusals, the adaptive prediction, and its authors' own code on
the golden tiny ViT (tests/fixtures/golden/promptalign, made by the driver beside the fixtures from
github.com/jameelhassan/PromptAlign's `PromptAlign.tpt()`, float32 on the CPU).

Golden tolerances (tests/_golden.py): the view logits LOGITS; each step's loss and its two terms LOSS relative; the
tuned prompts PARAMS plus lr x 1e-3 per step (a first AdamW step moves each entry by ~lr x sign(grad): an entry whose
gradient is ~0 can take the other sign on another machine); the final logits TUNED_LOGITS.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import shiftlab
from _golden import LOGITS, LOSS, PARAMS, TUNED_LOGITS, assert_close, stream_views
from shiftlab.methods.common.confidence import marginal_entropy_as_tpt
from shiftlab.methods.common.deep_visual_prompts import view_statistics
from shiftlab.methods.common.maple_prompts import MaPLePrompts, MaPLeText, load_maple_checkpoint
from shiftlab.methods.context import SampleContext
from shiftlab.methods.promptalign.method import align_loss

CLASSNAMES = ["cat", "dog", "car"]
pytestmark = pytest.mark.usefixtures("one_thread")
DRIVER = Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "promptalign" / "driver.py"


def _driver():
    spec = importlib.util.spec_from_file_location("promptalign_driver", DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _files(tmp: Path, n_classes: int = 3) -> dict[str, str]:
    """The stand-in statistics and MaPLe checkpoint the driver gave their code, for the tiny ViT (4 blocks, 19
    tokens with 2 prompts, widths 64)."""
    driver = _driver()
    for name, value in driver.stand_in_statistics(4, 19, 64).items():
        torch.save(value, tmp / f"ImgNetpre_vis_{name}.pt")
    torch.save(driver.stand_in_checkpoint(2, 64, 64, n_classes), tmp / "model.pth.tar-2")
    return {"means": str(tmp / "ImgNetpre_vis_means.pt"), "vars": str(tmp / "ImgNetpre_vis_vars.pt"),
            "prompts": str(tmp / "model.pth.tar-2")}


@pytest.fixture(scope="module")
def vit():
    from shiftlab.synthetic import tiny_vit
    return tiny_vit(0)


def test_text_tower_with_deep_prompts_by_hand(vit):
    """Without deep prompts and with the words' own context, the class features are open_clip's encode_text of
    "a photo of a {name}."; a deep prompt replaces the context tokens at block 1's input (written out)."""
    clip = vit.clip
    text = MaPLeText(clip, CLASSNAMES, 2, "a photo of a")
    plain = text.features(text.init_ctx, torch.zeros(0, 2, 64))
    import open_clip
    with torch.no_grad():
        want = clip.encode_text(open_clip.tokenize([f"a photo of a {c}." for c in CLASSNAMES]))
    assert_close(plain, want, 1e-5, "no deep prompts = encode_text")
    deep = torch.randn(1, 2, 64, generator=torch.Generator().manual_seed(0))
    got = text.features(text.init_ctx, deep)
    x = torch.cat([text.prefix, text.init_ctx.expand(3, -1, -1), text.suffix], 1)
    x = x + clip.positional_embedding[:text.length]
    mask = clip.attn_mask[:text.length, :text.length]
    x = clip.transformer.resblocks[0](x, attn_mask=mask)
    x = torch.cat([x[:, :1], deep[0].expand(3, -1, -1), x[:, 3:]], 1)
    x = clip.ln_final(clip.transformer.resblocks[1](x, attn_mask=mask))
    assert_close(got, x[torch.arange(3), text.eot] @ clip.text_projection, 1e-5, "deep prompt at block 1")
    assert not torch.allclose(got, plain, atol=1e-3)


def test_a_maple_checkpoint_holding_python_objects_is_not_unpickled_unless_trusted(vit, tmp_path):
    import argparse
    files = _files(tmp_path)
    state = torch.load(files["prompts"], weights_only=True)
    torch.save({**state, "args": argparse.Namespace(lr=0.1)}, files["prompts"])
    with pytest.raises(ValueError, match=r"model.pth.tar-2: untrusted pickle.*argparse.Namespace"):
        shiftlab.create_method("promptalign", vit, CLASSNAMES, **files)
    method = shiftlab.create_method("promptalign", vit, CLASSNAMES, trust_checkpoint=True, **files)
    assert torch.equal(method.initial.ctx, state["state_dict"]["prompt_learner.ctx"])


def test_checkpoint_statistics_and_loss_in_their_formats(vit, tmp_path):
    files = _files(tmp_path)
    ckpt = torch.load(files["prompts"], weights_only=False)["state_dict"]
    prompts = load_maple_checkpoint(files["prompts"], 3, 2, 64, 64)
    assert torch.equal(prompts.deep_weight[1], ckpt["prompt_learner.compound_prompt_projections.1.weight"])
    visual = prompts.visual()
    assert_close(visual[0], ckpt["prompt_learner.ctx"] @ ckpt["prompt_learner.proj.weight"].T
                 + ckpt["prompt_learner.proj.bias"], 1e-6, "shallow visual prompt")
    assert visual.shape == (3, 2, 64)
    shallow = load_maple_checkpoint(files["prompts"], 1, 2, 64, 64)      # MaPLe's J=1: the shallow prompt alone
    assert shallow.deep_text.shape == (0, 2, 64) and torch.equal(shallow.visual(), visual[:1])
    with pytest.raises(ValueError, match="has no prompt_learner.compound_prompts_text.8 .*depth >= 10"):
        load_maple_checkpoint(files["prompts"], 10, 2, 64, 64)
    with pytest.raises(ValueError, match=r"ctx is \(2, 64\), this model needs \(4, 64\)"):
        load_maple_checkpoint(files["prompts"], 3, 4, 64, 64)
    with pytest.raises(ValueError, match="does not exist"):
        load_maple_checkpoint(tmp_path / "nope", 3, 2, 64, 64)
    method = shiftlab.create_method("promptalign", vit, CLASSNAMES, **files)
    assert set(method.loaded_weights()) == {"means_sha256", "vars_sha256", "prompts_sha256"}
    gen = torch.Generator().manual_seed(2)
    means, variances = torch.randn(4, 3, 2, generator=gen), torch.rand(4, 3, 2, generator=gen)
    tm, tv = torch.randn(4, 3, 2, generator=gen), torch.rand(4, 3, 2, generator=gen)
    want = sum(0.5 * (means[i] - tm[i]).abs().mean() + 0.5 * (variances[i] - tv[i]).abs().mean() for i in (1, 2))
    assert_close(align_loss(means, variances, tm, tv, range(1, 3)), want, 1e-6, "l1")


def test_without_a_checkpoint_their_untrained_learner(vit):
    """No checkpoint: the learner as their code builds it (load_model skipped): the words' context, seeded draws."""
    a = shiftlab.create_method("promptalign", vit, CLASSNAMES, align=False)
    b = shiftlab.create_method("promptalign", vit, CLASSNAMES, align=False, seed=2)
    assert torch.equal(a.initial.ctx, a.text.init_ctx) and torch.equal(a.initial.ctx, b.initial.ctx)
    assert not torch.equal(a.initial.deep_text, b.initial.deep_text)
    bound = 1 / 64 ** 0.5
    assert float(a.initial.proj_weight.abs().max()) <= bound and a.initial.deep_text.shape == (2, 2, 64)
    assert a.loaded_weights() == {}


def test_refusals_in_one_line(vit, tiny_model, tmp_path):
    with pytest.raises(ValueError, match="set means and vars") as info:
        shiftlab.create_method("promptalign", vit, CLASSNAMES)
    assert "\n" not in str(info.value)
    files = _files(tmp_path)
    with pytest.raises(ValueError, match="range\\(from, to - 1\\) inside the tower's 4"):
        shiftlab.create_method("promptalign", vit, CLASSNAMES, align_layer_to=6, **files)
    with pytest.raises(ValueError, match="ViT image tower only"):
        shiftlab.create_method("promptalign", tiny_model, CLASSNAMES, align=False)
    method = shiftlab.create_method("promptalign", vit, CLASSNAMES, align=False)
    with pytest.raises(ValueError, match="pixels"):
        method.predict_context(SampleContext(vit, method.heads, None, image_features=torch.zeros(1, 32)))


def test_a_maple_checkpoint_that_is_no_torch_file_is_one_line(tmp_path):
    """It used to end in torch.load's traceback (UnpicklingError)."""
    path = tmp_path / "model.pth.tar-2"
    path.write_bytes(b"\xff not a torch file")
    with pytest.raises(ValueError) as info:
        load_maple_checkpoint(path, 3, 2, 32, 64)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg and "corrupt checkpoint" in msg


def test_resnet_is_refused_before_torch():
    import subprocess
    import sys
    code = ("import sys; from shiftlab.methods.catalogue.declarations import spec, tower_problem; "
            "print(tower_problem(spec('promptalign'), 'resnet', 'RN50')); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0].startswith("promptalign: runs on a ViT image tower only, and RN50 is a ResNet") and out[1] == "False"


def test_tuning_moves_every_prompt_and_the_adaptive_prediction_is_the_methods(vit, tmp_path):
    method = shiftlab.create_method("promptalign", vit, CLASSNAMES, views=8, lr=1e-2, **_files(tmp_path))
    views01 = torch.rand(8, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    prompts, losses = method.tune(vit.normalize(views01))
    assert len(losses) == 1
    assert all(not torch.allclose(t, t0) for t, t0 in zip(prompts, method.initial, strict=True))
    from shiftlab.methods.promptalign.adaptive import promptalign_logits
    x = views01.unsqueeze(0).requires_grad_(True)
    got = promptalign_logits(method, x)[0]
    assert_close(got, method.predict(vit.normalize(views01)), 2e-3, "adaptive vs method")
    (grad,) = torch.autograd.grad(got.logsumexp(-1), x)
    assert grad.abs().sum() > 0
    # no step: MaPLe's prediction with the loaded prompts
    frozen = shiftlab.create_method("promptalign", vit, CLASSNAMES, views=8, steps=0, **_files(tmp_path))
    with torch.no_grad():
        zero_shot = frozen.forward(vit.normalize(views01[:1]), frozen.initial)[0][0]
    assert torch.equal(frozen.predict(vit.normalize(views01)), zero_shot)


# -- golden: their tpt() on the tiny ViT ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def golden(golden_dir, golden_vit):
    return golden_vit, json.loads((golden_dir / "promptalign" / "promptalign.json").read_text())


@pytest.mark.golden
@pytest.mark.parametrize("variant", ["promptalign", "promptalign_steps"])
def test_view_logits_losses_prompts_and_logits_match_their_tpt(golden, golden_dir, variant, tmp_path):
    (model, names, heads), info = golden
    meta = info["fixtures"][variant]
    c = meta["config"]
    want = torch.load(golden_dir / "promptalign" / f"{variant}.pt", weights_only=True)
    method = shiftlab.create_method(
        "promptalign", model, names, heads=heads, views=meta["n_views"], lr=c["LR"], steps=c["TTA_STEPS"],
        n_ctx=c["N_CTX"], ctx_init=c["CTX_INIT"], depth=c["PROMPT_DEPTH"], selection_ratio=c["TPT_THRESHOLD"],
        align_ratio=c["ALIGN_THRESHOLD"], align_layer_from=c["ALIGN_LAYER_FROM"], align_layer_to=c["ALIGN_LAYER_TO"],
        align_weight=c["DISTR_LOSS_W"], **_files(tmp_path, len(names)))
    fields = MaPLePrompts._fields
    for f in fields:     # their load_model read the same checkpoint (the first depth - 1 of its 8 deep prompts)
        assert torch.equal(getattr(method.initial, f), want[f"loaded/{f}"]), f
    views = stream_views(golden_dir, meta["n_views"])
    tol = PARAMS + c["LR"] * 1e-3 * c["TTA_STEPS"]
    weight = c["DISTR_LOSS_W"] / (c["ALIGN_LAYER_TO"] - c["ALIGN_LAYER_FROM"])
    for i in range(meta["n_samples"]):
        x = model.normalize(views[i])
        with torch.no_grad():
            logits, inputs = method.forward(x, method.initial)
            entropy_views, align_views = method.select(logits)
            means, variances = view_statistics(inputs, align_views)
            terms = (float(marginal_entropy_as_tpt(logits[entropy_views])),
                     float(align_loss(means, variances, *method.targets,
                                      range(c["ALIGN_LAYER_FROM"], c["ALIGN_LAYER_TO"] - 1))))
        assert_close(logits, want[f"{i}/view_logits"], LOGITS, f"{variant} {i}: view logits")
        for got, theirs in zip(terms, (want[f"{i}/entropy"][0], want[f"{i}/align"][0]), strict=True):
            assert abs(got - float(theirs)) <= LOSS * max(1.0, abs(float(theirs))), (variant, i, terms)
        prompts, losses = method.tune(x)
        assert abs(losses[0] - (terms[0] + weight * terms[1])) <= LOSS * max(1.0, losses[0])
        for got, theirs in zip(losses, want[f"{i}/losses"].tolist(), strict=True):
            assert abs(got - theirs) <= LOSS * max(1.0, abs(theirs)), (variant, i, losses, want[f"{i}/losses"])
        for f in fields:
            assert_close(getattr(prompts, f), want[f"{i}/tuned/{f}"], tol, f"{variant} {i}: tuned {f}")
        assert_close(method.predict(x), want[f"{i}/logits"], TUNED_LOGITS, f"{variant} {i}: logits")

"""RLCF beyond the golden comparison (tests/test_golden_rlcf.py): episodic reset, the reward model (loaded
once, its inputs, its weights in the run identity), refusals, and the CLI's --set of the reward model."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _synthetic import make_imagenet_r
from shiftlab.cli import main as cli_main
from shiftlab.methods.base import effective_config, get_method_class
from shiftlab.methods.protocols import protocol_overrides
from shiftlab.methods.rlcf.method import RLCF, reward_baseline
from shiftlab.models import ClipModel, ModelLoadError, Preprocess
from shiftlab.synthetic import tiny_clip

NAMES = shiftlab.classnames("imagenet-r")[:12]
TINY_REWARD = {"reward_model": "shiftlab-tiny", "reward_pretrained": "none", "reward_seed": 1}


def _views(model, seed, n=16):
    gen = torch.Generator().manual_seed(seed)
    return model.normalize(torch.rand(n, 3, model.image_size, model.image_size, generator=gen))


@pytest.fixture(scope="module")
def rlcf(tiny_model):
    return shiftlab.create_method("rlcf", tiny_model, NAMES, views=16, **TINY_REWARD)


def test_each_image_starts_from_the_initial_prompt(rlcf, tiny_model):
    a, b = _views(tiny_model, 0), _views(tiny_model, 1)
    first = rlcf.predict(a)
    other = rlcf.predict(b)
    assert not torch.allclose(first, other)
    torch.testing.assert_close(rlcf.predict(a), first, rtol=0, atol=0)
    # and the prompt does move within an image: tuning changes the zero-shot logits of the initial prompt
    untuned = shiftlab.create_method("rlcf", tiny_model, NAMES, views=16, steps=0, **TINY_REWARD).predict(a)
    assert (first - untuned).abs().max() > 1e-4


def test_the_reward_model_is_loaded_once_and_is_frozen(rlcf, tiny_model):
    again = shiftlab.create_method("rlcf", tiny_model, NAMES, **TINY_REWARD)
    assert again.reward is rlcf.reward and again.reward is not tiny_model
    assert not any(p.requires_grad for p in again.reward.parameters()) and not again.reward.clip.training
    other = shiftlab.create_method("rlcf", tiny_model, NAMES, **{**TINY_REWARD, "reward_seed": 2})
    assert other.reward is not rlcf.reward
    assert other.loaded_weights()["reward_weights_sha256"] != rlcf.loaded_weights()["reward_weights_sha256"]


def test_the_reward_prompts_are_the_students_prompts(rlcf, tiny_model):
    assert rlcf.reward_prompt == "a photo of a {}."
    words = shiftlab.create_method("rlcf", tiny_model, NAMES, ctx_init=None, n_ctx=3, **TINY_REWARD)
    assert words.reward_prompt == "X X X {}."          # their random-init prefix, read by the reward model too


def test_the_reward_model_sees_the_same_pixels_at_its_own_size_and_normalisation(rlcf, tiny_model):
    # a reward model at 96 px with another mean/std: the student's normalised views are turned into its input
    clip = tiny_model.clip
    other = ClipModel(clip, "reward", None, Preprocess(96, mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3)))
    method = shiftlab.create_method("rlcf", tiny_model, NAMES, **TINY_REWARD)
    method.reward = other
    x01 = torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    got = method.reward_inputs(tiny_model.normalize(x01))
    want = other.normalize(F.interpolate(x01, size=96, mode="bicubic", align_corners=True))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    same = shiftlab.create_method("rlcf", tiny_model, NAMES, **TINY_REWARD)
    views = tiny_model.normalize(x01)
    assert same.reward_inputs(views) is views          # one size, one normalisation: passed as they are


def test_reward_baselines():
    scores = torch.tensor([[[0.2, 0.5, 0.0], [0.4, 0.4, 0.1]]])            # (B=1, V=2, K=3)
    torch.testing.assert_close(reward_baseline(scores, "view", False), scores - scores.mean(-1, keepdim=True))
    flat = scores.flatten(1)
    torch.testing.assert_close(reward_baseline(scores, "batch", True).flatten(1),
                               (flat - flat.mean()) / (flat.std() + 1e-5))
    assert torch.equal(reward_baseline(scores, "none", True), scores)
    one = scores[..., :1]
    assert torch.equal(reward_baseline(one, "view", True), one)           # one class per view: no baseline


def test_refusals_are_one_line(tiny_model, tmp_path):
    with pytest.raises(ModelLoadError, match=r"^unknown model 'ViT-Q-99'") as info:
        shiftlab.create_method("rlcf", tiny_model, NAMES, reward_model="ViT-Q-99")
    assert "\n" not in str(info.value)
    with pytest.raises(ModelLoadError, match="does not exist"):
        shiftlab.create_method("rlcf", tiny_model, NAMES, reward_model="shiftlab-tiny",
                               reward_pretrained=str(tmp_path / "missing.pt"))
    with pytest.raises(ValueError, match=r"^rlcf.sample_k: 20 classes sampled per view, but there are only 12"):
        shiftlab.create_method("rlcf", tiny_model, NAMES, sample_k=20, **TINY_REWARD)
    for bad, match in (({"sample_k": 0}, "rlcf.sample_k: 0 is out of range"),
                       ({"clipscore_weight": 0.0}, "rlcf.clipscore_weight: 0.0 is out of range"),
                       ({"reward_baseline": "mean"}, "rlcf.reward_baseline: 'mean' is not a choice; must be one of")):
        with pytest.raises(ValueError, match=match):
            shiftlab.create_method("rlcf", tiny_model, NAMES, **{**TINY_REWARD, **bad})


def test_the_paper_recipe_per_dataset_is_the_authors_scripts():
    assert get_method_class("rlcf") is RLCF
    assert protocol_overrides("paper", RLCF) == RLCF.protocols["paper"]
    assert RLCF.dataset_settings["dtd"] == {"steps": 5, "views": {"augmix": True}}
    fine, r = effective_config("rlcf", "paper", "dtd"), effective_config("rlcf", "paper", "imagenet-r")
    assert (fine.steps, fine.views.augmix, fine.precision) == (5, True, "fp16")
    assert (r.steps, r.views.augmix, r.precision) == (3, False, "fp16")
    assert RLCF.published == ()


# -- through the CLI: --set of the reward model, run.json, resume ------------------------------------------

def _save_reward(path, seed):
    torch.save(tiny_clip(seed).clip.state_dict(), path)      # OpenAI's key layout, as a checkpoint file
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_cli_sets_the_reward_model_records_its_checkpoint_and_refuses_another_on_resume(tmp_path, tiny_checkpoint,
                                                                                         capsys):
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 50), per_class=1, size=(80, 64))
    reward = tmp_path / "reward.pt"
    sha = _save_reward(reward, seed=1)
    out = tmp_path / "run"
    flags = ["run", "--dataset", "imagenet-r", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained",
             str(tiny_checkpoint), "--methods", "zeroshot,rlcf", "--views", "8", "--workers", "0", "--no-progress",
             "--allow-partial", "--limit", "2", "--out", str(out),
             "--set", "rlcf.reward_model=shiftlab-tiny", "--set", f"rlcf.reward_pretrained={reward}"]
    assert cli_main(flags) == 0
    ident = json.loads((out / "run.json").read_text())["methods"]["rlcf"]
    assert (ident["reward_model"], ident["reward_pretrained"]) == ("shiftlab-tiny", str(reward))
    assert ident["reward_checkpoint_sha256"] == sha and ident["reward_weights_sha256"] is None
    recs = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert sorted(r["method"] for r in recs) == ["rlcf", "rlcf", "zeroshot", "zeroshot"]
    capsys.readouterr()
    # the same settings, other weights in the same file: refused, naming the reward checkpoint
    other = _save_reward(reward, seed=2)
    assert other != sha
    assert cli_main([*flags, "--resume", "--limit", "4"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "warning:" not in line]   # (the partial dataset)
    assert len(err) == 1 and "rlcf: reward_checkpoint_sha256" in err[0] and sha[:12] in err[0] and other[:12] in err[0]
    # a reward model that cannot be loaded: one line, before any work (no run directory)
    fresh = tmp_path / "fresh"
    bad = [*flags[:-4], "--out", str(fresh), "--set", "rlcf.reward_model=shiftlab-tiny",
           "--set", f"rlcf.reward_pretrained={tmp_path / 'nowhere.pt'}"]
    assert cli_main(bad) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if "warning:" not in line]
    assert len(err) == 1 and err[0].startswith("shiftlab run: error: rlcf: its model shiftlab-tiny")
    assert "nowhere.pt does not exist" in err[0] and "--set rlcf.reward_pretrained=" in err[0]
    assert not fresh.exists()

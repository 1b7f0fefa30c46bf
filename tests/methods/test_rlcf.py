"""RLCF beyond the golden comparison (the golden checks below): episodic reset, the reward model (loaded
once, its inputs, its weights in the run identity), refusals, and the CLI's --set of the reward model.

Golden checks (marked `golden`): RLCF against the authors' own code (tests/fixtures/golden/online/rlcf.pt).

tools/golden/make_golden.py (driver tests/fixtures/golden/rlcf/driver.py) ran mzhaoshuai/RLCF's
`tpt_cls_rl.test_time_adapt_eval` float32 on the CPU with the golden tiny CLIP as the student and a
second tiny CLIP (a ViT at 96 px, random weights, stored in the fixture as `reward/*`) as the reward
model, 64 views per sample: pass `authors` (rlcf-prompt.sh's ImageNet settings: 3 steps, top-3, the
view baseline) on samples 0-3 and pass `batch` (`--process_batch 1 --reward_amplify 1`, top-5, 2 steps)
on samples 4-5. shiftlab runs the same views through `create_method("rlcf", ...).predict` and must give
every recorded value: the reward model's class and view features, the selected views, per step the
selected views' logits, the sampled classes, their CLIP scores and rewards, the loss, the prompt's
gradient and value, then the final logits.

Discrete values are compared exactly after a margin check (tests/_golden.py): the selected views as a
set (their order inside the set changes nothing: per-view values are compared view by view), the
sampled classes of each view as a set (each (view, class) pair's score and reward are compared pair by
pair; the loss is a mean over pairs)."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

import shiftlab
from _golden import (
    FEATURES,
    GRAD_RTOL,
    LOGITS,
    LOSS,
    PARAMS,
    TUNED_LOGITS,
    assert_close,
    assert_selection_margin,
    assert_top1_margin,
    check_margin,
    entropy_tolerance,
    full_state_dict,
    online_fixture,
    stream_views,
)
from _synthetic import make_imagenet_r
from shiftlab.cli import main as cli_main
from shiftlab.methods.base import effective_config, get_method_class
from shiftlab.methods.catalogue.protocols import protocol_overrides
from shiftlab.methods.common.confidence import entropy, n_selected
from shiftlab.methods.rlcf.method import RLCF, reward_baseline
from shiftlab.models import ClipModel, ModelLoadError, Preprocess, register_architecture
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
    assert protocol_overrides("paper", RLCF) == RLCF.spec.protocols["paper"]
    assert RLCF.spec.dataset_values["dtd"] == {"steps": 5, "views": {"augmix": True}}
    fine, r = effective_config("rlcf", "paper", "dtd"), effective_config("rlcf", "paper", "imagenet-r")
    assert (fine.steps, fine.views.augmix, fine.precision) == (5, True, "fp16")
    assert (r.steps, r.views.augmix, r.precision) == (3, False, "fp16")
    assert RLCF.spec.published == ()


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


# -- golden checks: the authors' code --------------------------------------------------------------------------

PASSES = {"authors": {}, "batch": {"reward_baseline": "batch", "reward_std": True}}
# the standardised rewards of pass `batch` divide CLIP-score differences by their std (~0.1 here), so their
# FEATURES-sized noise grows by as much; compared relative to their largest entry, as gradients are, and the
# loss (a mean of reward x cross-entropy) with LOSS after the same division
REWARDS_RTOL = GRAD_RTOL


@pytest.fixture(scope="module")
def fixture(golden_dir):
    return online_fixture(golden_dir, "rlcf")


@pytest.fixture(scope="module")
def reward_file(fixture, tmp_path_factory):
    """The reward CLIP as a checkpoint file in OpenAI's layout, its architecture registered under its name."""
    want, info = fixture
    spec = info["reward_model"]
    register_architecture(spec["name"], spec["config"])
    path = tmp_path_factory.mktemp("rlcf") / "reward_openai.pt"
    torch.save(full_state_dict({k[len("reward/"):]: v for k, v in want.items() if k.startswith("reward/")}), path)
    return spec["name"], str(path)


def assert_topk_margin(logits: torch.Tensor, k: int, tol: float, what: str) -> None:
    """Each row's top-k SET is the same within `tol` on every logit: k-th and (k+1)-th more than 2 tol apart."""
    top = logits.float().topk(k + 1, dim=-1).values
    gaps = top[..., k - 1] - top[..., k]
    check_margin(float(gaps.min()), tol, f"{what} (top-{k} vs the next class)")


def by_class(k: int, sampled: torch.Tensor, *values: torch.Tensor) -> list[torch.Tensor]:
    """Per view (rows of `k` classes), the sampled classes in ascending order and the values of the same
    pairs in that order."""
    sampled = sampled.reshape(-1, k)
    order = sampled.argsort(-1)
    return [sampled.gather(-1, order)] + [v.reshape(-1, k).gather(-1, order) for v in values]


class Recorder:
    """Wraps the method's own hooks to keep what each step computed (as the driver wraps theirs)."""

    def __init__(self, method):
        self.calls: dict[str, list] = {}
        self.method = method
        for name in ("on_selection", "rewards", "loss"):
            setattr(method, name, self._wrap(name, getattr(method, name)))
        self.hooks = [register_optimizer_step_pre_hook(
                          lambda opt, a, k: self._put("grad", opt.param_groups[0]["params"][0].grad[0])),
                      register_optimizer_step_post_hook(
                          lambda opt, a, k: self._put("ctx", opt.param_groups[0]["params"][0][0]))]

    def _put(self, key, value):
        self.calls.setdefault(key, []).append(value.detach().clone() if torch.is_tensor(value) else value)

    def _wrap(self, name, fn):
        def wrapped(*args):
            out = fn(*args)
            if name == "on_selection":
                self._put("selected", args[0][0])
                self._put("reward_image", self.method._reward_image[0])
            elif name == "rewards":
                self._put("step_logits", args[0][0])
                for key, value in zip(("sampled", "scores", "rewards"), out):
                    self._put(key, value[0])
            else:
                self._put("loss", out[0][0])
            return out
        return wrapped

    def close(self):
        for h in self.hooks:
            h.remove()


@pytest.mark.golden
@pytest.mark.usefixtures("one_thread")
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PASSES))
def test_rlcf_matches_the_authors_code_sample_by_sample(golden_model, golden_dir, fixture, reward_file, name):
    model, classnames = golden_model
    want, info = fixture
    flags = info["passes"][name]["flags"]
    arch, path = reward_file
    method = shiftlab.create_method(
        "rlcf", model, classnames, views=info["n_views"], reward_model=arch, reward_pretrained=path,
        steps=flags["tta_steps"], lr=flags["lr"], weight_decay=flags["weight_decay"],
        selection_ratio=flags["selection_p"], sample_k=flags["sample_k"], **PASSES[name])
    assert method.reward.image_size == 96 and model.image_size == 64    # the reward model resizes the views
    assert_close(method.reward_text, want[f"{name}/reward_text_features"], FEATURES, "reward model's class features")
    views_all = stream_views(golden_dir, info["n_views"])
    steps, k_classes = flags["tta_steps"], flags["sample_k"]
    worst: dict[str, float] = {}

    def track(key, got, ref, atol, what):
        worst[key] = max(worst.get(key, 0.0), assert_close(got, ref, atol, what))

    for i, sample in enumerate(want[f"{name}/samples"].tolist()):
        rec = Recorder(method)
        try:
            logits = method.predict(model.normalize(views_all[sample]))
        finally:
            rec.close()
        c = rec.calls
        p = f"{name}/{i}"
        # the selected views: a set, after the boundary check; per-view values then go view by view
        ref_views = want[f"{p}/view_logits"]
        k = n_selected(info["n_views"], flags["selection_p"])
        assert_selection_margin(entropy(ref_views), k, entropy_tolerance(ref_views), f"{p} selection")
        ref_sel = want[f"{p}/selected"].tolist()
        got_sel = c["selected"][0].tolist()
        assert sorted(got_sel) == sorted(ref_sel), p
        perm = torch.tensor([got_sel.index(v) for v in ref_sel])
        track("reward_image", c["reward_image"][0][perm], want[f"{p}/reward_image_features"], FEATURES,
              f"{p} reward model's features of the selected views")
        assert len(c["loss"]) == steps and len(c["grad"]) == steps
        for s in range(steps):
            q = f"{p}/{s}"
            ref_logits = ref_views[ref_sel] if s == 0 else want[f"{q}/selected_logits"]
            tol = LOGITS if s == 0 else TUNED_LOGITS   # later steps read the prompt the earlier ones tuned
            track("step_logits", c["step_logits"][s][perm], ref_logits, tol, f"{q} selected views' logits")
            assert_topk_margin(ref_logits, k_classes, tol, f"{q} sampling")
            got_cls, got_score, got_reward = by_class(k_classes, c["sampled"][s][perm], c["scores"][s][perm],
                                                      c["rewards"][s][perm])
            ref_cls, ref_score, ref_reward = by_class(k_classes, want[f"{q}/sampled"], want[f"{q}/clip_score"],
                                                      want[f"{q}/rewards"])
            assert torch.equal(got_cls, ref_cls), q
            track("clip_score", got_score, ref_score, FEATURES, f"{q} CLIP scores")
            if flags["reward_amplify"]:   # standardised: relative to the largest reward, the loss too
                scale = float(ref_reward.abs().max())
                track("rewards", got_reward / scale, ref_reward / scale, REWARDS_RTOL, f"{q} rewards (relative)")
            else:
                scale = 1.0
                track("rewards", got_reward, ref_reward, FEATURES, f"{q} rewards")
            track("loss", c["loss"][s] / scale, want[f"{q}/loss"] / scale, LOSS, f"{q} loss")
            gscale = float(want[f"{q}/grad"].abs().max())
            track("grad", c["grad"][s] / gscale, want[f"{q}/grad"] / gscale, GRAD_RTOL, f"{q} prompt gradient")
            track("ctx", c["ctx"][s], want[f"{q}/ctx"], PARAMS, f"{q} prompt after the step")
        track("logits", logits, want[f"{p}/logits"], TUNED_LOGITS, f"{p} final logits")
        assert_top1_margin(want[f"{p}/logits"], TUNED_LOGITS, f"{p} prediction")
        assert int(logits.argmax()) == int(want[f"{p}/logits"].argmax()), p
    print(f"rlcf golden ({name}): worst differences {worst}")

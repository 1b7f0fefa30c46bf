"""RLCF against the authors' own code (tests/fixtures/golden/online/rlcf.pt).

tools/golden/make_golden.py (driver tools/golden/driver_rlcf.py) ran mzhaoshuai/RLCF's
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
pair; the loss is a mean over pairs).
"""
from __future__ import annotations

import pytest
import torch
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
from shiftlab.methods.common.confidence import entropy, n_selected
from shiftlab.models import register_architecture

pytestmark = [pytest.mark.golden, pytest.mark.usefixtures("one_thread")]

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

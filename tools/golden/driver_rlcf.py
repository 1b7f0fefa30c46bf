"""The driver that runs RLCF's classification code (github.com/mzhaoshuai/RLCF, `TPT/tpt_cls_rl.py`) on two tiny CLIPs.

As drivers.py: their modules are imported from the checkout's `TPT/` folder and patched only from outside
(CPU, float32, model loading, an in-memory stream), and values are recorded by wrapping their functions,
their reward model's methods and the optimizer (global step hooks). The student is the golden tiny CLIP
(`--model`); the reward model is a second tiny CLIP (a ViT at 96 px, random weights of a fixed seed, in
OpenAI's key layout), built here with shiftlab's loader and handed to their `clip.load` as a file; its
weights are stored in the fixture compactly (tests/_golden.py `compact_state_dict`), with the token rows
of the prompts it encodes.

Two passes over the stream, each through their `test_time_adapt_eval` (episodic reset of the prompt and
of the optimizer before every sample, `test_time_tuning`, then the tuned prompt on view 0):
  * `authors/`: TPT/scripts/rlcf-prompt.sh's ImageNet settings (3 steps, lr 7e-3, weight decay 5e-4,
    top-3 sampling, reward minus the mean of each view's 3 rewards), samples 0-3;
  * `batch/`: the other branches of their reward processing (`--process_batch 1 --reward_amplify 1`,
    top-5, 2 steps), samples 4-5.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
from pathlib import Path

import torch
from drivers import (
    all_tokens,
    clip_normalize,
    cpu_float32,
    enter,
    jit_load_reads_state_dicts,
    record_tokens,
    unit_views,
)

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
import _golden as G  # noqa: E402

N_VIEWS = 64          # rlcf-prompt.sh: batch_size=64 (63 augmented views + the original)
REWARD_NAME = "rlcf-golden-reward"
REWARD_SEED = 11
# a second tiny CLIP of another kind and size: a ViT (the student is a ResNet) at 96 px, so that their
# reward model resizes the 64 px views (clip_reward.py extract_image_features); text width 64 (their
# build_model sets heads = width // 64)
REWARD_CONFIG = {"embed_dim": 24, "quick_gelu": True,
                 "vision_cfg": {"image_size": 96, "layers": 1, "width": 64, "patch_size": 16},
                 "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 1, "layers": 1}}
# pass -> (sample indices, their flags: TPT/params.py names)
PASSES = {
    "authors": (range(0, 4), dict(tta_steps=3, lr=7e-3, weight_decay=5e-4, selection_p=0.1, sample_k=3,
                                  reward_process=1, process_batch=0, reward_amplify=0)),
    "batch": (range(4, 6), dict(tta_steps=2, lr=7e-3, weight_decay=5e-4, selection_p=0.1, sample_k=5,
                                reward_process=1, process_batch=1, reward_amplify=1)),
}


def reward_state_dict() -> dict[str, torch.Tensor]:
    """The reward CLIP's random weights (seed REWARD_SEED) in OpenAI's key layout."""
    from shiftlab.models import load_model, register_architecture
    register_architecture(REWARD_NAME, REWARD_CONFIG)
    return {k: v.clone() for k, v in load_model(REWARD_NAME, None, seed=REWARD_SEED).clip.state_dict().items()}


def their_download_root_exists() -> tuple[object, str]:
    """clip_reward.py and clip/custom_clip.py raise at import unless one of their hard-coded CLIP folders
    exists; the folder is never read when `clip.load` is given a file. `os.path.exists` answers True for
    their placeholder '/YOUR/PATH' while their modules are imported, and is restored after."""
    original = os.path.exists
    os.path.exists = lambda p: p == "/YOUR/PATH" or original(p)
    return original, ("os.path.exists -> True for their placeholder DOWNLOAD_ROOT_v2 '/YOUR/PATH' while "
                      "clip_reward and clip.custom_clip are imported (the folder is never read: the models are files)")


def run_rlcf(checkout: Path, model_path: str, inputs: dict, classnames: list[str], variant: str) -> dict:
    reward_sd = reward_state_dict()
    work = Path(tempfile.mkdtemp(prefix="rlcf-"))
    reward_path = str(work / "reward_openai.pt")
    torch.save(reward_sd, reward_path)
    patches = cpu_float32() + [jit_load_reads_state_dicts()]
    enter(checkout / "TPT")
    exists, note = their_download_root_exists()
    patches.append(note)
    try:
        import clip.custom_clip as custom_clip
        import clip_reward
        import tpt_cls_rl
    finally:
        os.path.exists = exists
    seen = record_tokens(custom_clip)
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    out: dict[str, torch.Tensor] = {}
    rec: dict[str, list] = {}
    step = {"prefix": ""}

    def put(key, value):
        rec.setdefault(step["prefix"] + key, []).append(value.detach().clone())

    original_select = tpt_cls_rl.select_confident_samples

    def select_confident_samples(logits, top):
        res = original_select(logits, top)
        put("view_logits", logits.float())
        put("selected", res[1])
        return res
    tpt_cls_rl.select_confident_samples = select_confident_samples
    original_accuracy = tpt_cls_rl.accuracy

    def accuracy(output, target, topk=(1,)):
        put("logits", output[0].float())
        return original_accuracy(output, target, topk)
    tpt_cls_rl.accuracy = accuracy
    hooks = [register_optimizer_step_pre_hook(lambda opt, a, k: put("grad", opt.param_groups[0]["params"][0].grad)),
             register_optimizer_step_post_hook(lambda opt, a, k: put("ctx", opt.param_groups[0]["params"][0]))]

    meta: dict = {"reward_model": {"name": REWARD_NAME, "config": REWARD_CONFIG, "seed": REWARD_SEED,
                                   "built_with": "shiftlab.models.load_model(name, None, seed) after "
                                                 "register_architecture(name, config); saved with torch.save"},
                  "n_views": N_VIEWS, "passes": {}}
    for name, (samples, flags) in PASSES.items():
        step["prefix"] = f"{name}/"
        torch.manual_seed(0)
        # main_worker (tpt_cls_rl.py): the CoOp-style student, only its prompt learner trains
        model = tpt_cls_rl.get_coop(model_path, "R", "cpu", 4, "a_photo_of_a")
        for pname, p in model.named_parameters():
            if "prompt_learner" not in pname:
                p.requires_grad_(False)
        optimizer = torch.optim.AdamW(model.prompt_learner.parameters(), flags["lr"],
                                      weight_decay=flags["weight_decay"])
        optim_state = copy.deepcopy(optimizer.state_dict())
        args = argparse.Namespace(**flags, multiple_reward_models=0, reward_arch=reward_path, min_entropy_reg=0,
                                  min_entropy_w=0.1, gpu=0, tpt=True, print_freq=10 ** 9)
        reward = clip_reward.get_reward_model("cpu", args)
        scaler = torch.cuda.amp.GradScaler(init_scale=1000)    # disabled on a machine without CUDA (float32 here)
        seen.clear()   # get_coop tokenised ImageNet's 1000 names; the prompts used are the classnames' below
        model.reset_classnames(classnames, model_path)
        reward.set_class_features(tokenized_classes=model.prompt_learner.tokenized_prompts)
        out[f"{name}/reward_text_features"] = reward.class_features.clone()

        original_set, original_score, original_post = (reward.set_image_features, reward.CLIPScore,
                                                       reward.rewards_post_process)

        def set_image_features(images, _orig=original_set, _reward=reward):
            _orig(images)
            put("reward_image_features", _reward.image_features)

        def clip_score(class_index, _orig=original_score, **kw):
            scores = _orig(class_index=class_index, **kw)
            put("sampled", class_index)
            put("clip_score", scores)
            return scores

        def post_process(clip_score, _orig=original_post):
            rewards = _orig(clip_score)
            put("rewards", rewards)
            return rewards
        reward.set_image_features, reward.CLIPScore, reward.rewards_post_process = (set_image_features, clip_score,
                                                                                   post_process)
        original_inference = model.inference

        def inference(image, _orig=original_inference):
            logits = _orig(image)
            put("forward", logits.float())
            return logits
        model.inference = inference
        original_scale = scaler.scale

        def scale(loss, _orig=original_scale):
            put("loss", loss.float())
            return _orig(loss)
        scaler.scale = scale

        loader = [([clip_normalize(v).unsqueeze(0) for v in unit_views(base, N_VIEWS)], torch.tensor([int(y)]))
                  for base, y in zip(inputs["base_u8"][list(samples)], inputs["labels"][list(samples)])]
        tpt_cls_rl.test_time_adapt_eval(loader, model, optimizer, optim_state, scaler, args, device="cpu",
                                        reward_model=reward)
        out[f"{name}/labels"] = inputs["labels"][list(samples)].clone()
        out[f"{name}/samples"] = torch.tensor(list(samples))
        meta["passes"][name] = {"samples": list(samples), "flags": flags, "n_ctx": 4, "ctx_init": "a_photo_of_a",
                                "scaler": "torch.cuda.amp.GradScaler(init_scale=1000): disabled without CUDA"}
    for h in hooks:
        h.remove()
    for key, values in rec.items():
        # per-step values -> one tensor per sample and step, named <pass>/<sample>/<step>/<what>
        pass_name, what = key.split("/", 1)
        steps = PASSES[pass_name][1]["tta_steps"]
        per_sample = {"view_logits": 1, "selected": 1, "reward_image_features": 1, "logits": 1,
                      "forward": steps + 1}.get(what, steps)
        for j, value in enumerate(values):
            sample, s = divmod(j, per_sample)
            if what == "forward":   # calls: every view (step 0), the selected views (steps 1..), view 0 (after)
                if 0 < s < steps:
                    out[f"{pass_name}/{sample}/{s}/selected_logits"] = value
                continue
            out[f"{pass_name}/{sample}/" + (what if per_sample == 1 else f"{s}/{what}")] = value
    tokens = all_tokens(seen)
    out.update({f"reward/{k}": v for k, v in G.compact_state_dict(reward_sd, tokens).items()})
    meta.update({
        "patches": patches + [
            "their reward model: a second tiny CLIP file (reward_arch = its path); their student: the golden tiny "
            "CLIP file (get_coop(arch=path, 'R', 'cpu', 4, 'a_photo_of_a'), reset_classnames(classnames, path))"],
        "called": "per pass: tpt_cls_rl.get_coop(student, 'R', 'cpu', 4, 'a_photo_of_a'); AdamW(prompt_learner, lr, "
                  "weight_decay); clip_reward.get_reward_model('cpu', args); GradScaler(init_scale=1000); "
                  "model.reset_classnames(classnames, student); reward.set_class_features(tokenized_classes="
                  "model.prompt_learner.tokenized_prompts); tpt_cls_rl.test_time_adapt_eval(loader, model, optimizer, "
                  "optim_state, scaler, args, 'cpu', reward) with the loader's views as a list of (1, 3, 64, 64) "
                  "tensors (view 0 first), as main_worker does",
        "recorded_by_wrapping": ["tpt_cls_rl.select_confident_samples (every view's logits, the selected views)",
                                 "tpt_cls_rl.accuracy (the tuned prompt's logits on view 0)",
                                 "the student's `inference` (the selected views' logits at steps 1..)",
                                 "CLIPRewards.set_image_features / CLIPScore / rewards_post_process (the reward "
                                 "model's features of the selected views, the sampled classes, the raw scores "
                                 "and the rewards)",
                                 "GradScaler.scale (the loss of each step)",
                                 "global optimizer step pre/post hooks (the prompt's gradient and value)"]})
    return {"tensors": out, "meta": meta, "tokens": tokens}

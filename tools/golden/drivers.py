"""The drivers that run each author's code on the tiny CLIP (one per repository; see make_golden.py).

Each `run_*` imports the authors' modules from their checkout, patches only from outside
(device, fp16, model loading, data loading, logging-only imports) and records what their
functions computed by wrapping them. Each runs in its own process: every repository ships
its own top-level `clip` package.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import types
from pathlib import Path

import torch
from harness import (  # the shared part (the older drivers of tests/fixtures/golden import it from here)
    all_tokens,
    clip_normalize,
    cpu_float32,
    enter,
    jit_load_reads_state_dicts,
    record_tokens,
    stub_modules,
    unit_views,
)

import _golden as G  # noqa: E402  (tests/ is on sys.path once harness is imported)

N_SAMPLES, BASE_SIZE, N_PROTOTYPES = 24, 80, 5
VIEWS = {"tda": 64, "dmn": 32, "zero": 64, "rtpt": 32}


# -- inputs -----------------------------------------------------------------------------------

def make_stream(seed: int = 2024) -> dict[str, torch.Tensor]:
    """24 smooth 80x80 images; sample i is prototype (i mod 5) plus its own noise, so that
    pseudo-labels repeat and the caches fill up and evict."""
    g = torch.Generator().manual_seed(seed)
    protos = torch.rand(N_PROTOTYPES, 3, 6, 6, generator=g)
    own = torch.rand(N_SAMPLES, 3, 6, 6, generator=g)
    low = 0.75 * protos[torch.arange(N_SAMPLES) % N_PROTOTYPES] + 0.25 * own
    img = torch.nn.functional.interpolate(low, size=(BASE_SIZE, BASE_SIZE), mode="bicubic", align_corners=False)
    fine = torch.rand(N_SAMPLES, 3, BASE_SIZE, BASE_SIZE, generator=g)
    base = (img.clamp(0, 1) * 0.92 + 0.08 * fine) * 255
    return {"base_u8": torch.round(base).clamp(0, 255).to(torch.uint8),
            "labels": (torch.arange(N_SAMPLES) * 37) % 200}


# -- TDA ----------------------------------------------------------------------------------------

def run_tda(checkout: Path, model_path: str, inputs: dict, classnames: list[str], variant: str) -> dict:
    stub_modules("wandb", "gdown")
    patches = cpu_float32()
    enter(checkout)
    import clip
    import yaml
    seen = record_tokens(clip)
    import tda_runner
    import utils
    from datasets.imagenet_r import template
    model, _ = clip.load(model_path, device="cpu")
    model.eval()
    with open(checkout / "configs" / "imagenet_r.yaml") as f:
        cfg = yaml.safe_load(f)
    if variant == "small":          # the same code with small caches, so that entries are evicted
        cfg["positive"]["shot_capacity"], cfg["negative"]["shot_capacity"] = 1, 1
        cfg["negative"]["entropy_threshold"] = {"lower": 0.0, "upper": 1.0}
    clip_weights = utils.clip_classifier(classnames, template, model)
    out: dict[str, torch.Tensor] = {"text_features": clip_weights.T.clone()}
    caches: dict[str, dict] = {}
    step = {"i": 0}
    orig_update, orig_logits = tda_runner.update_cache, tda_runner.get_clip_logits

    def update_cache(cache, pred, features_loss, shot_capacity, include_prob_map=False):
        caches["neg" if include_prob_map else "pos"] = cache
        return orig_update(cache, pred, features_loss, shot_capacity, include_prob_map)

    def get_clip_logits(images, clip_model, weights):
        res = orig_logits(images, clip_model, weights)
        i = step["i"]
        feats, logits, loss, prob_map, pred = res
        out.update({f"{i}/feature": feats[0].clone(), f"{i}/clip_logits": logits[0].clone(),
                    f"{i}/loss": loss.reshape(()).clone(), f"{i}/prob_map": prob_map[0].clone(),
                    f"{i}/pred": torch.tensor(pred)})
        return res

    def cls_acc(final_logits, target, topk=1):
        i = step["i"]
        out[f"{i}/logits"] = final_logits[0].clone()
        for name in ("pos", "neg"):
            cache = caches.get(name, {})
            entries = [(label, item) for label in sorted(cache) for item in cache[label]]
            out[f"{i}/{name}/labels"] = torch.tensor([label for label, _ in entries], dtype=torch.int64)
            out[f"{i}/{name}/losses"] = torch.stack([item[1].reshape(()) for _, item in entries]) if entries \
                else torch.zeros(0)
            out[f"{i}/{name}/features"] = torch.cat([item[0] for _, item in entries]) if entries else torch.zeros(0)
            if name == "neg":
                out[f"{i}/neg/probs"] = torch.cat([item[2] for _, item in entries]) if entries else torch.zeros(0)
        step["i"] += 1
        return 0.0

    tda_runner.update_cache, tda_runner.get_clip_logits, tda_runner.cls_acc = update_cache, get_clip_logits, cls_acc
    n_views = VIEWS["tda"]
    loader = [([clip_normalize(v).unsqueeze(0) for v in unit_views(base, n_views)], torch.tensor([int(y)]))
              for base, y in zip(inputs["base_u8"], inputs["labels"])]
    tda_runner.run_test_tda(cfg["positive"], cfg["negative"], loader, model, clip_weights)
    meta = {"config": cfg, "templates": list(template), "n_views": n_views, "patches": patches,
            "called": "tda_runner.run_test_tda(cfg['positive'], cfg['negative'], loader, clip_model, clip_weights) "
                      "with clip_weights = utils.clip_classifier(classnames, datasets.imagenet_r.template, clip_model)",
            "recorded_by_wrapping": ["tda_runner.update_cache (to see the cache dicts)",
                                     "tda_runner.get_clip_logits (its outputs)",
                                     "tda_runner.cls_acc (final logits; cache snapshot after each sample)"]}
    return {"tensors": out, "meta": meta, "tokens": all_tokens(seen)}


# -- DMN-ZS -------------------------------------------------------------------------------------

def description_file(classnames: list[str]) -> dict[str, list[str]]:
    """Stand-in for CuPL's GPT-3 descriptions (not redistributable): two sentences per class,
    written here, in the format DMN reads (`data/gpt3_prompts/CuPL_prompts_imagenet.json`)."""
    return {c: [f"a {c} seen up close.", f"a picture showing the shape of a {c}."] for c in classnames}


def run_dmn(checkout: Path, model_path: str, inputs: dict, classnames: list[str], variant: str) -> dict:
    stub_modules("ipdb")
    patches = cpu_float32()
    sys.path.insert(0, str(checkout))
    work = Path(tempfile.mkdtemp(prefix="dmn-"))          # DMN reads ./data/gpt3_prompts/<file> from the cwd
    (work / "data" / "gpt3_prompts").mkdir(parents=True)
    descriptions = description_file([c.replace("_", " ") for c in classnames])
    (work / "data" / "gpt3_prompts" / "CuPL_prompts_imagenet.json").write_text(json.dumps(descriptions))
    os.chdir(work)

    patches = patches + [jit_load_reads_state_dicts()]
    import clip.fix_clip as fix_clip
    seen = record_tokens(fix_clip)
    import dmn_main
    memory_size = 50 if variant == "authors" else 2
    model = fix_clip.get_fixed_clip(model_path, classnames, "cpu", 4, "a_photo_of_a", memory_size=memory_size,
                                    text_prompt="tip_cupl")
    for p in model.parameters():
        p.requires_grad_(False)
    model.reset_classnames(classnames, "R")
    with torch.no_grad():
        model.get_text_features()
    out: dict[str, torch.Tensor] = {"text_features": model.text_feat.clone()}
    args = argparse.Namespace(selection_p=0.1, beta=5.5, n_shot=0, ft=False, position="all", mapping="bias",
                              shared_param=False, print_freq=10**9, gpu=0, memory_size=memory_size,
                              indice=torch.arange(model.text_feat.shape[1]), set_id="R")
    step = {"i": 0}

    mem_cls = dmn_main.DualMem
    orig_text, orig_update, orig_image = mem_cls.get_text_prediction, mem_cls.update_memory_bank, mem_cls.get_image_pred

    def get_text_prediction(self, m, return_full=True, return_logit=False):
        res = orig_text(self, m, return_full, return_logit)
        out[f"{step['i']}/view_probs"] = res.clone()
        return res

    def update_memory_bank(self, m, target):
        out[f"{step['i']}/init_pred"] = self.init_pred[0].clone()
        return orig_update(self, m, target)

    def get_image_pred(self, m, return_full=False, return_logit=False):
        res = orig_image(self, m, return_full, return_logit)
        i = step["i"]
        out[f"{i}/p_dyn"] = res[0].clone()
        counts = m.image_feature_count[:, 0]
        labels = [c for c in range(len(counts)) for _ in range(int(counts[c]))]
        slots = [s for c in range(len(counts)) for s in range(int(counts[c]))]
        out[f"{i}/memory/labels"] = torch.tensor(labels, dtype=torch.int64)
        out[f"{i}/memory/features"] = m.image_feature_memory[labels, slots].clone()
        out[f"{i}/memory/entropies"] = m.image_entropy_mem[labels, slots].clone()
        step["i"] += 1
        return res

    mem_cls.get_text_prediction, mem_cls.update_memory_bank, mem_cls.get_image_pred = (
        get_text_prediction, update_memory_bank, get_image_pred)
    n_views = VIEWS["dmn"]
    loader = [([clip_normalize(v).unsqueeze(0) for v in unit_views(base, n_views)], torch.tensor([int(y)]))
              for base, y in zip(inputs["base_u8"], inputs["labels"])]
    result = dmn_main.direct_inference(loader, model, args)
    meta = {"memory_size": memory_size, "beta": 5.5, "selection_p": 0.1, "text_prompt": "tip_cupl",
            "n_views": n_views, "descriptions": descriptions, "patches": patches,
            "searched": {"best_acc": float(result[3]), "beta1": float(result[4]), "beta2": float(result[5])},
            "called": "dmn_main.direct_inference(loader, model, args) with model = clip.fix_clip.get_fixed_clip("
                      "tiny, classnames, memory_size, text_prompt='tip_cupl'); reset_classnames(classnames, 'R'); "
                      "get_text_features(); args as scripts/run.sh (zero-shot block) with n_shot 0",
            "recorded_by_wrapping": "dmn_main.DualMem.get_text_prediction / update_memory_bank / get_image_pred "
                                    "(each calls the authors' method and records its result)",
            "cupl_stand_in": "data/gpt3_prompts/CuPL_prompts_imagenet.json written into a temporary cwd with the "
                             "descriptions above (CuPL's own file is not redistributable)"}
    return {"tensors": out, "meta": meta, "tokens": all_tokens(seen)}


# -- ZERO ---------------------------------------------------------------------------------------

def run_zero(checkout: Path, model_path: str, inputs: dict, classnames: list[str], variant: str) -> dict:
    stub_modules("pandas")
    patches = cpu_float32() + [jit_load_reads_state_dicts()]
    enter(checkout)
    import clip as their_clip
    seen = record_tokens(their_clip)
    import clip.custom_clip as custom_clip
    custom_clip.tokenize = their_clip.tokenize
    import ttas.zero as zero_mod
    from ttas.zero import Zero
    tta = Zero("Zero", model="clip", arch=model_path, pretrained="openai", gpu="cpu", ctx_init="a_photo_of_a",
               use_templates=False, seed=1)
    tta.prepare_for_training("R", model_path)
    step = {"i": 0}
    out: dict[str, torch.Tensor] = {}
    orig_filter, orig_break = zero_mod.confidence_filter, zero_mod.greedy_break

    def confidence_filter(logits, probs, top, return_idx=False):
        res = orig_filter(logits, probs, top, return_idx)
        i = step["i"]
        out[f"{i}/cosine"] = logits.clone()
        out[f"{i}/kept"] = res[1].clone()
        out[f"{i}/entropy_order"] = res[2].clone()
        return res

    def greedy_break(ties, logits, device):
        res = orig_break(ties, logits, device)
        out[f"{step['i']}/ties"] = torch.tensor([int(t) for t in ties], dtype=torch.int64)
        return res

    zero_mod.confidence_filter, zero_mod.greedy_break = confidence_filter, greedy_break
    n_views = VIEWS["zero"] if variant == "authors" else 8
    with torch.no_grad():
        out["text_features"] = tta.model.get_text_features().clone()
    for base in inputs["base_u8"]:
        views = clip_normalize(unit_views(base, n_views))
        with torch.no_grad():
            p_bar = tta(views)
        out[f"{step['i']}/output"] = p_bar[0].clone()
        step["i"] += 1
    meta = {"gamma": tta.gamma, "n_views": n_views, "ctx_init": "a_photo_of_a", "templates": False,
            "patches": patches + ["pandas -> stub (imported by utils.tools for result tables only)"],
            "called": "ttas.zero.Zero(model='clip', ctx_init='a_photo_of_a', use_templates=False)"
                      ".prepare_for_training('R', arch); tta(views) per sample, as run.py's test_time_adapt_eval "
                      "(whose autocast is off here)",
            "recorded_by_wrapping": ["ttas.zero.confidence_filter", "ttas.zero.greedy_break"]}
    return {"tensors": out, "meta": meta, "tokens": all_tokens(seen)}


# -- R-TPT's attack pipeline ----------------------------------------------------------------------

ATTACK = {"eps": 1.0, "steps": 7, "n_samples": 4, "n_views": 32, "seed0": 1000}


def run_rtpt_attack(checkout: Path, model_path: str, inputs: dict, classnames: list[str], variant: str) -> dict:
    patches = cpu_float32() + [jit_load_reads_state_dicts()]
    enter(checkout)
    import clip.custom_clip as custom_clip
    import numpy as np
    import torchvision.transforms as T
    from PIL import Image
    seen = record_tokens(custom_clip)
    import data.datautils as datautils
    import rtpt
    res_px = G.VIEW_SIZE
    # the views' RandomResizedCrop is hard-wired to 224 px; the tiny CLIP takes 64
    datautils.get_preaugment = lambda: T.Compose([T.RandomResizedCrop(res_px), T.RandomHorizontalFlip()])
    rtpt.set_random_seed(0)
    model = rtpt.get_coop(model_path, classnames, "cpu", 4, "a_photo_of_a")
    for name, p in model.named_parameters():
        if "prompt_learner" not in name:
            p.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.prompt_learner.parameters(), 5e-3)
    optim_state = copy.deepcopy(optimizer.state_dict())
    eps = ATTACK["eps"]
    args = argparse.Namespace(eps=eps, alpha=eps / 4.0, steps=ATTACK["steps"], tta_steps=1, selection_p=0.1,
                              gpu=0, print_freq=10**9, out_file=types.SimpleNamespace(write=print, flush=lambda: None))
    base_transform = T.Compose([T.Resize(res_px, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(res_px)])
    transform = datautils.AugMixAugmenter(base_transform, T.Compose([T.ToTensor()]),
                                          n_views=ATTACK["n_views"] - 1, augmix=False)
    out: dict[str, torch.Tensor] = {}
    step = {"i": 0, "acc": 0}
    pgd_cls = rtpt.torchattacks.PGD
    orig_forward = pgd_cls.forward

    def forward(self, images, labels):
        i = step["i"]
        torch.manual_seed(ATTACK["seed0"] + i)          # the random start, reproducible outside
        out[f"{i}/clean"] = images[0].clone()
        out[f"{i}/attack_ctx"] = model.prompt_learner.ctx.detach().clone()
        adv = orig_forward(self, images, labels)
        out[f"{i}/adv_float"] = adv[0].clone()
        return adv
    pgd_cls.forward = forward

    def recording_transform(img):
        views = transform(img)
        i = step["i"]
        out[f"{i}/adv_u8"] = torch.from_numpy(np.array(img)).permute(2, 0, 1).clone()
        out[f"{i}/views_u8"] = torch.round(torch.stack(views) * 255).to(torch.uint8)
        return views

    def accuracy(output, target, topk=(1,)):
        i = step["i"]
        out[f"{i}/{'clip_logits' if step['acc'] == 0 else 'rtpt_logits'}"] = output[0].detach().clone()
        step["acc"] ^= 1
        if step["acc"] == 0:
            step["i"] += 1
        return [torch.zeros(1) for _ in topk]
    rtpt.accuracy = accuracy

    n = ATTACK["n_samples"]
    loader = []
    for base, y in zip(inputs["base_u8"][:n], inputs["labels"][:n]):
        pil = Image.fromarray(base.permute(1, 2, 0).numpy(), "RGB")
        loader.append(([v.unsqueeze(0) for v in transform(pil)], torch.tensor([int(y)])))
    rtpt.test_time_adapt_eval(loader, model, None, optimizer, optim_state, None, args, recording_transform)
    out["labels"] = inputs["labels"][:n].clone()
    meta = {**ATTACK, "alpha": eps / 4.0, "patches": patches + [
        "data.datautils.get_preaugment -> RandomResizedCrop(64) + RandomHorizontalFlip (theirs: 224)",
        f"torchattacks.PGD.forward (their vendored copy): torch.manual_seed({ATTACK['seed0']} + i) before the "
        "original forward, so the random start can be drawn again"],
        "called": "rtpt.test_time_adapt_eval(loader, model, None, optimizer, optim_state, None, args, data_transform)"
                  " with model = rtpt.get_coop(tiny, classnames, n_ctx 4, 'a_photo_of_a'), AdamW(lr 5e-3), "
                  "args.eps 1.0 (/255 inside), alpha eps/4, steps 7, 32 views, the loader's views from the same "
                  "AugMixAugmenter(augmix=False) as data_transform",
        "recorded_by_wrapping": ["PGD.forward (clean input, prompt at attack time, float result)",
                                 "data_transform (the 8-bit adversarial image and the rebuilt views)",
                                 "rtpt.accuracy (zero-shot logits of adversarial view 0, R-TPT's output)"]}
    return {"tensors": out, "meta": meta, "tokens": all_tokens(seen)}


WORKERS = {"tda": run_tda, "dmn": run_dmn, "zero": run_zero, "rtpt": run_rtpt_attack}

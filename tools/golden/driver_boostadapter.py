"""The driver that runs BoostAdapter's own code (taolinzhang/BoostAdapter) on the tiny CLIP.

As drivers.py: it imports their modules from the checkout, patches only from outside (device,
fp16, model file, an in-memory stream instead of their datasets, stubs for logging-only imports)
and records what their functions computed by wrapping them. Nothing of theirs is copied here.
"""
from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import torch
from drivers import all_tokens, clip_normalize, cpu_float32, enter, record_tokens, stub_modules, unit_views

N_VIEWS = 64
# variant -> (the --datasets string runner.py sees, the config file, overrides of it)
VARIANTS = {
    "authors": ("R", "imagenet_r.yaml", {}),
    # a fine-grained set's string: runner.py:120 then sets infer_ori_image (view 0 is the sample)
    "original": ("caltech101", "caltech101.yaml", {}),
    # small caches and the negative cache open to every sample, so that entries are evicted
    "small": ("R", "imagenet_r.yaml", {"pos": 1, "neg": 1, "delta": 1}),
}


def _logger() -> types.SimpleNamespace:
    return types.SimpleNamespace(info=lambda *a, **k: None, configure=lambda *a, **k: None,
                                 add=lambda *a, **k: None)


def _snapshot(out: dict, key: str, cache: dict, with_probs: bool) -> None:
    entries = [(label, item) for label in sorted(cache) for item in cache[label]]
    out[f"{key}/labels"] = torch.tensor([label for label, _ in entries], dtype=torch.int64)
    out[f"{key}/losses"] = (torch.stack([torch.as_tensor(item[1], dtype=torch.float32).reshape(())
                                         for _, item in entries]) if entries else torch.zeros(0))
    out[f"{key}/features"] = torch.cat([item[0] for _, item in entries]) if entries else torch.zeros(0)
    if with_probs:
        out[f"{key}/probs"] = torch.cat([item[2] for _, item in entries]) if entries else torch.zeros(0)


def run_boostadapter(checkout: Path, model_path: str, inputs: dict, classnames: list[str], variant: str) -> dict:
    stub_modules("wandb", "gdown", "IPython")
    sys.modules["IPython"].embed = lambda *a, **k: None
    stub_modules("loguru")
    sys.modules["loguru"].logger = _logger()
    patches = cpu_float32() + ["wandb, gdown, IPython (embed), loguru (logger) -> stubs (logging, downloads "
                               "and debugging only)"]
    enter(checkout)
    import clip
    import yaml
    seen = record_tokens(clip)
    import runner
    import utils
    from datasets.imagenet_r import template
    datasets, config_file, small = VARIANTS[variant]
    model, _ = clip.load(model_path, device="cpu")
    model.eval()
    with open(checkout / "configs" / config_file) as f:
        cfg = yaml.safe_load(f)
    if small:
        cfg["positive"]["shot_capacity"], cfg["negative"]["shot_capacity"] = small["pos"], small["neg"]
        cfg["negative"]["entropy_threshold"] = {"lower": 0.0, "upper": 1.0}
        cfg["delta"] = small["delta"]
    clip_weights = utils.clip_classifier(classnames, template, model)
    out: dict[str, torch.Tensor] = {"text_features": clip_weights.T.clone()}
    caches: dict[str, dict] = {}
    step = {"i": 0}
    orig_update, orig_logits = runner.update_cache, runner.get_clip_logits
    orig_select, orig_cache_logits = runner.select_confident_samples, runner.compute_cache_logits

    def update_cache(cache, pred, features_loss, shot_capacity, include_prob_map=False, fifo=True):
        if include_prob_map:
            caches["neg"] = cache
        else:
            caches.setdefault("pos", cache)       # the first positive update of the run is the historical cache
        return orig_update(cache, pred, features_loss, shot_capacity, include_prob_map, fifo)

    def get_clip_logits(images, clip_model, weights, infer_ori_image=False):
        res = orig_logits(images, clip_model, weights, infer_ori_image=infer_ori_image)
        i = step["i"]
        feats, logits, loss, prob_map, pred = res[:5]
        out.update({f"{i}/feature": feats[0].clone(), f"{i}/clip_logits": logits[0].clone(),
                    f"{i}/loss": loss.reshape(()).clone(), f"{i}/prob_map": prob_map[0].clone(),
                    f"{i}/pred": torch.tensor(pred), f"{i}/infer_ori_image": torch.tensor(bool(infer_ori_image))})
        return res

    def select_confident_samples(feat, logits, top):
        res = orig_select(feat, logits, top)
        out[f"{step['i']}/boost_idx"] = res[2].clone()
        return res

    def compute_cache_logits(image_features, cache, alpha, beta, weights, neg_mask_thresholds=None):
        if neg_mask_thresholds is None:
            caches["boost"] = cache
        return orig_cache_logits(image_features, cache, alpha, beta, weights, neg_mask_thresholds)

    def cls_acc(final_logits, target, topk=1):
        i = step["i"]
        out[f"{i}/logits"] = final_logits[0].clone()
        for name in ("pos", "neg", "boost"):
            _snapshot(out, f"{i}/{name}", caches.get(name, {}), name == "neg")
        caches.pop("boost", None)
        step["i"] += 1
        return 0.0

    runner.update_cache, runner.get_clip_logits, runner.cls_acc = update_cache, get_clip_logits, cls_acc
    runner.select_confident_samples, runner.compute_cache_logits = select_confident_samples, compute_cache_logits
    loader = [([clip_normalize(v).unsqueeze(0) for v in unit_views(base, N_VIEWS)], torch.tensor([int(y)]))
              for base, y in zip(inputs["base_u8"], inputs["labels"])]
    args = argparse.Namespace(mode="boostadapter", datasets=datasets, views=N_VIEWS, delta=0)
    runner.run_test_tda(cfg["positive"], cfg["negative"], loader, model, clip_weights, _logger(), args, cfg)
    meta = {"config": cfg, "config_file": f"configs/{config_file}", "datasets_arg": datasets,
            "templates": list(template), "n_views": N_VIEWS, "patches": patches,
            "called": "runner.run_test_tda(cfg['positive'], cfg['negative'], loader, clip_model, clip_weights, "
                      f"logger, args, cfg) with args.mode='boostadapter', args.datasets={datasets!r}, clip_weights = "
                      "utils.clip_classifier(classnames, datasets.imagenet_r.template, clip_model)",
            "recorded_by_wrapping": ["runner.update_cache (to see the historical cache dicts)",
                                     "runner.get_clip_logits (its outputs)",
                                     "runner.select_confident_samples (the boosting views' indices)",
                                     "runner.compute_cache_logits (the boosted positive cache it reads)",
                                     "runner.cls_acc (final logits; cache snapshots after each sample)"]}
    return {"tensors": out, "meta": meta, "tokens": all_tokens(seen)}

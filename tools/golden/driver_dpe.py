"""The driver that runs DPE's code (github.com/zhangce01/DPE-CLIP, `main_dpe.run_test_dpe`) on the tiny CLIP.

As drivers.py: their modules are imported from the checkout and patched only from outside (CPU,
float32, the tiny model file, an in-memory stream, logging-only imports), and values are recorded
by wrapping their functions and classes. Their `info_nce` dependency is the PyPI package
`info-nce-pytorch` (their README), installed outside the project's environment and put on
PYTHONPATH (e.g. `pip install --target /tmp/dpe-site info-nce-pytorch==0.1.4`).
"""
from __future__ import annotations

import importlib.machinery
import json
import sys
import tempfile
import types
from pathlib import Path

import torch
from drivers import (
    all_tokens,
    clip_normalize,
    cpu_float32,
    description_file,
    enter,
    record_tokens,
    stub_modules,
    unit_views,
)

N_VIEWS = 64      # utils.get_preprocess: AugMixAugmenter(n_views=63) + the original
# variant -> (their config file, the dataset name run_test_dpe is given)
VARIANTS = {"authors": ("imagenet_r.yaml", "R"), "imagenet_a": ("imagenet_a.yaml", "A")}


def stub_visualisation() -> str:
    """sklearn.manifold.TSNE is imported for `visualize_cache` only (its call is commented out)."""
    for name in ("sklearn", "sklearn.manifold"):
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        mod.TSNE = None
        sys.modules[name] = mod
    return "sklearn, sklearn.manifold -> stubs (TSNE is used by visualize_cache only, whose call is commented out)"


def run_dpe(checkout: Path, model_path: str, inputs: dict, classnames: list[str], variant: str) -> dict:
    stub_modules("wandb", "gdown")
    patches = cpu_float32() + [stub_visualisation(), "wandb, gdown -> stubs (logging / downloads only)"]
    enter(checkout)
    import clip
    import info_nce
    import yaml
    seen = record_tokens(clip)
    import main_dpe
    import utils
    from datasets.imagenet_r import template
    config_file, dataset_name = VARIANTS[variant]
    model, _ = clip.load(model_path, device="cpu")
    model.eval()
    with open(checkout / "configs" / config_file) as f:
        cfg = yaml.safe_load(f)
    work = Path(tempfile.mkdtemp(prefix="dpe-"))
    descriptions = description_file([c.replace("_", " ") for c in classnames])
    cupl_path = work / "CuPL_prompts_imagenet.json"
    cupl_path.write_text(json.dumps(descriptions))
    clip_weights = utils.clip_classifier(classnames, template, str(cupl_path), model)
    out: dict[str, torch.Tensor] = {"text_features": clip_weights.T.clone()}
    n = len(inputs["labels"])
    step = {"i": -1, "logits_calls": 0, "entropy_calls": 0}   # i: the sample, counted at its TextResidue
    made: dict[str, object] = {}
    caches: dict[str, dict] = {}
    orig_update, orig_logits, orig_entropy = main_dpe.update_cache, main_dpe.get_clip_logits, main_dpe.get_entropy

    text_cls, cache_cls = main_dpe.TextResidue, main_dpe.PositiveCacheResidue
    text_init, text_forward, cache_init = text_cls.__init__, text_cls.forward, cache_cls.__init__

    def text_residue_init(self, clip_weights):
        text_init(self, clip_weights)
        made["text"], made["text_input"] = self, None
        step["i"] += 1
        step["logits_calls"] = step["entropy_calls"] = 0

    def text_residue_forward(self, x):
        if made["text_input"] is None:         # clip_weights_global of this sample (before its update)
            made["text_input"] = x
            out[f"{step['i']}/text_global_before"] = x.detach().T.clone()
        return text_forward(self, x)

    def cache_residue_init(self, pos_cache_keys):
        cache_init(self, pos_cache_keys)
        made["cache"] = self
        out[f"{step['i']}/cache_keys"] = pos_cache_keys.detach().T.clone()

    def update_cache(cache, pred, features_loss, shot_capacity, include_prob_map=False):
        caches["pos"] = cache
        return orig_update(cache, pred, features_loss, shot_capacity, include_prob_map)

    def get_clip_logits(images, clip_model, weights):
        res = orig_logits(images, clip_model, weights)
        i, which = step["i"], ("adapt" if step["logits_calls"] == 0 else "readout")
        step["logits_calls"] += 1
        feats, logits, loss, _, pred = res
        out.update({f"{i}/{which}/feature": feats[0].detach().clone(),
                    f"{i}/{which}/clip_logits": logits[0].detach().clone(),
                    f"{i}/{which}/loss": loss.detach().reshape(-1)[0].clone(),
                    f"{i}/{which}/pred": torch.tensor(pred)})
        return res

    def get_entropy(loss, weights):
        res = orig_entropy(loss, weights)
        i, which = step["i"], ("cache" if step["entropy_calls"] == 0 else "final")
        step["entropy_calls"] += 1
        out[f"{i}/{which}_entropy"] = torch.tensor(res, dtype=torch.float64)
        return res

    def cls_acc(final_logits, target, topk=1):
        i = step["i"]
        if i < n:
            out[f"{i}/logits"] = final_logits[0].detach().clone()
            out[f"{i}/text_residual"] = made["text"].residual.detach().T.clone()
            out[f"{i}/cache_residual"] = made["cache"].residual.detach().T.clone()
            cache = caches.get("pos", {})
            entries = [(label, item) for label in sorted(cache) for item in cache[label]]
            out[f"{i}/pos/labels"] = torch.tensor([label for label, _ in entries], dtype=torch.int64)
            out[f"{i}/pos/losses"] = torch.tensor([float(item[1]) for _, item in entries], dtype=torch.float64)
            out[f"{i}/pos/features"] = torch.cat([item[0].detach() for _, item in entries])
        return 0.0

    text_cls.__init__, text_cls.forward = text_residue_init, text_residue_forward
    cache_cls.__init__ = cache_residue_init
    main_dpe.update_cache, main_dpe.get_clip_logits, main_dpe.get_entropy = update_cache, get_clip_logits, get_entropy
    main_dpe.cls_acc = cls_acc
    loader = [([clip_normalize(v).unsqueeze(0) for v in unit_views(base, N_VIEWS)], torch.tensor([int(y)]))
              for base, y in zip(inputs["base_u8"], inputs["labels"])]
    # one more sample (the first again) only to read clip_weights_global after the 24th update
    main_dpe.run_test_dpe(cfg["positive"], cfg["learning_rate"], loader + loader[:1], model, clip_weights,
                          dataset_name)
    for i in range(n):
        out[f"{i}/text_global"] = out.pop(f"{i + 1}/text_global_before")
    out = {k: v for k, v in out.items() if not k.startswith(f"{n}/") and k != "0/text_global_before"}
    meta = {"config": cfg, "config_file": f"configs/{config_file}", "dataset_name": dataset_name,
            "templates": list(template), "n_views": N_VIEWS, "descriptions": descriptions,
            "info_nce": getattr(info_nce, "__version__", "info-nce-pytorch 0.1.4"),
            "patches": patches + ["their CuPL file: a stand-in (drivers.description_file, as DMN's fixture) passed "
                                  "to utils.clip_classifier as cupl_path"],
            "called": f"main_dpe.run_test_dpe(cfg['positive'], cfg['learning_rate'], loader, clip_model, clip_weights, "
                      f"'{dataset_name}') with cfg = configs/{config_file} and clip_weights = utils.clip_classifier("
                      "classnames, datasets.imagenet_r.template, cupl_path, clip_model); the loader holds the 24 "
                      "samples and then the first one again, only to read clip_weights_global after the 24th",
            "recorded_by_wrapping": ["main_dpe.TextResidue.__init__ / forward (clip_weights_global as forward's first "
                                     "input; the residual after the step)",
                                     "main_dpe.PositiveCacheResidue.__init__ (the cache prototypes; the residual)",
                                     "main_dpe.update_cache (to see the cache dict)",
                                     "main_dpe.get_clip_logits (adaptation and readout calls)",
                                     "main_dpe.get_entropy (cache entropy, final entropy)",
                                     "main_dpe.cls_acc (final logits; cache snapshot after each sample)"]}
    return {"tensors": out, "meta": meta, "tokens": all_tokens(seen)}

"""The driver that runs DOTA's authors' code (github.com/skylineeeeen/DOTA) on the tiny CLIP.

As the drivers in drivers.py: their modules are imported from the checkout and patched only
from outside (CPU, float32, the tiny model file, an in-memory stream); what their functions
computed is recorded by wrapping them. `dota.run_test_dota` runs as `main()` calls it.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch
from drivers import VIEWS, all_tokens, clip_normalize, cpu_float32, enter, record_tokens, stub_modules, unit_views

# variant -> config overrides on configs/vit/imagenet_r.yaml; "strong": the same code with a fusion weight
# large enough that the Gaussian scores change predictions on the 24-sample stream
VARIANTS = {"authors": {}, "strong": {"rho": 3.0, "eta": 5.0}}


def run_dota(checkout: Path, model_path: str, inputs: dict, classnames: list[str], variant: str) -> dict:
    stub_modules("gdown")
    patches = cpu_float32()
    torch.cuda.is_available = lambda: False          # DOTA.__init__ picks its device with it
    patches.append("torch.cuda.is_available -> False (DOTA.__init__ then puts its estimates on the CPU)")
    patches.append("gdown -> stub (imported by datasets/utils.py for downloads only)")
    try:
        mod = importlib.import_module("sortedcontainers")
        patches.append(f"sortedcontainers {getattr(mod, '__version__', '?')} installed outside the shared "
                       "environment (pip --target; dota.py imports SortedList and never uses it)")
    except ImportError:
        stub_modules("sortedcontainers")
        sorted_list = type("SortedList", (list,), {})
        sys.modules["sortedcontainers"].SortedList = sorted_list
        patches.append("sortedcontainers -> stub (dota.py imports SortedList and never uses it)")
    enter(checkout)
    import clip
    import yaml
    seen = record_tokens(clip)
    import dota
    import utils
    from datasets.imagenet_r import template
    model, _ = clip.load(model_path, device="cpu")
    model.eval()
    with open(checkout / "configs" / "vit" / "imagenet_r.yaml") as f:
        cfg = yaml.safe_load(f)
    cfg.update(VARIANTS[variant])
    clip_weights = utils.clip_classifier(classnames, template, model)
    mu0 = torch.full((clip_weights.shape[0], clip_weights.shape[1]), 0.001)      # as main() builds it
    dota_model = dota.DOTA(cfg, input_shape=clip_weights.shape[0], num_classes=clip_weights.shape[1],
                           clip_weights=mu0)
    dota_model.eval()
    out: dict[str, torch.Tensor] = {"text_features": clip_weights.T.clone(),
                                    "init/precision": dota_model.Lambda.clone()}
    step = {"i": 0}
    orig_logits, orig_predict, orig_update = dota.get_clip_logits_aug, dota.DOTA.predict, dota.DOTA.update

    def get_clip_logits_aug(images, clip_model, weights):
        res = orig_logits(images, clip_model, weights)
        i = step["i"]
        feats, logits, loss, prob_map, pred = res
        out.update({f"{i}/clip_logits": logits[0].clone(), f"{i}/pred": torch.tensor(pred)})
        if variant == "authors":
            out.update({f"{i}/features": feats.clone(), f"{i}/prob_map": prob_map.clone()})
        return res

    def predict(self, x):
        res = orig_predict(self, x)
        out[f"{step['i']}/dota_logits"] = res[0].clone()
        return res

    def cls_acc(final_logits, target, topk=1):
        out[f"{step['i']}/logits"] = final_logits[0].clone()
        return 0.0

    def update(self):
        orig_update(self)
        i = step["i"]
        step["i"] += 1
        if variant != "authors":    # the estimates do not depend on rho and eta: "authors" records them
            return
        out.update({f"{i}/means": self.mu.clone(), f"{i}/counts": self.c.clone(),
                    f"{i}/covariance": self.overall_Sigma.clone(), f"{i}/precision": self.Lambda.clone()})
        if i == len(inputs["labels"]) - 1:      # the per-class covariances (200 x D x D) after the last sample
            out[f"{i}/class_covariances"] = self.Sigma.clone()

    dota.get_clip_logits_aug, dota.cls_acc = get_clip_logits_aug, cls_acc
    dota.DOTA.predict, dota.DOTA.update = predict, update
    n_views = VIEWS["tda"]
    loader = [([clip_normalize(v).unsqueeze(0) for v in unit_views(base, n_views)], torch.tensor([int(y)]))
              for base, y in zip(inputs["base_u8"], inputs["labels"])]
    import logging
    dota.run_test_dota(cfg, loader, model, clip_weights, dota_model, logging.getLogger("dota-golden"))
    meta = {"config": cfg, "templates": list(template), "n_views": n_views, "mu_init": 0.001,
            "patches": patches,
            "called": "dota.run_test_dota(cfg, loader, clip_model, clip_weights, dota_model, logger) with "
                      "cfg = configs/vit/imagenet_r.yaml" + (f" updated with {VARIANTS[variant]}" if VARIANTS[variant]
                                                             else "")
                      + ", clip_weights = utils.clip_classifier(classnames, datasets.imagenet_r.template, "
                        "clip_model), dota_model = dota.DOTA(cfg, D, C, clip_weights=torch.full((D, C), 0.001)) "
                        "as main() builds them",
            "recorded_by_wrapping": ["dota.get_clip_logits_aug (its outputs: kept views' features, mean logits, "
                                     "per-view soft labels, pseudo-label)",
                                     "dota.DOTA.predict (the Gaussian scores, before the sample's update)",
                                     "dota.cls_acc (the final logits)",
                                     "dota.DOTA.update (after fit: means, counts, overall_Sigma, Lambda; the "
                                     "per-class Sigma after the last sample; variant 'authors' only)"]}
    return {"tensors": out, "meta": meta, "tokens": all_tokens(seen)}

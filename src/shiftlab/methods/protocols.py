"""Evaluation protocols: which views, text head and precision each method runs with.

A protocol is data: per method, config overrides on top of the method's defaults. The
defaults ARE the `leaderboard` protocol; `paper` adds what each method's own code does for
ImageNet-R. Layers, later wins:

    method defaults  <-  protocol overrides  <-  --set

except that a run's --precision other than "auto" replaces the protocol's precision entries
(the method then says "auto" and follows the run's setting, shiftlab.models.precision), so
`--precision fp32` runs every method in float32 even under `paper`; `--set` always has the
last word. The effective config (with its view recipe) is what a run records.

- `leaderboard` (the seed table, the R-TPT paper's): every method on the same 64 views
  (view 0 + 63 RandomResizedCrop + flip, no AugMix), "a photo of a {}." for the tuned and
  training-free methods of the seed table.
- `paper`: each method as its authors' code runs ImageNet-R (sources in the comments); with a
  dataset (the engine passes the run's), also what the code sets for that dataset
  (`dataset_overrides`: C-TPT's lambda, TDA's configs/<set>.yaml, DMN's weight, TPT's AugMix on
  the fine-grained sets, TDA's and DMN's per-dataset prompt templates).
"""
from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

PROTOCOLS = ("leaderboard", "paper")
DEFAULT_PROTOCOL = "leaderboard"

# method -> overrides; a method missing here runs its defaults (= leaderboard) under `paper` too.
_OVERRIDES: dict[str, dict[str, dict[str, Any]]] = {
    "leaderboard": {},
    "paper": {
        # TPT (azshue/TPT tpt_classification.py): fp16 autocast + GradScaler(init_scale=1000);
        # AugMix only for the fine-grained sets (len(set_id) > 1), so not for ImageNet-R.
        "tpt": {"precision": "fp16"},
        # C-TPT's distribution-shift script passes --I_augmix: AugMix on for ImageNet-R; lambda 20.
        "ctpt": {"precision": "fp16", "views": {"augmix": True}, "lambda_atfd": 20.0},
        # R-TPT (rtpt.py): no autocast, no GradScaler: float32 throughout.
        "rtpt": {"precision": "fp32"},
        # MTA (MaxZanella/MTA mta.py, solve_mta): the features under fp16 autocast.
        "mta": {"precision": "fp16"},
        # ZERO (FarinaMatteo/zero): the zero-shot forward under fp16 autocast.
        "zero": {"precision": "fp16"},
        # TDA (kdiAAA/TDA): 63 AugMix views + the original, 80 templates (configs/imagenet_r.yaml).
        # The authors run the model itself in fp16 (`clip.load` on CUDA, no autocast: "fp16-pure", float32
        # on the CPU as every precision) with the logit scale fixed at 100.
        "tda": {"precision": "fp16-pure", "views": {"n_views": 64, "augmix": True}, "text_head": "ensemble",
                "logit_scale": 100.0},
        # DMN-ZS (YBZh/DMN scripts/run.sh, data/datautils.py): 32 views of RandomResizedCrop(224,
        # scale=(0.5, 1)) + flip, float32, memory 50, beta 5.5, --text_prompt tip_cupl (7 Tip-Adapter
        # templates + CuPL descriptions). The descriptions are not shipped (no licence): the run refuses
        # until the user passes --set dmn_zs.cupl_file=PATH (or picks another head with --set).
        "dmn_zs": {"precision": "fp32", "views": {"n_views": 32, "scale": (0.5, 1.0)},
                   "memory_size": 50, "beta": 5.5, "text_head": "tip_cupl"},
        # BoostAdapter (taolinzhang/BoostAdapter runner.py, utils.py): TDA's half model with the literal scale
        # 100, the dataset's templates (CLIP's 80 for R); views as leaderboard (utils.py:122, augmix=False).
        "boostadapter": {"precision": "fp16-pure", "text_head": "ensemble", "logit_scale": 100.0},

        # DOTA (skylineeeeen/DOTA dota.py, utils.py): TDA's pipeline: 63 AugMix views + the original on
        # A/V/R/S (get_ood_preprocess), the half model of `clip.load`, logit scale 100, the dataset's templates;
        # configs/vit/imagenet_r.yaml (the defaults). ImageNet and the cross-domain sets: one view (per dataset).
        "dota": {"precision": "fp16-pure", "views": {"n_views": 64, "augmix": True}, "text_head": "ensemble",
                 "logit_scale": 100.0},

        # DPE (zhangce01/DPE-CLIP utils.py get_preprocess, clip_classifier, get_clip_logits): 63 AugMix views +
        # the original, the half model of `clip.load` on CUDA under autocast, logit scale 100, CLIP's 80 templates +
        # CuPL descriptions (not shipped: refused until --set dpe.cupl_file=PATH, or another head with --set).
        "dpe": {"precision": "fp16-pure", "views": {"n_views": 64, "augmix": True}, "text_head": "tip_cupl",
                "logit_scale": 100.0},

        # OnZeta (idstcv/OnZeta main_online.py:218-242): one centre-cropped image per sample, the half model
        # of `clip.load` on CUDA, its 7 templates; the arithmetic after the encoders float32 (their .float()).
        "onzeta": {"precision": "fp16-pure"},
        # ECALP (Yushu-Li/ECALP main.py): DMN's float32 features, one per image; neighbour ties in
        # torch.topk's order, as their code leaves them.
        "ecalp": {"precision": "fp32", "ties": "topk"},
        # TPS (elaine-sui/TPS): mirrors shiftlab.methods.tps.TPS.protocols (sources cited there): fp16 autocast +
        # GradScaler(1e3), the 80 templates + GPT-4 descriptors head (not shipped: refused until --set
        # tps.descriptors_file=PATH, or another head with --set).
        "tps": {"precision": "fp16", "text_head": "ensemble_descriptors"},
        # DynaPrompt (zzzx1224/DynaPrompt dynap_classification.py:102, 230, 419: fp16 autocast with
        # GradScaler(init_scale=1000); :119, 123: torch.topk's order of equal prompt statistics).
        # mirrors DynaPrompt.protocols (methods/dynaprompt.py)
        "dynaprompt": {"precision": "fp16", "ties": "topk"},
        # TTL (Razaimam45/TTL-Test-Time-Low-Rank-Adaptation ttl.py:79, 222, 351): the LoRA step and the readout
        # under fp16 autocast, GradScaler(init_scale=1000); views as leaderboard. Mirrors TTL.protocols.
        "ttl": {"precision": "fp16"},
        # mirrors RLCF.protocols (methods/rlcf.py): fp16 autocast + GradScaler(init_scale=1000), tpt_cls_rl.py:52,127
        "rlcf": {"precision": "fp16"},
    },
}


def check_protocol(protocol: str) -> str:
    """`protocol` if known, else a one-line ValueError."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    return protocol


def protocol_overrides(protocol: str, method: str) -> dict[str, Any]:
    """The protocol's config overrides for one method (a copy; {} where it runs its defaults)."""
    return copy.deepcopy(_OVERRIDES[check_protocol(protocol)].get(method, {}))


def merge_views(lower: Any, upper: Any) -> Any:
    """Two layers of `views` overrides: dicts merge field by field, a view count sets n_views,
    anything else (a ViewRecipe) replaces."""
    from ..views.recipe import ViewRecipe
    if isinstance(upper, int) and not isinstance(upper, bool):
        upper = {"n_views": upper}
    if isinstance(lower, int) and not isinstance(lower, bool):
        lower = {"n_views": lower}
    if isinstance(lower, ViewRecipe) and isinstance(upper, dict):
        return ViewRecipe.coerce(upper, base=lower)
    if isinstance(lower, dict) and isinstance(upper, dict):
        return {**lower, **upper}
    return upper


def dataset_overrides(protocol: str, method: str, dataset: str | None) -> dict[str, Any]:
    """Under `paper`, what the method's code sets for `dataset` (shiftlab.datasets.method_settings and
    view_settings, from the authors' repositories: C-TPT's lambda, TDA's configs/<set>.yaml, DMN's
    weight, TPT's AugMix on the fine-grained sets); {} under `leaderboard` or without a dataset."""
    if check_protocol(protocol) != "paper" or dataset is None:
        return {}
    from ..datasets.settings import method_settings, view_settings
    from ..datasets.specs import DATASETS
    if dataset not in DATASETS:
        return {}
    out = method_settings(dataset, method)
    views = view_settings(dataset, method)
    if views:
        out["views"] = views
    out.update(_dataset_templates(method, dataset))
    return out


def _dataset_templates(method: str, dataset: str) -> dict[str, Any]:
    """`{"templates": [...]}` for a method whose text head takes templates (a `templates` config
    field: TDA, DMN-ZS) and whose code uses others than CLIP's 80 on `dataset`; {} otherwise. The
    TPT family builds its prompt from `ctx_init` ("a photo of a", TPT's scripts, every set)."""
    import dataclasses

    from ..datasets.classes import load_templates
    from ..datasets.settings import templates
    from .base import get_method_class
    fields = {f.name for f in dataclasses.fields(get_method_class(method).config_class)}
    if "templates" not in fields:
        return {}
    chosen = templates(dataset, method)
    return {} if chosen == load_templates() else {"templates": tuple(chosen)}


def method_overrides(protocol: str, method: str, user: Mapping[str, Any] | None = None,
                     run_precision: str = "auto", dataset: str | None = None) -> dict[str, Any]:
    """The overrides that make a method's effective config: protocol <- the protocol's per-dataset
    values (`dataset_overrides`) <- user; a run precision other than "auto" drops the protocol's own
    precision (the method then follows the run's)."""
    out = protocol_overrides(protocol, method)
    for key, value in dataset_overrides(protocol, method, dataset).items():
        out[key] = merge_views(out[key], value) if key == "views" and key in out else value
    if run_precision != "auto":
        out.pop("precision", None)
    for key, value in dict(user or {}).items():
        out[key] = merge_views(out[key], value) if key == "views" and key in out else value
    return _dataset_cupl_file(method, out, dataset)


def _dataset_cupl_file(method: str, out: dict[str, Any], dataset: str | None) -> dict[str, Any]:
    """Under every protocol: a `cupl_file` naming a directory of CuPL's per-dataset files becomes the
    dataset's file (DMN's names, shiftlab.methods.online_common.dataset_cupl_file) when the method's
    head reads it, so a suite runs each dataset with its own descriptions and the run records the file."""
    if dataset is None or not out.get("cupl_file"):
        return out
    from .base import get_method_class
    from .online_common import dataset_cupl_file
    if out.get("text_head", getattr(get_method_class(method).config_class, "text_head", None)) == "tip_cupl":
        out["cupl_file"] = dataset_cupl_file(out["cupl_file"], dataset, f"{method}.cupl_file")
    return out


def describe(protocol: str, method: str) -> dict[str, Any]:
    """What a method runs with under a protocol: its effective config (defaults + overrides)."""
    import dataclasses

    from .base import get_method_class, make_config
    cls = get_method_class(method)
    config = make_config(cls, **protocol_overrides(protocol, method))
    fields = dataclasses.asdict(config)
    return {"views": fields.pop("views", {"n_views": 1}), "precision": fields.pop("precision"), "config": fields}

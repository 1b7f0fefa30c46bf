"""The driver that runs OnZeta's `main_online.py` (github.com/idstcv/OnZeta) on the tiny CLIP.

Their script is one `main()`: argparse, `clip.load`, an ImageFolder over ImageNet val, features,
then the online loop. It is called as it stands (sys.argv set) with patches from outside only:
`clip` is OpenAI's package (their README's requirement; pass its checkout as OPENAI_CLIP or put
it at <checkouts>/CLIP), `clip.load` reads the tiny model on the CPU, `ImageFolder` is the
in-memory stream (view 0 of each sample, already CLIP-normalised), `torch.randperm` is the
identity (the fixture's stream order), and `torch.unique` on the labels answers all 200 classes
(their `num_class` counts the labels present, which on ImageNet val is every class; 24 samples
cannot hold 200), and their head is built for the golden 200 class names (main() hard-codes
ImageNet's 1000). The loop's state is read after every sample from `F.normalize(w, dim=0)`,
the loop's last call, by wrapping their module's `F` and looking at the calling frame.
"""
from __future__ import annotations

import os
import sys
import types
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


def _openai_clip(checkout: Path) -> Path:
    path = Path(os.environ.get("OPENAI_CLIP", checkout.parent / "CLIP"))
    if not (path / "clip" / "clip.py").is_file():
        raise SystemExit(f"OpenAI's clip package not found at {path} (set OPENAI_CLIP to a checkout of "
                         "github.com/openai/CLIP)")
    return path


def run_onzeta(checkout: Path, model_path: str, inputs: dict, classnames: list[str], variant: str) -> dict:
    patches = cpu_float32() + [jit_load_reads_state_dicts()]
    clip_root = _openai_clip(checkout)
    sys.path.insert(0, str(clip_root))
    enter(checkout)
    import clip
    import torch.nn.functional as F
    seen = record_tokens(clip)
    import main_online
    orig_load = clip.load
    clip.load = lambda name, *a, **k: orig_load(model_path, device="cpu")
    n, num_class = len(inputs["labels"]), len(classnames)
    samples = [(clip_normalize(unit_views(base, 1)[0]), int(y)) for base, y in zip(inputs["base_u8"], inputs["labels"])]
    main_online.datasets = types.SimpleNamespace(ImageFolder=lambda root, transform=None: samples)
    orig_randperm, orig_unique = torch.randperm, torch.unique
    torch.randperm = lambda k, *a, **kw: torch.arange(k)

    def unique(x, *a, **kw):      # their num_class = len(torch.unique(image_label))
        return torch.arange(num_class) if x.ndim == 1 and len(x) == n else orig_unique(x, *a, **kw)
    torch.unique = unique

    out: dict[str, torch.Tensor] = {}

    def normalize(t, *a, **k):
        res = F.normalize(t, *a, **k)
        frame = sys._getframe(1)
        if frame.f_code.co_name == "main" and k.get("dim") == 0:
            loc = frame.f_locals
            i = loc["i"]
            out.update({f"{i}/proxy": res.T.clone(), f"{i}/rho": loc["rho"].clone(),
                        f"{i}/text_label": loc["tlabel"].clone(), f"{i}/vision_label": loc["vision_label"].clone(),
                        f"{i}/combo": loc["combo_label"][i].clone(),
                        f"{i}/beta": torch.tensor(loc["beta"]), f"{i}/feature": loc["x"].clone()})
            if i == 0:
                out["text_features"] = loc["text_classifier"].T.clone()
        return res

    def accuracy(output, target, topk=(1,)):      # only printed; theirs calls float() on a 1-element array
        pred = output.topk(max(topk), 1, True, True)[1].t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))
        return [correct[:k].float().sum().item() for k in topk]
    main_online.accuracy = accuracy
    orig_classifier = main_online.zeroshot_classifier
    main_online.zeroshot_classifier = lambda clip_, model, names, templates: orig_classifier(
        clip_, model, classnames, templates)
    main_online.F = types.SimpleNamespace(**{k: getattr(F, k) for k in dir(F) if not k.startswith("__")})
    main_online.F.normalize = normalize
    argv = ["main_online.py", "-a", "RN50", "--data_path", "/nonexistent", "-j", "0", "--repeat", "1"]
    sys.argv = argv
    try:
        main_online.main()
    finally:
        torch.randperm, torch.unique = orig_randperm, orig_unique
    out["predictions"] = torch.stack([out[f"{i}/combo"] for i in range(n)]).argmax(1)
    meta = {"argv": argv[1:], "defaults": {"tau_t": 0.01, "tau_i": 0.04, "cw": 0.5, "cr": 20.0, "alpha": 1.0,
                                           "beta": 0.8}, "n_views": 1, "stream_length": n,
            "templates": "main_online.py imagenet_7_templates (OnZeta's order)",
            "patches": patches + [
                f"clip = OpenAI's package (github.com/openai/CLIP, from {clip_root.name}); clip.load(name) -> "
                "clip.load(tiny CLIP file, device='cpu') (their own call builds the model from the state dict)",
                "main_online.datasets.ImageFolder -> the in-memory stream: per sample (view 0 = centre 64x64 crop, "
                "CLIP-normalised, label); their preprocess is not applied (the views are already the model's size)",
                "main_online.zeroshot_classifier(clip, model, names, templates) -> the same call with the golden 200 "
                "class names (main() hard-codes ImageNet's 1000); their templates are kept",
                "torch.randperm -> arange (the stream in the fixture's order)",
                "torch.unique(labels) -> arange(200) (their num_class = labels present; ImageNet val has every class)",
                "main_online.accuracy -> the same top-k count returned with .item() (theirs calls float() on a "
                "1-element array, which NumPy 2 refuses); it is only printed",
                "main_online.F -> a namespace of torch.nn.functional with normalize wrapped to record the loop state"],
            "called": "main_online.main() with sys.argv " + " ".join(argv[1:]),
            "recorded_by_wrapping": "F.normalize(w, dim=0) (the loop's last statement): w after the update, and from "
                                    "the calling frame rho, tlabel, vision_label, combo_label[i], beta, x"}
    return {"tensors": out, "meta": meta, "tokens": all_tokens(seen)}

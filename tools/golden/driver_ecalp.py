"""The driver that runs ECALP's `main.py` (github.com/Yushu-Li/ECALP) on the tiny CLIP's features.

ECALP runs on pre-extracted features (`torch.load(features_path/task/clip_model/<dataset>.pt)`
with `image_features`, `text_features`, `labels`; theirs come from DMN's extraction and are not
shipped). The driver writes such a file for the stream -- view 0's image feature of each sample and
CLIP's 80-template head, both from the tiny CLIP through OpenAI's `clip` package (pass its
checkout as OPENAI_CLIP or put it at <checkouts>/CLIP) -- and runs `main.py` as a script
(`runpy`, their argparse defaults) on it, on the CPU (their code picks CUDA only when available).
Nothing in their code is patched: their `iterative_label_propagation` (bound into `main` by its
import) is wrapped to record its output and the module's graph state after every sample, and
the module's `torch.topk` to read the final scores of every test node.
"""
from __future__ import annotations

import os
import runpy
import sys
import tempfile
import types
from pathlib import Path

import torch
from drivers import clip_normalize, jit_load_reads_state_dicts, unit_views

VARIANTS = {"authors": [], "small": ["--k_image", "3", "--k_text", "2", "--alpha", "0.8"]}


def _features(clip_root: Path, model_path: str, inputs: dict, classnames: list[str]) -> tuple[dict, list]:
    sys.path.insert(0, str(clip_root))
    import clip
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from shiftlab.datasets.classes import load_templates
    patches = [jit_load_reads_state_dicts()]
    model, _ = clip.load(model_path, device="cpu")
    model.eval()
    templates = load_templates()
    tokens = []
    with torch.no_grad():
        views = torch.stack([clip_normalize(unit_views(base, 1)[0]) for base in inputs["base_u8"]])
        image = model.encode_image(views).float()
        heads = []
        for name in classnames:
            tok = clip.tokenize([t.format(name) for t in templates])
            tokens.append(tok)
            emb = model.encode_text(tok).float()
            emb = emb / emb.norm(dim=-1, keepdim=True)
            mean = emb.mean(0)
            heads.append(mean / mean.norm())
    feats = {"image_features": image / image.norm(dim=-1, keepdim=True), "text_features": torch.stack(heads),
             "labels": inputs["labels"].clone()}
    return feats, patches + [f"features: OpenAI clip ({clip_root.name}) on the tiny CLIP, view 0 per sample "
                             "(encode_image, L2-normalised) and CLIP's 80 templates per class (normalised "
                             "mean of normalised encode_text); written as features/fine_grained/RN/golden.pt"], tokens


def run_ecalp(checkout: Path, model_path: str, inputs: dict, classnames: list[str], variant: str) -> dict:
    torch.set_num_threads(1)
    clip_root = Path(os.environ.get("OPENAI_CLIP", checkout.parent / "CLIP"))
    feats, patches, tokens = _features(clip_root, model_path, inputs, classnames)
    root = Path(tempfile.mkdtemp(prefix="ecalp-"))
    (root / "fine_grained" / "RN").mkdir(parents=True)
    torch.save(feats, root / "fine_grained" / "RN" / "golden.pt")
    sys.path.insert(0, str(checkout))
    os.chdir(checkout)
    import utils.iterative_label_propagation as ilp
    out: dict[str, torch.Tensor] = {"image_features": feats["image_features"],
                                    "text_features": feats["text_features"]}
    step = {"i": 0}
    final = {}
    topk = torch.topk

    def recording_topk(x, k, *a, **kw):
        if sys._getframe(1).f_code.co_name == "iterative_label_propagation" and k == 1:
            final["scores"] = x.clone()
        return topk(x, k, *a, **kw)
    ilp.torch = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
    ilp.torch.topk = recording_topk
    orig = ilp.iterative_label_propagation

    def wrapped(*a, **kw):
        res = orig(*a, **kw)
        i = step["i"]
        out.update({f"{i}/output": res[0].clone(), f"{i}/scores": final["scores"].clone(),
                    f"{i}/knn_sim": ilp.sim_im2im_store.clone(), f"{i}/knn_idx": ilp.knn_im2im_store.clone(),
                    f"{i}/text_sim": ilp.sim_im2text.clone(), f"{i}/text_idx": ilp.knn_im2text.clone(),
                    f"{i}/carried": ilp.Y_0.clone()})
        step["i"] += 1
        return res
    ilp.iterative_label_propagation = wrapped
    argv = ["main.py", "--features_path", str(root), "--task", "fine_grained", "--datasets", "golden",
            "--clip_model", "RN", "--mode", "ZS", *VARIANTS[variant]]
    sys.argv = argv
    runpy.run_path(str(checkout / "main.py"), run_name="__main__")
    out["predictions"] = torch.stack([out[f"{i}/output"] for i in range(step["i"])]).argmax(1)
    meta = {"argv": argv[1:], "n_views": 1, "templates": "clip80",
            "defaults": {"k_text": 3, "k_image": 8, "gamma": 10.0, "alpha": 1.0, "num_iterations": 3},
            "patches": patches + ["none in their code: main.py runs as a script (runpy, sys.argv above) on CPU "
                                  "(torch.cuda.is_available() is False)"],
            "called": "runpy.run_path('main.py', run_name='__main__') with sys.argv " + " ".join(argv[1:]),
            "recorded_by_wrapping": ["utils.iterative_label_propagation.iterative_label_propagation (bound into main "
                                     "at its import): its output and, after each call, the module's globals "
                                     "sim_im2im_store, knn_im2im_store, sim_im2text, knn_im2text, Y_0",
                                     "the module's torch.topk(tensor, 1): the final scores of every test node"]}
    return {"tensors": out, "meta": meta,
            "tokens": torch.unique(torch.cat([t.flatten() for t in tokens]))}

"""The driver that runs TPS's code (github.com/elaine-sui/TPS) on the tiny CLIP.

Their pipeline has two stages, both run here unmodified: the prototypes are precomputed by
`utils/save_class_embeds.py` (`main`, CLIP's 80 templates with `--x_templates`) and
`utils/save_concepts.py` (`save_concepts`, the GPT-4 descriptors), which pickle them into the working
directory; then `shift_classification.test_time_adapt_eval` tunes and predicts per sample with the
model, AdamW and GradScaler set up as its `main_worker` sets them up. As drivers.py: their modules are
imported from the checkout and patched only from outside (CPU, float32, the tiny model file, an
in-memory stream); the class lists their embedding scripts loop over are replaced by the stream's
classes, and their GPT-4 descriptor file by a stand-in written here. Values are recorded by wrapping
their functions.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from drivers import all_tokens, clip_normalize, cpu_float32, jit_load_reads_state_dicts, record_tokens, unit_views

N_VIEWS = 64          # scripts/shift/*.sh: -b 64 -> AugMixAugmenter(n_views=63) + the original
RECORD_GRADS = 8      # samples whose first-step gradients are kept (the fixture stays small)
RECORD_VIEW_LOGITS = 2
# variant -> (their flags, tta_steps, samples): "authors" is the README's recipe
# (scripts/shift/shift_text_per_class_mean_init_template_and_gpt4_micro.sh), "steps" the template-only
# prototypes (scripts/shift/shift_text_per_class_mean_init_template.sh) with three steps
VARIANTS = {"authors": ({"with_concepts": True, "with_templates": True}, 1, None),
            "steps": ({"with_concepts": False, "with_templates": True}, 3, 8)}
# the CoOp context save_class_embeds.py loads at import time (used only with --coop, which is off)
COOP_PATH = "checkpoints/to_gdrive/vit_b16_ep50_16shots/nctx4_cscFalse_ctpend/seed1/prompt_learner/model.pth.tar-50"


def descriptor_file(classnames: list[str]) -> dict[str, list[str]]:
    """Stand-in for their GPT-4 descriptors (gpt4_descriptors/imagenet-gpt4.json; the project ships no
    descriptor sentences): one to three phrases per class, written here, in the format their
    save_concepts.py reads. The phrases take each of its sentence rules (a leading 'a', a leading
    verb such as 'can', anything else) and use words whose token rows the tiny CLIP keeps."""
    phrases = ["smooth shape", "a large tail", "can see red", "art of white", "dark coat"]
    return {c: [phrases[(i + j) % len(phrases)] for j in range(1 + i % 3)] for i, c in enumerate(classnames)}


def run_tps(checkout: Path, model_path: str, inputs: dict, classnames: list[str], variant: str) -> dict:
    patches = cpu_float32() + [jit_load_reads_state_dicts()]
    flags, tta_steps, n_samples = VARIANTS[variant]
    sys.path.insert(0, str(checkout))
    work = Path(tempfile.mkdtemp(prefix="tps-"))    # their scripts write and read ./<arch>_embeds/... from the cwd
    os.chdir(work)
    (work / COOP_PATH).parent.mkdir(parents=True)
    torch.save({"state_dict": {"ctx": torch.zeros(4, 64)}}, work / COOP_PATH)
    names = [c.replace("_", " ") for c in classnames]

    import utils.save_class_embeds as save_class_embeds
    import utils.save_concepts as save_concepts
    seen = [record_tokens(save_class_embeds), record_tokens(save_concepts)]
    for module in (save_class_embeds, save_concepts):
        module.device = "cpu"
        module.CLASSES_DICT = {key: (list(classnames) if key == "ImageNet" else []) for key in module.CLASSES_DICT}
    save_class_embeds.main(argparse.Namespace(arch=model_path, x_templates=True, coop=False))
    descriptors = descriptor_file(names)
    if flags["with_concepts"]:
        (work / "imagenet-gpt4.json").write_text(json.dumps(descriptors))
        save_concepts.save_concepts(argparse.Namespace(
            concepts_json=str(work / "imagenet-gpt4.json"), dataset="ImageNet", no_cond=False, x_templates=False,
            arch=model_path, gpt4_concepts_embeds_dir="concept_embeds_gpt4", concept_dict_dir="concept_dict_gpt4",
            save_concept_dict=True))

    import shift_classification
    args = argparse.Namespace(
        test_sets="R", arch=model_path, gpu="cpu", batch_size=N_VIEWS, lr=5e-3, tta_steps=tta_steps, selection_p=0.1,
        img_aug=True, text_shift=True, do_shift=True, do_scale=False, do_film=False, per_label=True,
        concept_type="gpt4", init_concepts=False, macro_pooling=False, with_coop=False, use_susx_feats=False,
        num_classes=None, load=None, tpt=False, print_freq=10**9, seed=0, **flags)
    model = shift_classification.get_shift_model(args, list(classnames))
    model.eval()
    # shift_classification.main_worker (lines 173-185): AdamW over the shifter, its initial state, the scaler
    optimizer = torch.optim.AdamW(list(model.text_shifter.parameters()), args.lr)
    optim_state = copy.deepcopy(optimizer.state_dict())
    scaler = torch.cuda.amp.GradScaler(init_scale=1e3)   # disabled without CUDA: scale 1, as in float32 it cancels

    out: dict[str, torch.Tensor] = {"text_embeds": model.text_embeds.detach().clone(),
                                    "text_features": model.get_text_features().detach().clone()}
    step = {"i": 0, "j": 0}
    shift = model.text_shifter.shift
    orig_select, orig_entropy = shift_classification.select_confident_samples, shift_classification.avg_entropy
    orig_forward, orig_step = model.forward, optimizer.step

    def forward(image, test=False):
        res = orig_forward(image, test)
        i, j = step["i"], step["j"]
        if not test and j == 0 and i < RECORD_VIEW_LOGITS:
            out[f"{i}/view_logits"] = res.detach().clone()
        return res

    def select_confident_samples(logits, top):
        res = orig_select(logits, top)
        out[f"{step['i']}/kept/{step['j']}"] = res[1].clone()
        return res

    def avg_entropy(outputs):
        res = orig_entropy(outputs)
        out[f"{step['i']}/loss/{step['j']}"] = res.detach().clone()
        return res

    def optimizer_step(*a, **k):
        i, j = step["i"], step["j"]
        if i < RECORD_GRADS and j == 0:
            out[f"{i}/grad"] = shift.grad.detach().clone()
        res = orig_step(*a, **k)
        step["j"] += 1
        return res

    def accuracy(output, target, topk=(1,)):
        i = step["i"]
        out[f"{i}/logits"] = output[0].detach().float().clone()
        out[f"{i}/pred"] = output[0].argmax()
        out[f"{i}/shift"] = shift.detach().clone()
        step["i"] += 1
        step["j"] = 0
        return [torch.zeros(1) for _ in topk]

    model.forward, optimizer.step = forward, optimizer_step
    shift_classification.select_confident_samples = select_confident_samples
    shift_classification.avg_entropy = avg_entropy
    shift_classification.accuracy = accuracy
    bases, labels = inputs["base_u8"][:n_samples], inputs["labels"][:n_samples]
    loader = [([clip_normalize(v).unsqueeze(0) for v in unit_views(base, N_VIEWS)], torch.tensor([int(y)]))
              for base, y in zip(bases, labels)]
    shift_classification.test_time_adapt_eval(loader, model, optimizer, optim_state, scaler, args)
    for i in range(len(loader)):     # one tensor per sample: the steps' losses and kept views
        out[f"{i}/loss"] = torch.stack([out.pop(f"{i}/loss/{j}") for j in range(tta_steps)])
        out[f"{i}/kept"] = torch.stack([out.pop(f"{i}/kept/{j}") for j in range(tta_steps)])
    script = ("scripts/shift/shift_text_per_class_mean_init_template_and_gpt4_micro.sh" if flags["with_concepts"]
              else "scripts/shift/shift_text_per_class_mean_init_template.sh")
    meta = {"flags": flags, "script": script, "tta_steps": tta_steps, "lr": args.lr, "selection_p": args.selection_p,
            "n_views": N_VIEWS, "n_samples": len(loader), "test_set": "R",
            "descriptors": descriptors if flags["with_concepts"] else None,
            "patches": patches + [
                "utils.save_class_embeds / utils.save_concepts: module globals device -> 'cpu' and CLASSES_DICT -> "
                "the stream's 200 classes under 'ImageNet' (every other dataset an empty list)",
                f"a stand-in CoOp checkpoint at ./{COOP_PATH} (save_class_embeds.py loads it at import; unused "
                "without --coop)",
                "their GPT-4 descriptor file: a stand-in (descriptor_file, in the driver) passed as --concepts_json"],
            "called": ("utils.save_class_embeds.main(--x_templates); utils.save_concepts.save_concepts(--dataset "
                       "ImageNet --save_concept_dict) when the recipe has descriptors; then "
                       "shift_classification.test_time_adapt_eval(loader, model, optimizer, optim_state, scaler, args) "
                       "with model = get_shift_model(args, classnames), args as " + script +
                       f" with test set R, --tta_steps {tta_steps}, lr 5e-3, AdamW and GradScaler(1e3) as main_worker"),
            "recorded_by_wrapping": [
                "model.forward (the first step's view logits of the first samples)",
                "shift_classification.select_confident_samples (kept views per step)",
                "shift_classification.avg_entropy (loss per step)",
                "optimizer.step (the shift's gradient at the first step)",
                "shift_classification.accuracy (final logits; the shift after the sample's steps)"]}
    return {"tensors": out, "meta": meta, "tokens": all_tokens(seen[0] + seen[1])}

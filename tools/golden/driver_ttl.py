"""The driver that runs TTL's `ttl.py` (github.com/Razaimam45/TTL-Test-Time-Low-Rank-Adaptation) on a tiny ViT CLIP.

Their image and text towers are Hugging Face's `CLIPModel.from_pretrained("openai/clip-vit-base-patch16")`
(clip/custom_clip.py:581, whatever `--arch` says); their vendored `clip.load(--arch)` only builds the
prompt learner, whose outputs TTL never reads. So the tiny ViT (shiftlab's `shiftlab-tiny-vit`, an
OpenAI-format state dict) reaches their code twice: as `--arch FILE` (their `clip.load` takes a path)
and, converted key by key, as the `CLIPModel` that `from_pretrained` returns. `ttl.py` runs as a script
(`runpy`, the arguments of scripts/test_ttl.sh) on the CPU in float32.

Their dependencies are not shiftlab's: `transformers`, `peft` (0.9.0, the last with
`prepare_model_for_int8_training`), `accelerate`, `einops`, installed outside the project's environment:
`pip install --no-deps --target /tmp/ttl-site transformers==4.38.2 peft==0.9.0 accelerate==0.27.2
huggingface_hub==0.21.4 tokenizers==0.15.2 psutil einops`, then PYTHONPATH=/tmp/ttl-site.
"""
from __future__ import annotations

import argparse
import importlib.machinery
import math
import runpy
import sys
import types
from pathlib import Path

import torch
from drivers import clip_normalize, cpu_float32, enter, jit_load_reads_state_dicts, stub_modules, unit_views

N_VIEWS = 64                      # BS=64 (scripts/test_ttl.sh:8): AugMixAugmenter(n_views=63) + the original
HF_NAME = "openai/clip-vit-base-patch16"
# variant -> (samples of the stream, extra arguments); the tiny ViT has 4 blocks, so the last 3 of them
# stand for ViT-B/16's 9..11 of 12
VARIANTS = {"authors": (4, []), "steps": (2, ["--tta_steps", "2"])}
LAYER_RANGE = "1,3"
# data files of the repository whose contents the snapshot used lacked (never read on this path)
ABSENT = [*(f"data/cifar-10-batches-py/{n}" for n in ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4",
                                                      "data_batch_5", "test_batch")),
          "data/data_splits/split_zhou_Food101.json", "data/data_splits/split_zhou_SUN397.json"]
SEED = 0
# Random features are far apart (cosines up to ~0.25 in 32 dimensions), so OpenAI's trained scale 100 makes
# nearly every view one-hot (mean entropy ~0.1 nat on the stream), a regime where the entropy's float32
# gradients are mostly rounding and a few AdamW steps drive it to ~1e-5; 25 gives views of 0.4 to 4.4 nats,
# as a real CLIP's on ImageNet-R, and keeps four steps well conditioned.
LOGIT_SCALE = 25.0


def tiny_vit_state(seed: int = SEED) -> dict[str, torch.Tensor]:
    """The tiny ViT in OpenAI's format: shiftlab's seeded random `shiftlab-tiny-vit` in float16 (as OpenAI's
    files), the logit scale float32 ln(LOGIT_SCALE)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from shiftlab.synthetic import tiny_vit
    state = {k: v.half() for k, v in tiny_vit(seed).clip.state_dict().items() if k != "logit_scale"}
    state["logit_scale"] = torch.tensor(math.log(LOGIT_SCALE))
    return state


def hf_clip(state: dict[str, torch.Tensor]):
    """The OpenAI-format state dict as a Hugging Face CLIPModel (their layout: separate q/k/v projections,
    projections as Linear weights), float32."""
    from transformers import CLIPConfig, CLIPModel
    sd = {k: v.float() for k, v in state.items()}
    width = sd["visual.conv1.weight"].shape[0]
    patch = sd["visual.conv1.weight"].shape[-1]
    grid = round((sd["visual.positional_embedding"].shape[0] - 1) ** 0.5)
    n_vis = len({k.split(".")[3] for k in sd if k.startswith("visual.transformer.resblocks.")})
    t_width = sd["ln_final.weight"].shape[0]
    n_txt = len({k.split(".")[2] for k in sd if k.startswith("transformer.resblocks.")})
    config = CLIPConfig(
        text_config=dict(vocab_size=sd["token_embedding.weight"].shape[0], hidden_size=t_width,
                         intermediate_size=4 * t_width, num_hidden_layers=n_txt, num_attention_heads=t_width // 64,
                         max_position_embeddings=sd["positional_embedding"].shape[0], hidden_act="quick_gelu",
                         bos_token_id=0, eos_token_id=2, pad_token_id=1),
        vision_config=dict(hidden_size=width, intermediate_size=4 * width, num_hidden_layers=n_vis,
                           num_attention_heads=width // 64, image_size=grid * patch, patch_size=patch,
                           hidden_act="quick_gelu"),
        projection_dim=sd["text_projection"].shape[1])
    out = {"logit_scale": sd["logit_scale"], "text_projection.weight": sd["text_projection"].T,
           "visual_projection.weight": sd["visual.proj"].T,
           "text_model.embeddings.token_embedding.weight": sd["token_embedding.weight"],
           "text_model.embeddings.position_embedding.weight": sd["positional_embedding"],
           "text_model.final_layer_norm.weight": sd["ln_final.weight"],
           "text_model.final_layer_norm.bias": sd["ln_final.bias"],
           "vision_model.embeddings.class_embedding": sd["visual.class_embedding"],
           "vision_model.embeddings.patch_embedding.weight": sd["visual.conv1.weight"],
           "vision_model.embeddings.position_embedding.weight": sd["visual.positional_embedding"],
           "vision_model.pre_layrnorm.weight": sd["visual.ln_pre.weight"],
           "vision_model.pre_layrnorm.bias": sd["visual.ln_pre.bias"],
           "vision_model.post_layernorm.weight": sd["visual.ln_post.weight"],
           "vision_model.post_layernorm.bias": sd["visual.ln_post.bias"]}
    for src, dst, n in (("visual.transformer", "vision_model.encoder", n_vis),
                        ("transformer", "text_model.encoder", n_txt)):
        for i in range(n):
            a, b = f"{src}.resblocks.{i}", f"{dst}.layers.{i}"
            w, bias = sd[f"{a}.attn.in_proj_weight"].chunk(3), sd[f"{a}.attn.in_proj_bias"].chunk(3)
            for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                out[f"{b}.self_attn.{proj}.weight"], out[f"{b}.self_attn.{proj}.bias"] = w[j], bias[j]
            pairs = (("attn.out_proj", "self_attn.out_proj"), ("ln_1", "layer_norm1"), ("ln_2", "layer_norm2"),
                     ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2"))
            for s_name, d_name in pairs:
                for p in ("weight", "bias"):
                    out[f"{b}.{d_name}.{p}"] = sd[f"{a}.{s_name}.{p}"]
    model = CLIPModel(config)
    missing, unexpected = model.load_state_dict(out, strict=False)
    if unexpected or any("position_ids" not in k for k in missing):
        raise SystemExit(f"HF conversion: missing {missing}, unexpected {unexpected}")
    return model.eval()


def _lora_name(hf_name: str) -> str:
    """'...encoder.layers.3.self_attn.q_proj.lora_A.default.weight' -> 'layers.3.q.A'."""
    parts = hf_name.split(".")
    i = parts.index("layers")
    return f"layers.{parts[i + 1]}.{parts[i + 3][0]}.{parts[i + 4][-1]}"


def _lora(model) -> dict[str, torch.nn.Parameter]:
    return {_lora_name(n): p for n, p in model.image_encoder.named_parameters() if ".lora_" in n}


def run_ttl(checkout: Path, model_path: str, inputs: dict, classnames: list[str], variant: str) -> dict:
    n_samples, extra = VARIANTS[variant]
    stub_modules("pandas")
    for name in ("matplotlib", "matplotlib.pyplot"):
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = mod
    patches = cpu_float32() + [jit_load_reads_state_dicts(),
                               "pandas (ttl.py), matplotlib.pyplot (deyo.py) -> stubs (imported, never used)"]
    enter(checkout)
    import transformers
    state = torch.load(model_path, map_location="cpu", weights_only=True)
    hf = hf_clip(state)
    asked: list[str] = []

    def from_pretrained(cls, name, *a, **k):
        asked.append(name)
        return hf
    transformers.CLIPModel.from_pretrained = classmethod(from_pretrained)

    parse = argparse.ArgumentParser.parse_args

    def parse_on_cpu(self, *a, **k):
        ns = parse(self, *a, **k)
        if hasattr(ns, "gpu"):
            ns.gpu = "cpu"
        return ns
    argparse.ArgumentParser.parse_args = parse_on_cpu

    import clip
    import data.datautils
    import deyo
    import utils.tools
    views = [[clip_normalize(v).unsqueeze(0) for v in unit_views(base, N_VIEWS)]
             for base in inputs["base_u8"][:n_samples]]
    labels = inputs["labels"][:n_samples]
    with torch.no_grad():       # the converted model is the file's model (before peft adds LoRA to it)
        x = torch.cat(views[0][:2])
        hf_check = float((hf.get_image_features(x) - clip.load(model_path, device="cpu")[0].eval().encode_image(x))
                         .abs().max())

    class Stream:
        def __len__(self):
            return n_samples

        def batches(self):
            return [(list(v), torch.tensor([int(y)])) for v, y in zip(views, labels)]
    stream = Stream()
    data.datautils.build_dataset = lambda set_id, transform, args, **k: stream
    real_loader = torch.utils.data.DataLoader
    torch.utils.data.DataLoader = lambda ds, *a, **k: ds.batches() if ds is stream else real_loader(ds, *a, **k)

    out: dict[str, torch.Tensor] = {}
    seen = {"sample": 0, "step": 0, "model": None}
    losses: list[torch.Tensor] = []
    entropies: list[torch.Tensor] = []
    make_scaler = torch.cuda.amp.GradScaler

    def scaler_factory(*a, **k):
        scaler = make_scaler(*a, **k)
        scale = scaler.scale

        def recording_scale(loss):
            losses.append(loss.detach().clone())
            return scale(loss)
        scaler.scale = recording_scale
        return scaler
    torch.cuda.amp.GradScaler = scaler_factory
    orig_entropy, orig_adapt, orig_accuracy = deyo.softmax_entropy, deyo.forward_and_adapt_sar, utils.tools.accuracy

    def softmax_entropy(x):
        res = orig_entropy(x)
        entropies.append(res.detach().clone())
        return res

    def forward_and_adapt_sar(x, iter_, model, *a, **k):
        i, j = seen["sample"], seen["step"]
        seen["model"] = model
        lora = _lora(model)
        before = {n: p.detach().clone() for n, p in lora.items()}
        if i == 0 and j == 0:
            out.update({f"init/{n}": t for n, t in before.items()})
        elif j == 0:
            assert all(torch.equal(before[n], out[f"init/{n}"]) for n in before), "LoRA not reset before a sample"
        res = orig_adapt(x, iter_, model, *a, **k)
        outputs, backward, final_backward = res
        tuned = {n: p for n, p in lora.items() if p.requires_grad}
        untouched = [n for n, p in lora.items() if not p.requires_grad and not torch.equal(p.detach(), before[n])]
        assert not untouched, f"frozen LoRA weights moved: {untouched}"
        key = f"{i}/step{j}"
        out[f"{key}/loss"] = losses[-1].reshape(())
        out[f"{key}/kept"] = torch.tensor(final_backward)
        if j == 0:
            out[f"{key}/view_logits"] = outputs.detach().float().clone()
            out[f"{key}/entropy"] = entropies[-1]
        out.update({f"{key}/grad/{n}": p.grad.detach().clone() for n, p in tuned.items()})
        out.update({f"{key}/after/{n}": p.detach().clone() for n, p in tuned.items()})
        seen["step"] += 1
        return res

    def accuracy(output, target, topk=(1,)):
        i = seen["sample"]
        out[f"{i}/logits"] = output[0].detach().float().clone()
        out[f"{i}/steps"] = torch.tensor(seen["step"])
        seen["sample"], seen["step"] = i + 1, 0
        return orig_accuracy(output, target, topk)
    deyo.softmax_entropy, deyo.forward_and_adapt_sar, utils.tools.accuracy = (
        softmax_entropy, forward_and_adapt_sar, accuracy)

    argv = ["ttl.py", str(checkout / "data"), "--test_sets", "R", "--dataset_mode", "test", "--arch", model_path,
            "--b", str(N_VIEWS), "--ctx_init", "a_photo_of_a", "--lr", "5e-3", "--tta_steps", "1",
            "--print_freq", "10", "--gpu", "0", "--selection_p", "0.1", "--layer_range", LAYER_RANGE,
            "--init_method", "xavier", "--lora_encoder", "image", "--rank", "16", "--deyo_selection", "True",
            *extra]
    sys.argv = argv
    runpy.run_path(str(checkout / "ttl.py"), run_name="__main__")

    model = seen["model"]
    their_names = list(model.prompt_learner.classnames)
    if their_names != [c.replace("_", " ") for c in classnames]:
        raise SystemExit("their ImageNet-R class names (imagenet_r_mask) differ from the fixture's")
    out["text_features"] = model.text_features.detach().float().clone()
    out["labels"] = labels.clone()
    out["predictions"] = torch.stack([out[f"{i}/logits"] for i in range(n_samples)]).argmax(-1)
    tokens = model.prompt_learner.tokenized_prompts
    meta = {"argv": argv[1:], "n_views": N_VIEWS, "n_samples": n_samples, "seed": SEED,
            "layer_range": LAYER_RANGE, "hf_model_asked": sorted(set(asked)),
            "transformers": transformers.__version__, "peft": sys.modules["peft"].__version__,
            "check_hf_vs_vendored_clip_image_features_max_abs": hf_check,
            "absent_from_checkout": [f for f in ABSENT if not (checkout / f).exists()],
            "patches": patches + [
                "their --gpu (an int) set to 'cpu' after parsing (argparse.ArgumentParser.parse_args wrapped), "
                "so every device=args.gpu is the CPU",
                f"transformers.CLIPModel.from_pretrained('{HF_NAME}') -> the tiny ViT converted to "
                "Hugging Face's layout (driver_ttl.hf_clip); --arch is the tiny ViT's file (their clip.load "
                "takes a path)",
                "data.datautils.build_dataset -> an in-memory stream; torch.utils.data.DataLoader on it -> its "
                "batches in stream order (theirs shuffles): view 0 the centre crop, then 63 crops "
                "(tests/_golden.py crop_views), ToTensor + CLIP Normalize, batched as their loader batches",
                "torch.cuda.amp.GradScaler on the CPU is torch's disabled scaler (scale 1): recorded, not changed"],
            "called": "runpy.run_path('ttl.py', run_name='__main__') with sys.argv " + " ".join(argv[1:]),
            "recorded_by_wrapping": [
                "deyo.forward_and_adapt_sar: the LoRA weights before (init/*: the first sample's) and after each "
                "step, their gradients, the view logits of the first step",
                "deyo.softmax_entropy: the per-view entropies", "GradScaler.scale: the loss",
                "utils.tools.accuracy: the final logits of view 0"]}
    return {"tensors": out, "meta": meta, "tokens": torch.unique(tokens.flatten())}

"""What the golden drivers over dassl-based trainers share: TAPT (github.com/xinwong/TAPT, trainers/adv_v.py) and
PromptAlign (github.com/jameelhassan/PromptAlign, trainers/prompt_align.py), both forks of MaPLe's code. Each
trainer is made without dassl's set-up (`object.__new__`: `build_data_loader` and `build_model` read datasets and
dassl's config machinery), its model built as their `build_model` builds it, and its per-image loop called as it
stands; dassl and fvcore are stubbed from outside (no number comes from them except `load_checkpoint`, a
`torch.load`), the disabled GradScaler replaced by a float32 stand-in that records the loss.
"""
from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path


def node(**kw) -> types.SimpleNamespace:
    """One level of their yacs config as a namespace."""
    return types.SimpleNamespace(**kw)


def config(t: dict, section: str, trainer: types.SimpleNamespace, **more: types.SimpleNamespace
           ) -> types.SimpleNamespace:
    """Their cfg as the loop reads it: the test-time section `section` (TAPT, TPT: its keys are prefixed by the
    section's name where theirs are) from the values `t`, `trainer` under TRAINER, the tiny ViT's 64-pixel input,
    DATASET.<section> "golden", and `more` sections as given."""
    keys = ("LR", "TTA_STEPS", f"{section}_THRESHOLD", "ALIGN_THRESHOLD", "ALIGN_LAYER_FROM", "ALIGN_LAYER_TO",
            "DISTR_ALIGN", f"{section}_LOSS", "DISTR_LOSS_W", "BATCH_SIZE", "RUN", "COCOOP")
    return node(SEED=t["SEED"], MODEL=node(BACKBONE=node(NAME="ViT-B/16"), INIT_WEIGHTS=""),
                INPUT=node(SIZE=(64, 64)), TRAINER=trainer, DATASET=node(**{section: "golden"}),
                **{section: node(**{k: t[k] for k in keys})}, **more)


def stub_dassl(loop: str, record_logits: list | None = None) -> list[str]:
    """dassl and fvcore as the trainers' imports need them. With `record_logits`, dassl.utils.tpt_tools too
    (PromptAlign's meters, printing only; its `accuracy` appends view 0's final logits there). `loop` names the loop
    in the fvcore patch line."""
    import torch
    names = ["dassl", "dassl.engine", "dassl.metrics", "dassl.utils", "dassl.optim", "fvcore", "fvcore.nn"]
    if record_logits is not None:
        names.insert(4, "dassl.utils.tpt_tools")
    mods = {}
    for name in names:
        mods[name] = sys.modules[name] = types.ModuleType(name)
    mods["dassl.engine"].TRAINER_REGISTRY = types.SimpleNamespace(register=lambda: (lambda cls: cls))
    mods["dassl.engine"].TrainerX = type("TrainerX", (), {})
    mods["dassl.metrics"].compute_accuracy = None
    mods["dassl.utils"].load_pretrained_weights = None
    mods["dassl.utils"].load_checkpoint = lambda path: torch.load(path, map_location="cpu", weights_only=False)
    mods["dassl.optim"].build_optimizer = mods["dassl.optim"].build_lr_scheduler = None
    mods["fvcore.nn"].FlopCountAnalysis = None
    patches = ["dassl (engine, metrics, utils, optim) -> stubs: TRAINER_REGISTRY.register() the identity, TrainerX a "
               "plain class, load_checkpoint = torch.load (dassl's reads the file the same way)"]
    if record_logits is not None:
        _stub_tpt_tools(mods["dassl.utils.tpt_tools"], record_logits)
        patches.append("dassl.utils.tpt_tools -> printing-only meters; accuracy records view 0's final logits (their "
                       "top-1 counts are not recorded)")
    return patches + [f"fvcore.nn -> stub (FlopCountAnalysis imported, not used by {loop})"]


def _stub_tpt_tools(tools: types.ModuleType, record_logits: list) -> None:
    import torch

    class Meter:            # their AverageMeter / ProgressMeter: printing only
        def __init__(self, *a, **k):
            pass

        def update(self, *a, **k):
            pass

        def display(self, *a, **k):
            pass

        def display_summary(self, *a, **k):
            pass
        avg = 0.0

    def accuracy(output, target, topk=(1,)):
        record_logits.append(output[0].detach().clone())
        return [torch.zeros(1) for _ in topk]
    tools.Summary = types.SimpleNamespace(NONE=0, AVERAGE=1, SUM=2, COUNT=3)
    tools.ProgressMeter = tools.AverageMeter = Meter
    tools.accuracy = accuracy
    tools.load_model_weight = tools.set_random_seed = None


def tiny_clip_download(clip: types.ModuleType, golden: Path) -> str:
    """Their `clip._download` hands back the golden tiny ViT's file."""
    model_file = str(golden / "tiny_vit_openai.pt")
    clip._download = lambda url, root=None: model_file
    return "clip._download -> the golden tiny ViT's file (read through the torch.jit.load stand-in)"


def recording_scaler(losses: list) -> str:
    """torch.cuda.amp.GradScaler -> what the disabled scaler does on the CPU, appending each loss to `losses`."""
    import torch

    class RecordingScaler:
        def __init__(self, *a, **k):
            pass

        def scale(self, loss):
            losses.append(float(loss.detach()))
            return loss

        def step(self, optimizer):
            optimizer.step()

        def update(self):
            pass
    torch.cuda.amp.GradScaler = RecordingScaler
    return ("torch.cuda.amp.GradScaler -> a float32 stand-in recording the loss (scale returns it, step "
            "steps the optimizer, as the disabled scaler does on the CPU)")


def build_model(trainers: types.ModuleType, cfg: types.SimpleNamespace, classnames: list[str],
                trainable: tuple[str, ...]) -> tuple:
    """(clip_model, model) as their build_model makes them: dassl's set_random_seed (torch's part), their
    `load_clip_to_cpu`, float32, `CustomCLIP`, only parameters whose name holds one of `trainable` left trainable."""
    import torch
    torch.manual_seed(cfg.SEED)
    clip_model = trainers.load_clip_to_cpu(cfg)
    clip_model.float()
    model = trainers.CustomCLIP(cfg, classnames, clip_model)
    for name, p in model.named_parameters():
        p.requires_grad_(any(key in name for key in trainable))
    return clip_model, model


def bare_trainer(cls: type, cfg: types.SimpleNamespace, model, model_name: str):
    """Their trainer made by `object.__new__` with the attributes their loop and `load_model` read."""
    import torch
    trainer = object.__new__(cls)
    trainer.cfg = cfg
    trainer.device = torch.device("cpu")
    trainer.model = model
    trainer._models = {model_name: model}
    trainer.get_model_names = lambda: [model_name]
    return trainer


def list_loader(batches: list):
    """A loader over `batches` in order (their loop reads `.dataset`, `len` and iterates it)."""
    return type("Loader", (), {"dataset": batches, "__iter__": lambda self: iter(batches),
                               "__len__": lambda self: len(batches)})()


def record_tuning(trainer, method: str, snapshot: Callable) -> tuple[list, list]:
    """Wraps the trainer's per-image tuning `method`: `snapshot(model)` before and after each call, into the two
    lists returned (starts, tuned)."""
    starts, tuned = [], []
    orig = getattr(trainer, method)

    def tuning(model_, inputs, optimizer, scaler, args):
        starts.append(snapshot(model_))
        out = orig(model_, inputs, optimizer, scaler, args)
        tuned.append(snapshot(model_))
        return out
    setattr(trainer, method, tuning)
    return starts, tuned

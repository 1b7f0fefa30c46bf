"""What the golden drivers over CLIPTTA's toolkit (github.com/MarcLafon/cliptta, `ttavlm/`) share: tent, eata, sar,
ostta, sotta, stamp, unient. Their `main.py` builds a method with `ttavlm.methods.return_tta_model(args.adaptation,
base_model, args, template, class_names)` from `configuration.argparser()`'s arguments, then calls it on each batch
of the loader (`tta_model(images)` inside `get_results`, images a one-element list: no test-time augmentation).
`TheirStream` makes the same two calls, unmodified, with a variant's arguments and the golden stream's 24 images
(view 0, CLIP-normalised) cut into 3 consecutive batches of 8; their `clip.load` reads the tiny ViT's OpenAI-format
state dict. Only imports, the device and the loader are patched, from outside.

The checkout (their logging imports need `pip install --target SITE rich prettytable colorlog wandb`, then
PYTHONPATH=SITE; their dataset-name tables are read at import time, hence datasets/files):

    git -C MIRROR archive HEAD ttavlm/methods ttavlm/lib ttavlm/optimizers ttavlm/models ttavlm/memory \\
        ttavlm/transforms 'ttavlm/datasets/*.py' ttavlm/configuration.py ttavlm/__init__.py | tar -x -C CHECKOUT
    git -C MIRROR archive HEAD $(git -C MIRROR ls-tree -r --name-only HEAD ttavlm/datasets/files \\
        | grep -v data_suite_splits) | tar -x -C CHECKOUT
"""
from __future__ import annotations

import sys
from pathlib import Path

from harness import (
    classnames,
    cpu_float32,
    jit_load_reads_state_dicts,
    record_tokens,
    recorded,
    stream_images,
    stub_modules,
)

REPOSITORY = "https://github.com/MarcLafon/cliptta"
BATCH = 8
TEMPLATE = "a photo of a {}."
CALLED = ("ttavlm.methods.return_tta_model(args.adaptation, clip_model, args, [template], classnames) "
          "with args = ttavlm.configuration.argparser() on the argv above, then tta_model([batch]) "
          "under torch.no_grad() per consecutive batch, as get_results does")


def import_theirs(checkout: Path) -> tuple[list[str], list]:
    """Their `ttavlm` importable from `checkout`, its logging-only imports stubbed, on the CPU in float32, their
    tokenizer recorded; imports `ttavlm.methods`. Returns (the patches so far, the recorded token tensors)."""
    stub_modules("wandb_osh", "wandb_osh.hooks", "nltk", "nltk.corpus")
    sys.modules["nltk.corpus"].wordnet = None
    sys.modules["wandb_osh"].hooks = sys.modules["wandb_osh.hooks"]
    sys.modules["wandb_osh.hooks"].TriggerWandbSyncHook = type("TriggerWandbSyncHook", (), {})
    patches = cpu_float32() + ["wandb_osh -> stub (imported by abstract_model.py for logging only)",
                               "nltk.corpus -> stub (datasets/tools/wnid_to_name.py, dataset names only)",
                               jit_load_reads_state_dicts()]
    sys.path.insert(0, str(checkout))
    from ttavlm.models.clip import clip as their_clip
    seen = record_tokens(their_clip)
    import ttavlm.methods  # noqa: F401
    return patches, seen


class TheirStream:
    """Their method of `argv` (after `import_theirs`) on the golden stream: `out` holds `prototypes` (C, D), their
    text head, and per batch b what `batches()` and `record_norm(b)` add; `names` the adapted parameters (those
    that require a gradient, in the tower's order, unless the driver says otherwise). `classes`: the class names
    (the golden ones unless told); `seed_build`: torch.manual_seed(0) right before their method is built (its random
    initial state) instead of before the stream."""

    def __init__(self, golden: Path, variant: str, argv: list[str], patches: list[str], seen: list,
                 classes: list[str] | None = None, seed_build: bool = False):
        import torch
        import ttavlm.methods as their_methods
        from ttavlm.configuration import argparser
        from ttavlm.models.clip import clip as their_clip
        names = classnames(golden) if classes is None else classes
        model, _ = their_clip.load(str(golden / "tiny_vit_openai.pt"), device="cpu")
        sys.argv = ["main.py", "--exp_name", "golden", *argv]
        self.args = argparser()
        self.seed_build = seed_build
        if seed_build:
            torch.manual_seed(0)
        self.tta_model = their_methods.return_tta_model(self.args.adaptation, model, self.args, [TEMPLATE], names)
        self.images = stream_images(golden)
        self.out = {"prototypes": self.tta_model.class_prototypes.detach().clone()}
        self.names = [n for n, p in self.tta_model.model.named_parameters() if p.requires_grad]
        self.variant, self.patches, self.seen = variant, patches, seen

    def batches(self):
        """Seeds torch (0; unless `seed_build`), then per batch b: calls their method under no_grad as get_results
        does, records `b/logits` (B, C), its output times `--logit_scale` (their `get_logits` returns cosines), and
        yields (b, the score it returns)."""
        import torch
        if not self.seed_build:
            torch.manual_seed(0)
        for b, start in enumerate(range(0, self.images.shape[0], BATCH)):
            with torch.no_grad():                   # as get_results calls it
                logits, scores = self.tta_model([self.images[start:start + BATCH]])
            self.out[f"{b}/logits"] = (self.args.logit_scale * logits[0]).detach().clone()
            yield b, scores

    def record_norm(self, b: int, **copies) -> dict:
        """`b/norm/<name>`: every adapted normalisation parameter after batch b, each followed by `b/<key>/<name>`
        the same parameter of each of `copies` (key -> a copy of the tower: a teacher, a key encoder). Returns the
        tower's parameters."""
        params = dict(self.tta_model.model.named_parameters())
        others = {key: dict(tower.named_parameters()) for key, tower in copies.items()}
        for name in self.names:
            self.out[f"{b}/norm/{name}"] = params[name].detach().clone()
            for key, other in others.items():
                self.out[f"{b}/{key}/{name}"] = other[name].detach().clone()
        return params

    def indices(self, stored) -> torch.Tensor:  # noqa: F821
        """The stream indices of the images `stored` (a memory's), in its order."""
        import torch
        return torch.tensor([int((self.images == im).flatten(1).all(1).nonzero()[0]) for im in stored],
                            dtype=torch.long)

    def result(self, *notes: str, **more) -> dict:
        """What the driver's run returns: the tensors, the meta (`notes`: the driver's last patches; `more`: its
        entries before `called`), the tokens."""
        n = int(self.images.shape[0])
        meta = {"variant": self.variant, "batch_size": BATCH, "argv": sys.argv[1:], "n_samples": n,
                "n_batches": -(-n // BATCH), "template": TEMPLATE, "adapted": self.names, **more, "called": CALLED,
                "patches": self.patches + ["their clip.load(tiny ViT state dict, device='cpu')",
                                           "the loader: the golden stream's view 0 (centre 64x64 crop, "
                                           "CLIP-normalised)", *notes]}
        return recorded(self.out, meta, self.seen)

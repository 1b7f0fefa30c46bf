"""What the golden drivers of mariodoebler/test-time-adaptation's methods share (norm_stats, ttaug, memo, rpl; DeYO's
driver, which came first, does the same inline): their `ZeroShotCLIP` (models/model.py) over a golden tiny CLIP,
built from their `conf.py` defaults merged with a method's yaml and the variant's options, and their method built by
their `ADAPTATION_REGISTRY` as `test_time.py` builds it. Only imports and loaders are patched, from outside.

The checkout: `git archive` of classification/{methods,utils,models,augmentations,conf.py,cfgs} and the datasets'
.py files into CHECKOUT/tta, its commit in CHECKOUT/tta/COMMIT (conf.py imports yacs: PYTHONPATH=SITE after
`pip install --target SITE yacs`):

    C=/tmp/tta_src; mkdir -p $C/tta
    git -C TTA_MIRROR archive HEAD classification/methods classification/utils classification/models \\
        classification/augmentations classification/conf.py classification/cfgs \\
        $(git -C TTA_MIRROR ls-tree --name-only HEAD classification/datasets/ | grep '\\.py$') | tar -x -C $C/tta
    git -C TTA_MIRROR rev-parse HEAD > $C/tta/COMMIT

(A mirror missing a blob that `git archive` wants: `git show HEAD:<path>` of each file of `git ls-tree -r
--name-only HEAD <those paths>` instead.) TheirStream runs CMF, CoTTA, RMT and SANTA; `their_batches` and
`record_norm_and_momentum` serve the ROID family; the older drivers (DeYO, VTE, norm_stats, ttaug, memo, rpl) call
their_clip / their_method directly."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

REPOSITORY = "https://github.com/mariodoebler/test-time-adaptation"
PATCHES = ["robustbench, iopath, webdataset -> stubs (imported by models/model.py for other models, by conf.py for "
           "files, by the data loaders)",
           "methods -> a package over their methods/ without its __init__ (which imports every method)",
           "the open_clip model: the golden tiny CLIP as shiftlab.load_model builds it (float32, CPU)",
           "models.model.get_class_names -> the golden class names; get_tokenizer -> open_clip's default "
           "tokenizer (the tiny CLIP is no open_clip config)",
           "their loader: the golden stream's view 0 (centre 64x64 crop, in [0, 1])"]


def package(name: str, path: Path) -> None:
    """`name` as a package over `path` without running its __init__."""
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    sys.modules[name] = mod


def stub_imports(*more: str) -> None:
    """Their imports for other models (robustbench, by models/model.py) and for files (iopath, by conf.py), and
    `more`, as stubs."""
    from harness import stub_modules
    stub_modules("robustbench", "robustbench.model_zoo", "robustbench.model_zoo.architectures",
                 "robustbench.model_zoo.architectures.utils_architectures", "robustbench.model_zoo.enums",
                 "robustbench.utils", "iopath", "iopath.common", "iopath.common.file_io", *more)
    sys.modules["robustbench.model_zoo.architectures.utils_architectures"].normalize_model = None
    sys.modules["robustbench.model_zoo.architectures.utils_architectures"].ImageNormalizer = None
    sys.modules["robustbench.model_zoo.enums"].ThreatModel = None
    sys.modules["robustbench.utils"].load_model = None
    sys.modules["iopath.common.file_io"].g_pathmgr = types.SimpleNamespace(open=open)


def their_clip(checkout: Path, golden: Path, model: str, model_file: str, yaml: str, options: list) -> dict:
    """Their ZeroShotCLIP over the golden tiny CLIP `model` (shiftlab's registry name, its file in `golden`) and their
    cfg (conf.py + cfgs/imagenet_others/`yaml` + `options`). Returns {"cfg", "base", "clip", "classnames",
    "tokens"} (`tokens`: the prompts' token tensors, for the driver's token check)."""
    import torch
    import torchvision.transforms as T
    from harness import MEAN, STD

    import shiftlab
    torch.set_num_threads(1)
    tta = checkout / "tta" / "classification"
    stub_imports("webdataset")
    sys.path.insert(0, str(tta))
    package("methods", tta / "methods")
    import models.model as their_model
    import open_clip
    from conf import cfg, merge_from_file
    classnames = json.loads((golden / "golden.json").read_text())["classnames"]
    seen: list = []
    tokenizer = open_clip.get_tokenizer("ViT-B-16")

    def tokenize(texts):
        out = tokenizer(texts)
        seen.append(out.clone())
        return out
    their_model.get_class_names = lambda name: classnames
    their_model.get_tokenizer = lambda arch: tokenize
    clip = shiftlab.load_model(model, str(golden / model_file)).clip
    merge_from_file(str(tta / "cfgs" / "imagenet_others" / yaml))
    cfg.merge_from_list(list(options) + ["CORRUPTION.DATASET", "imagenet_r", "MIXED_PRECISION", False])
    base = their_model.ZeroShotCLIP(cfg, clip, "cpu", normalize=T.Normalize(MEAN, STD))
    return {"cfg": cfg, "base": base, "clip": clip, "classnames": classnames, "tokens": seen}


def their_method(name: str, module: str, cfg, base, num_classes: int):
    """`ADAPTATION_REGISTRY.get(name)(cfg=cfg, model=base, num_classes=C)` after importing methods.`module`."""
    import importlib
    importlib.import_module(f"methods.{module}")
    from utils.registry import ADAPTATION_REGISTRY
    return ADAPTATION_REGISTRY.get(name)(cfg=cfg, model=base, num_classes=num_classes)


# -- the ROID family's drivers (roid, roid_consistency): their method on the stream, its state per batch ------------
VISUAL = "model.visual."        # the image tower's parameters in their ZeroShotCLIP


def tiny_model(kind: str) -> tuple[str, str]:
    """shiftlab's registry name and the golden file of the tiny `kind` CLIP ("vit" or "resnet")."""
    import _golden as G
    return ("shiftlab-tiny-vit", G.VIT_MODEL_FILE) if kind == "vit" else ("shiftlab-tiny", G.MODEL_FILE)


def split_visual(names: list[str]) -> tuple[list[str], list[str]]:
    """Their `collect_params()` names split into (the image tower's, the others)."""
    return [n for n in names if n.startswith(VISUAL)], [n for n in names if not n.startswith(VISUAL)]


def their_batches(model, images, size: int, out: dict):
    """Their method on each consecutive batch under torch.no_grad(), as get_accuracy calls it: records `b/logits`
    into `out` and yields b."""
    import torch
    from harness import batches
    for b, batch in batches(images, size):
        with torch.no_grad():
            out[f"{b}/logits"] = model(batch).detach().clone()
        yield b


def record_norm_and_momentum(out: dict, b: int, model, adapted: list[str]) -> None:
    """`b/norm/<name>` every adapted image-tower parameter of their method after batch b and `b/momentum/<name>`
    SGD's momentum buffer of each (once there); names without "model.visual."."""
    params = dict(model.model.named_parameters())
    for name in adapted:
        short = name[len(VISUAL):]
        out[f"{b}/norm/{short}"] = params[name].detach().clone()
        buf = model.optimizer.state.get(params[name], {}).get("momentum_buffer")
        if buf is not None:
            out[f"{b}/momentum/{short}"] = buf.detach().clone()


def called(name: str, yaml: str, model_note: str = "") -> str:
    """The meta's "called": how their method was built and run (`model_note` follows ZeroShotCLIP's call)."""
    return (f"ADAPTATION_REGISTRY.get('{name}')(cfg=cfg, model=ZeroShotCLIP(cfg, clip, 'cpu', normalize){model_note}, "
            f"num_classes=C) with cfg = conf.py's defaults + cfgs/imagenet_others/{yaml} + the options (argv), then "
            "model(batch) under torch.no_grad() per consecutive batch, as get_accuracy does")


def stream_images(golden: Path):
    """The golden stream's 24 images, view 0 (centre 64x64 crop) in [0, 1]: (24, 3, 64, 64)."""
    import harness
    return harness.stream_images(golden, normalize=False)


def reference(checkout: Path) -> dict:
    return {"repository": REPOSITORY, "commit": (checkout / "tta" / "COMMIT").read_text().strip()}


def weight_rows(base, teacher, optimizer, adapted: list, source: dict, head: int) -> dict:
    """The mean-teacher drivers' (cotta, rmt) per-batch record of every adapted parameter (`adapted`: their names
    in their ZeroShotCLIP `base`), one row each in that order: `student`, `teacher`, `momentum` (P, head) the first
    `head` entries flattened (NaN past a smaller one's end; `teacher` the EMA model), `student_moved`, `teacher_moved`
    (P,) the float64 sum of |value - source value| (`source`: name -> the value before the first batch) and
    `at_source` (P,) how many entries equal the source value exactly."""
    import torch
    student, ema = dict(base.named_parameters()), dict(teacher.named_parameters())
    rows: dict[str, list] = {k: [] for k in ("student", "teacher", "momentum", "student_moved", "teacher_moved",
                                             "at_source")}
    for name in adapted:
        s, t = student[name].detach(), ema[name].detach()
        buf = optimizer.state.get(student[name], {}).get("momentum_buffer")
        for key, value in (("student", s), ("teacher", t), ("momentum", buf)):
            row = torch.full((head,), float("nan"))
            if value is not None:
                flat = value.flatten()[:head]
                row[:flat.numel()] = flat
            rows[key].append(row)
        rows["student_moved"].append((s.double() - source[name].double()).abs().sum())
        rows["teacher_moved"].append((t.double() - source[name].double()).abs().sum())
        rows["at_source"].append((s == source[name]).sum())
    return {key: torch.stack(values) for key, values in rows.items()}


def seed_each_update(model, seed: int) -> list:
    """Precede each of `model.forward_and_adapt`'s calls by `torch.manual_seed(update_seed(seed, k))`, k = 0, 1, ...
    (shiftlab's `common/ema_teacher.update_seed`: their random draws come from torch's global generator). Returns
    the one-element list counting the updates."""
    import torch

    from shiftlab.methods.common.ema_teacher import update_seed
    updates = [0]
    forward_and_adapt = model.forward_and_adapt

    def seeded(x):
        torch.manual_seed(update_seed(seed, updates[0]))
        updates[0] += 1
        return forward_and_adapt(x)
    model.forward_and_adapt = seeded
    return updates


# -- their method on the golden stream (cmf, cotta, rmt, santa) -----------------------------------------------------

BATCH = 8
TEMPLATE = "a photo of a {}."
MODELS = {"vit": ("shiftlab-tiny-vit", "tiny_vit_openai.pt"), "resnet": ("shiftlab-tiny", "tiny_clip_openai.pt")}
VISUAL = "model.visual."


class TheirStream:
    """Their method over their ZeroShotCLIP on the golden tiny CLIP of `kind` ("vit", "resnet"), cfg = conf.py +
    cfgs/imagenet_others/`yaml` + `options`, on the golden stream's 24 images in consecutive batches of 8, called as
    `get_accuracy` calls it. `out` holds `prototypes` (their text head) and what the batches add; `adapted` the
    image tower's parameters their `collect_params` collects (their names in ZeroShotCLIP). `model_preprocess`: set
    it as test_time.py does (their img_size is its crop); `ckpt`: CKPT_DIR a temporary folder."""

    def __init__(self, checkout: Path, golden: Path, variant: str, kind: str, yaml: str, options: list,
                 model_preprocess: bool = False, ckpt: bool = False):
        import tempfile
        self.model_name, model_file = MODELS[kind]
        cfg_options = options + (["CKPT_DIR", tempfile.mkdtemp(prefix=f"{variant}-ckpt-")] if ckpt else [])
        built = their_clip(checkout, golden, self.model_name, model_file, yaml, cfg_options)
        self.cfg, self.base, self.seen, self.n_classes = built["cfg"], built["base"], built["tokens"], \
            len(built["classnames"])
        if model_preprocess:        # test_time.py: the model's preprocessing without its normalisation
            import torchvision.transforms as T
            self.base.model_preprocess = T.Compose([T.Resize(64), T.CenterCrop(64), T.ToTensor()])
        self.checkout, self.variant, self.yaml, self.options = checkout, variant, yaml, options
        self.preprocess, self.ckpt, self.patches = model_preprocess, ckpt, list(PATCHES)
        self.images = stream_images(golden)

    def method(self, name: str, module: str | None = None):
        """Their `name` from methods.`module` (default `name`) on the ZeroShotCLIP, as test_time.py builds it."""
        return self.use(name, their_method(name, module or name, self.cfg, self.base, self.n_classes))

    def use(self, name: str, model):
        """`model`, their method `name`, is the one run. Returns it."""
        import torch
        self.name, self.model = name, model
        if self.preprocess:
            assert tuple(model.img_size) == (64, 64), model.img_size
        self.collected = model.collect_params()[1]
        self.adapted = [n for n in self.collected if n.startswith(VISUAL)]
        self.out: dict[str, torch.Tensor] = {"prototypes": self.base.text_features.detach().clone()}
        return model

    def batches(self):
        """(b, the b-th batch of 8)."""
        for b, start in enumerate(range(0, self.images.shape[0], BATCH)):
            yield b, self.images[start:start + BATCH]

    def forward(self, b: int, x) -> None:
        """`b/logits`: their method's output on the batch, under no_grad as get_accuracy calls it."""
        import torch
        with torch.no_grad():
            self.out[f"{b}/logits"] = self.model(x).detach().clone()

    def record_norm(self, b: int) -> None:
        """`b/norm/<name>` every adapted parameter of the image tower after the batch (the tower's names) and
        `b/momentum/<name>` SGD's momentum buffer of each (absent before the first step)."""
        params = dict(self.base.named_parameters())
        for name in self.adapted:
            short = name[len(VISUAL):]
            self.out[f"{b}/norm/{short}"] = params[name].detach().clone()
            buf = self.model.optimizer.state.get(params[name], {}).get("momentum_buffer")
            if buf is not None:
                self.out[f"{b}/momentum/{short}"] = buf.detach().clone()

    def record_weights(self, b: int, source: dict, head: int) -> None:
        """`weight_rows` of the student and their `model_ema` after batch b (`source`: name -> value at the start)."""
        rows = weight_rows(self.base, self.model.model_ema, self.model.optimizer, self.adapted, source, head)
        for key, value in rows.items():
            self.out[f"{b}/{key}"] = value

    def result(self, argv: list, head: dict | None = None, tail: dict | None = None, patches: tuple = ()) -> dict:
        """What the driver's run returns; `head`, `tail`: the driver's meta before `n_samples` and before `called`;
        `patches` its last ones."""
        from harness import recorded
        n = int(self.images.shape[0])
        called = (f"ADAPTATION_REGISTRY.get({self.name!r})(cfg=cfg, model=ZeroShotCLIP(cfg, clip, 'cpu', normalize)"
                  + (" with model_preprocess set as test_time.py sets it" if self.preprocess else "")
                  + f", num_classes=C) with cfg = conf.py's defaults + cfgs/imagenet_others/{self.yaml} + the options "
                  + f"(argv{', CKPT_DIR a temporary folder' if self.ckpt else ''}), then model(batch) under "
                  + "torch.no_grad() per consecutive batch, as get_accuracy does")
        meta = {"variant": self.variant, "model": self.model_name, "batch_size": BATCH, "argv": argv, **(head or {}),
                "n_samples": n, "n_batches": -(-n // BATCH), "template": TEMPLATE,
                "reference": reference(self.checkout), "adapted": [p[len(VISUAL):] for p in self.adapted],
                "collected_not_visual": [p for p in self.collected if not p.startswith(VISUAL)], **(tail or {}),
                "called": called, "patches": self.patches + list(patches)}
        return recorded(self.out, meta, self.seen)


def clip_split(base):
    """CLIP's (feature extractor, classifier) over their ZeroShotCLIP `base`: its forward, cut at the features."""
    def features(x):
        f = base.model.encode_image(base.normalize(x.type(base.dtype)))
        return f / f.norm(dim=1, keepdim=True)

    def classifier(f):
        return base.logit_scale.exp() * f @ base.text_features.T
    return features, classifier


def without_source(stream: TheirStream, name: str):
    """Their `name` (rmt, santa: methods that ask for the source data, then refuse CLIP's architecture names in
    `split_up_model`) built on `stream` with `split_up_model` -> CLIP's split and `get_source_loader` -> 200 random
    64 px images labelled 0..199 (only their source prototypes come from it, for a contrastive term the driver's
    options weigh 0). Returns the method (`stream.use`d)."""
    import importlib

    import torch
    n_classes = stream.n_classes
    source_images = torch.rand(n_classes, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    source_loader = [(source_images[i:i + 50], torch.arange(i, min(i + 50, n_classes)))
                     for i in range(0, n_classes, 50)]
    package("datasets", stream.checkout / "tta" / "classification" / "datasets")
    data_loading = types.ModuleType("datasets.data_loading")
    data_loading.get_source_loader = lambda **kw: (None, source_loader)
    sys.modules["datasets.data_loading"] = data_loading
    import models.model as their_model
    split = their_model.split_up_model
    their_model.split_up_model = lambda model, arch, dataset: clip_split(model)
    try:
        importlib.import_module(f"methods.{name}").split_up_model = their_model.split_up_model
        model = their_method(name, name, stream.cfg, stream.base, n_classes)
    finally:
        their_model.split_up_model = split
    stream.patches += [f"methods.{name}.split_up_model -> CLIP's split (ZeroShotCLIP's forward cut at the unit image "
                       "features; theirs refuses CLIP architectures)",
                       "datasets.data_loading.get_source_loader -> 200 random images labelled 0..199 (the source "
                       "prototypes of the contrastive term, weighted 0)"]
    return stream.use(name, model)

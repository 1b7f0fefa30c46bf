"""What every golden driver does around the authors' code: the golden inputs, the patches applied from outside,
the capture of what their functions computed, and the command line that writes the fixture with its provenance
(the authors' commit and the command). tests/fixtures/golden/README.md, "Writing a driver", shows a driver built
on it; a family of drivers over one repository adds its own module beside this one (cliptta.py, mariodoebler.py).

A driver runs each variant in a process of its own (their modules patch torch on import and hold globals):
`variants_main` writes `<variant>.pt` per variant, `merged_variants_main` one `<folder>.pt` of every variant's keys.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.machinery
import json
import os
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable, Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))        # tests/_golden.py (imported where needed: it imports torch)

MEAN, STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
GENERATED_WITH = {"threads": 1, "device": "cpu", "dtype": "float32"}
# what a fixture's provenance says of the model and the inputs it ran on
TINY_CLIP = "tests/fixtures/golden tiny_clip_compact.pt (rebuilt by tests/_golden.materialize)"
TINY_VIT = "tests/fixtures/golden tiny_vit_compact.pt (rebuilt by tests/_golden.materialize)"
TINY_CLIP_INPUTS = "tests/fixtures/golden/inputs_uint8.pt (4 samples x 32 views, 64 px)"


# -- inputs -----------------------------------------------------------------------------------

def classnames(golden: Path) -> list[str]:
    """The 200 golden class names (ImageNet-R's, in the references' order)."""
    return json.loads((golden / "golden.json").read_text())["classnames"]


def unit_views(base_u8, n_views: int):
    import _golden as G
    return G.crop_views(base_u8, n_views).float() / 255


def clip_normalize(x):
    import torchvision.transforms as T
    return T.Normalize(MEAN, STD)(x)


def stream_images(golden: Path, normalize: bool = True):
    """The golden stream's 24 images, view 0 (the centre 64x64 crop): (24, 3, 64, 64), CLIP-normalised or in [0, 1]."""
    import torch
    bases = torch.load(golden / "online" / "stream.pt", weights_only=True)["base_u8"]
    return torch.cat([(clip_normalize if normalize else lambda x: x)(unit_views(base, 1)[0])[None] for base in bases])


def golden_views(golden: Path):
    """The golden inputs' 4 samples x 32 views in [0, 1]: (4, 32, 3, 64, 64), view 0 the centre crop."""
    import torch
    return torch.load(golden / "inputs.pt", weights_only=True)["views_unit"]


def view_lists(samples, labels=None, normalize: bool = True) -> list:
    """What a TPT-style loader yields at batch 1, per sample: ([each view as (1, 3, S, S)], tensor([label])).
    `samples`: (N, V, 3, S, S) or N tensors (V, 3, S, S) in [0, 1], CLIP-normalised unless told; labels 0 unless
    given."""
    import torch
    prepare = clip_normalize if normalize else (lambda x: x)
    return [([prepare(v).unsqueeze(0) for v in views], torch.tensor([0 if labels is None else int(labels[i])]))
            for i, views in enumerate(samples)]


def batches(images, size: int):
    """(b, images[b*size:(b+1)*size]) per consecutive batch b, the last one shorter."""
    for b, start in enumerate(range(0, images.shape[0], size)):
        yield b, images[start:start + size]


def batch_meta(images, size: int) -> dict:
    """The meta every batch driver records: batch size, samples, batches."""
    n = int(images.shape[0])
    return {"batch_size": size, "n_samples": n, "n_batches": -(-n // size)}


# -- patches applied from outside --------------------------------------------------------------

def stub_modules(*names: str) -> None:
    """Logging-only imports of the authors' code (never used for a number)."""
    for name in names:
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        mod.log = lambda *a, **k: None
        mod.init = lambda *a, **k: types.SimpleNamespace(finish=lambda: None)
        mod.set_trace = lambda *a, **k: None
        sys.modules[name] = mod


def cpu_float32() -> list[str]:
    import packaging.version
    import torch
    sys.modules.setdefault("pkg_resources", types.SimpleNamespace(packaging=packaging))  # their clip.py's import
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self
    torch.Tensor.half = lambda self, *a, **k: self.float()
    torch.cuda.amp.autocast = lambda *a, **k: contextlib.nullcontext()
    torch.set_num_threads(1)
    return ["pkg_resources -> a stand-in exposing `packaging` (setuptools is not installed)",
            "torch.Tensor.cuda / torch.nn.Module.cuda -> identity (CPU)",
            "torch.Tensor.half -> float32 (the run is float32 throughout)",
            "torch.cuda.amp.autocast -> nullcontext", "torch.set_num_threads(1)"]


class _StateDictArchive:
    """What the authors' clip.load needs from torch.jit.load (DMN's and R-TPT's accept JIT archives only)."""

    def __init__(self, path, map_location=None):
        import torch
        self.state = torch.load(path, map_location="cpu", weights_only=True)

    def eval(self):
        return self

    def state_dict(self):
        return self.state


def jit_load_reads_state_dicts() -> str:
    import torch
    torch.jit.load = _StateDictArchive
    return ("torch.jit.load -> an object whose state_dict() is the tiny CLIP's state dict (their clip.load "
            "accepts JIT archives only, then rebuilds the model from model.state_dict())")


def enter(checkout: Path) -> None:
    sys.path.insert(0, str(checkout))
    os.chdir(checkout)


# -- capture: wrap their functions, record what they computed ------------------------------------

def after_call(owner, name: str, record: Callable[..., None]) -> Callable:
    """Replace `owner.name` by a function that calls the original and then `record(result, *args, **kwargs)`,
    returning the original's result unchanged; returns the original."""
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        record(result, *args, **kwargs)
        return result
    setattr(owner, name, wrapped)
    return original


def record_values(out: dict, prefix: str, values: dict, names: Iterable[str]) -> None:
    """`out[prefix/name]` = `values[name]`, detached and cloned, for each of `names` whose value is not None: the
    adapted parameters after a batch (`values` = dict(module.named_parameters())), a method's state."""
    for name in names:
        if values.get(name) is not None:
            out[f"{prefix}/{name}"] = values[name].detach().clone()


def record_tokens(clip_module) -> list:
    """Every token tensor `clip_module.tokenize` returns from now on (for the compact model's token check)."""
    seen: list = []
    after_call(clip_module, "tokenize", lambda out, *a, **k: seen.append(out.clone()))
    return seen


def record_clip_tokens() -> tuple:
    """Their top-level `clip` package (on sys.path): `clip.clip.tokenize` recorded by `record_tokens`, and the
    package's `clip.tokenize` the recording one too (their code calls either). Returns (clip.clip, the tokens)."""
    import clip as package
    from clip import clip as module
    seen = record_tokens(module)
    package.tokenize = module.tokenize
    return module, seen


def all_tokens(seen: list):
    import torch
    return torch.unique(torch.cat([t.flatten() for t in seen])) if seen else torch.zeros(0, dtype=torch.int64)


def recorded(tensors: dict, meta: dict, seen: list) -> dict:
    """What a driver's `run(checkout, golden, variant)` returns to the command line."""
    return {"tensors": tensors, "meta": meta, "tokens": all_tokens(seen)}


# -- the command line: one process per variant, then the fixture and its provenance --------------

def checkout_commit(path: str) -> str | None:
    """The commit of a git checkout (None for a `git archive` export: pass --commit)."""
    try:
        return subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def _arguments(checkout_help: str, description: str | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkout", required=True, help=checkout_help)
    ap.add_argument("--commit", help="the commit, when the checkout is a `git archive` export")
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--golden", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    return ap.parse_args()


def _kept_tokens(model_file: str) -> set[int]:
    import torch

    import _golden as G
    return set(torch.load(G.FIXTURES / model_file, weights_only=True)[G.INDEX_KEY].tolist())


def tokens_not_kept(seen: list, model_file: str) -> int:
    """How many distinct tokens of the recorded prompts (`record_tokens`) the compact `model_file` does not keep."""
    return len(set(all_tokens(seen).tolist()) - _kept_tokens(model_file))


def save_variant(here: Path, variant: str, res: dict) -> None:
    """A variant's process: its tensors to `<variant>.pt`, its tokens and meta beside for `run_variants`."""
    import torch
    torch.save(res["tensors"], here / f"{variant}.pt")
    (here / f"{variant}.tokens.json").write_text(json.dumps(res["tokens"].tolist()))
    (here / f"{variant}.meta.json").write_text(json.dumps(res["meta"], indent=1, default=str))


def run_variants(driver: str, argv: list[str], variants: Iterable[str], golden: Path, model_file: str) -> dict:
    """Runs `driver *argv --variant V --golden golden` per variant (each saves with `save_variant`); the prompts'
    tokens must be kept by the compact `model_file`. Returns per variant its meta and the SHA-256 of its tensors."""
    import _golden as G
    here, kept = Path(driver).resolve().parent, _kept_tokens(model_file)
    model = "tiny ViT" if model_file == G.COMPACT_VIT_FILE else "tiny CLIP"
    fixtures = {}
    for variant in variants:
        subprocess.run([sys.executable, driver, *argv, "--variant", variant, "--golden", str(golden)], check=True)
        meta = json.loads((here / f"{variant}.meta.json").read_text())
        tokens = json.loads((here / f"{variant}.tokens.json").read_text())
        (here / f"{variant}.meta.json").unlink()
        (here / f"{variant}.tokens.json").unlink()
        if not set(tokens) <= kept:
            raise SystemExit(f"{variant}: prompts use tokens the compact {model} does not keep")
        meta["sha256"] = hashlib.sha256((here / f"{variant}.pt").read_bytes()).hexdigest()
        fixtures[variant] = meta
    return fixtures


def variants_main(driver: str, run: Callable[[Path, Path, str], dict], variants: Iterable[str], repository: str,
                  description: str | None = None, model: str = TINY_VIT) -> None:
    """The driver's `main()`: `run(checkout, golden_dir, variant)` returns `recorded(...)`; writes `<variant>.pt`
    per variant and `<folder>.json` (the reference, the model (`model` says which), the stream, the command, per
    variant its meta and the SHA-256 of its tensors). The prompts' tokens must be kept by the compact tiny ViT."""
    here = Path(driver).resolve().parent
    args = _arguments(f"a checkout or `git archive` export of {repository}", description)
    import torch

    import _golden as G
    if args.variant:                # one variant per process: their modules patch torch
        torch.set_num_threads(1)
        save_variant(here, args.variant, run(Path(args.checkout).resolve(), Path(args.golden), args.variant))
        return
    golden = G.materialize(Path(tempfile.mkdtemp(prefix="golden-")))
    info = {"reference": {"repository": repository, "commit": args.commit or checkout_commit(args.checkout)},
            "model": model, "stream": "tests/fixtures/golden/online/stream.pt",
            "command": f"python tests/fixtures/golden/{here.name}/driver.py --checkout CHECKOUT --commit SHA",
            "fixtures": run_variants(driver, ["--checkout", args.checkout], variants, golden, G.COMPACT_VIT_FILE)}
    (here / f"{here.name}.json").write_text(json.dumps(info, indent=1) + "\n")


def merged_variants_main(driver: str, run: Callable[[Path, Path, str], dict], variants: Iterable[str],
                         provenance: Callable[[str | None], dict], description: str | None = None,
                         checkout_help: str = "a checkout (or `git archive` export) of the authors' repository",
                         model_file: str | None = None) -> None:
    """The driver's `main()` for a fixture of one file: `run(checkout, golden_dir, variant)` returns `recorded(...)`
    with keys of its own; writes `<folder>.pt` (every variant's keys) and `<folder>.json`: `provenance(commit)`
    (the reference, the model, the inputs, the command: what precedes "generated_with"; commit: --commit or the
    checkout's), then `generated_with`, per variant its meta under `fixtures`, and the SHA-256 of the file. The
    prompts' tokens must be kept by `model_file` (the compact tiny CLIP's file unless told)."""
    here = Path(driver).resolve().parent
    args = _arguments(checkout_help, description)
    os.environ.setdefault("OMP_NUM_THREADS", "1")       # before torch is imported, here and in each variant's process
    import torch

    import _golden as G
    if args.variant:                # one variant in its own process: their modules patch torch
        res = run(Path(args.checkout).resolve(), Path(args.golden), args.variant)
        torch.save(res["tensors"], args.result)
        Path(args.result + ".json").write_text(json.dumps({**res["meta"], "tokens": res["tokens"].tolist()}))
        return
    tmp = Path(tempfile.mkdtemp(prefix=f"{here.name}-golden-"))
    golden = G.materialize(tmp / "golden")
    kept = _kept_tokens(model_file or G.COMPACT_MODEL_FILE)
    info = {**provenance(args.commit or checkout_commit(args.checkout)),
            "generated_with": {"torch": torch.__version__, **GENERATED_WITH}, "fixtures": {}}
    tensors: dict = {}
    for variant in variants:
        result = str(tmp / f"{variant}.pt")
        subprocess.run([sys.executable, driver, "--checkout", args.checkout, "--variant", variant,
                        "--golden", str(golden), "--result", result], check=True)
        tensors.update(torch.load(result, weights_only=True))
        meta = json.loads(Path(result + ".json").read_text())
        if not set(meta.pop("tokens")) <= kept:
            raise SystemExit(f"{variant}: prompts use tokens the compact tiny CLIP does not keep")
        info["fixtures"][variant] = meta
    torch.save(tensors, here / f"{here.name}.pt")
    info["sha256"] = hashlib.sha256((here / f"{here.name}.pt").read_bytes()).hexdigest()
    (here / f"{here.name}.json").write_text(json.dumps(info, indent=1) + "\n")

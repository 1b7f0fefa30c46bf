"""What the golden drivers over TTABC (github.com/walawalagoose/TTABC, `ttabc/model_selection/<method>.py`) share: BCA,
HisTPT. TTABC could not be fetched as a repository; its files were read from the public-code index at the commit each
was stored at and written unmodified into CHECKOUT/ttabc/ (their SHA-256 in the fixture's json). TTABC's `clip/` is
not in the index whole, so the model is TPT's `ClipTestTimeTuning` (`get_coop`) from A-TPT's copy of TPT's `clip/`
(CHECKOUT/atpt/, a `git archive` of MB-Shihab-Aaqil-Ahamed/A-TPT@d76ecf6), the code TTABC's is built on.

Their `BaseMethod.__init__` calls `ttabc.utils.load_model.create_model` and `set_optimizer`: `give_load_model` puts a
driver's pair in their place; `coop_model` is the CoOp model TTABC's load_model builds for prompt_type 'coop'.
"""
from __future__ import annotations

import hashlib
import sys
import types
from collections.abc import Callable
from pathlib import Path

from harness import TINY_CLIP, cpu_float32, enter, jit_load_reads_state_dicts, stub_modules
from prompt_tuning import openai_bpe_vocab

REPOSITORY = "https://github.com/walawalagoose/TTABC"
MODEL_CODE = {"repository": "https://github.com/MB-Shihab-Aaqil-Ahamed/A-TPT",
              "commit": "d76ecf61692f1355b7e27e0ea5b54add279ffb67", "path": "clip/"}
CHECKOUT_HELP = "a folder holding ttabc/ (TTABC's files) and atpt/ (A-TPT)"
RESULT_DICT = ("max_confidence", "prediction", "label")     # what their test_time_adapt_eval appends to


def import_tpt_clip(checkout: Path, method: str) -> tuple[list[str], types.ModuleType]:
    """On the CPU in float32, `ipdb` stubbed, torch.amp.autocast off; A-TPT's `clip.custom_clip` imported from
    CHECKOUT/atpt (the cwd), CHECKOUT on sys.path for `ttabc`. Returns (the patches so far, custom_clip)."""
    import contextlib

    import torch
    stub_modules("ipdb")
    patches = cpu_float32() + [jit_load_reads_state_dicts(), "ipdb -> a stub (imported for debugging only)"]
    torch.amp.autocast = lambda *a, **k: contextlib.nullcontext()
    patches.append(f"torch.amp.autocast -> nullcontext (their {method}.py's autocast(device_type='cuda'))")
    openai_bpe_vocab(checkout / "atpt" / "clip")
    enter(checkout / "atpt")
    sys.path.insert(0, str(checkout))
    import clip.custom_clip as tpt_clip
    return patches, tpt_clip


def give_load_model(create_model: Callable, set_optimizer: Callable) -> None:
    """`ttabc.utils.load_model` (not in the index) -> a module of these two functions, as their BaseMethod imports."""
    load_model = types.ModuleType("ttabc.utils.load_model")
    load_model.create_model, load_model.set_optimizer = create_model, set_optimizer
    sys.modules["ttabc.utils.load_model"] = load_model


def coop_model(tpt_clip, args):
    """TTABC's load_model for prompt_type 'coop': `get_coop(arch, test_sets, gpu, n_ctx, ctx_init)`, everything but
    the prompt learner frozen. Returns (model, None), as their create_model."""
    model = tpt_clip.get_coop(args.arch, args.test_sets, args.gpu, args.n_ctx, args.ctx_init)
    for name, param in model.named_parameters():
        if "prompt_learner" not in name:
            param.requires_grad_(False)
    model.ang_norm_cal = False      # A-TPT's copy of TPT's model reads it in inference; TPT's has no such term
    return model, None


def stream_loader(golden: Path, n_views: int, as_list: bool = True) -> list:
    """Their loader over the golden stream's 24 samples: `n_views` views each (tests/_golden.crop_views,
    CLIP-normalised), as a list of (1, 3, H, W) views (their tpt mode) or view 0 alone; the label 0."""
    import torch
    from harness import clip_normalize, unit_views
    bases = torch.load(golden / "online" / "stream.pt", weights_only=True)["base_u8"]
    views = [clip_normalize(unit_views(base, n_views)) for base in bases]
    return [([v.unsqueeze(0) for v in sample] if as_list else sample[:1], torch.tensor([0])) for sample in views]


def files_sha256(checkout: Path, files: dict) -> dict:
    return {p: hashlib.sha256((checkout / p).read_bytes()).hexdigest() for p in files}


def provenance(name: str, files: dict, inputs: str) -> Callable[[str | None], dict]:
    """`merged_variants_main`'s provenance of a TTABC fixture: the files read from the index, the model's code."""
    def info(commit: str | None) -> dict:
        return {"reference": {"repository": REPOSITORY, "files": files,
                              "read_from": "the public-code index (the repository could not be fetched)",
                              "model_code": MODEL_CODE},
                "model": TINY_CLIP, "inputs": inputs,
                "command": f"python tests/fixtures/golden/{name}/driver.py --checkout CHECKOUT"}
    return info

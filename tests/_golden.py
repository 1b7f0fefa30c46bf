"""The golden fixtures as tracked (compact, lossless for what the tests compute) and as the tests read them.

tests/fixtures/golden/ stores two files in a compact form (see its README, "Provenance"):
  * ``tiny_clip_compact.pt``: the tiny CLIP's OpenAI-format state dict without the 49408x64 token
    embedding, plus the rows of the tokens that the fixtures' prompts use and their indices;
  * ``inputs_uint8.pt``: the views as uint8 (every value was k/255).
``materialize(dst)`` writes the files the golden tests load (tiny_clip_openai.pt, inputs.pt and
the rest copied as they are) into ``dst``: the token embedding is rebuilt with zero rows for the
tokens no fixture uses, the views as float32 k/255.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "golden"
TOKEN_KEY = "token_embedding.weight"
ROWS_KEY = "compact/token_embedding.rows"
INDEX_KEY = "compact/token_embedding.index"
SHAPE_KEY = "compact/token_embedding.shape"
MODEL_FILE, COMPACT_MODEL_FILE = "tiny_clip_openai.pt", "tiny_clip_compact.pt"
INPUTS_FILE, COMPACT_INPUTS_FILE = "inputs.pt", "inputs_uint8.pt"


def compact_state_dict(state: dict[str, torch.Tensor], tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """``state`` with the token embedding reduced to the rows of ``tokens`` (any shape of token ids)."""
    index = torch.unique(tokens.flatten()).to(torch.int64)
    table = state[TOKEN_KEY]
    out = {k: v for k, v in state.items() if k != TOKEN_KEY}
    out[ROWS_KEY] = table[index].clone()
    out[INDEX_KEY] = index
    out[SHAPE_KEY] = torch.tensor(table.shape, dtype=torch.int64)
    return out


def full_state_dict(compact: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of ``compact_state_dict``: zero rows for the tokens that were dropped."""
    rows, index = compact[ROWS_KEY], compact[INDEX_KEY]
    table = torch.zeros(tuple(compact[SHAPE_KEY].tolist()), dtype=rows.dtype)
    table[index] = rows
    state = {k: v for k, v in compact.items() if not k.startswith("compact/")}
    state[TOKEN_KEY] = table
    return state


def compact_inputs(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    unit = inputs["views_unit"]
    as_uint8 = torch.round(unit * 255).to(torch.uint8)
    if not torch.equal(as_uint8.float() / 255, unit):
        raise ValueError("views_unit holds values that are not k/255; uint8 storage would lose them")
    return {"views_uint8": as_uint8, **{k: v for k, v in inputs.items() if k != "views_unit"}}


def full_inputs(compact: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # float32 division by 255 is what ToTensor() does, so this is bit-identical to the original
    return {"views_unit": compact["views_uint8"].float() / 255,
            **{k: v for k, v in compact.items() if k != "views_uint8"}}


def materialize(dst: Path, src: Path = FIXTURES) -> Path:
    """Write the golden folder the tests read (the format of the original fixtures) into ``dst``."""
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_dir():
            shutil.copytree(item, dst / item.name, dirs_exist_ok=True)
        elif item.name not in (COMPACT_MODEL_FILE, COMPACT_INPUTS_FILE):
            shutil.copyfile(item, dst / item.name)
    compact = torch.load(src / COMPACT_MODEL_FILE, map_location="cpu", weights_only=True)
    torch.save(full_state_dict(compact), dst / MODEL_FILE)
    compact_in = torch.load(src / COMPACT_INPUTS_FILE, map_location="cpu", weights_only=True)
    torch.save(full_inputs(compact_in), dst / INPUTS_FILE)
    return dst


def tensor_sha256(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's raw bytes (dtype and shape are checked separately)."""
    import hashlib
    return hashlib.sha256(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


# -- the online fixtures' inputs: integer crops of small base images (exact, no resampling) -------

VIEW_SIZE = 64
# Tip-Adapter's 7 ImageNet templates: the template half of DMN's `tip_cupl` text head
TIP_TEMPLATES = ["a bad photo of the {}.", "a {} in a video game.", "a origami {}.", "a photo of the small {}.",
                 "art of the {}.", "a photo of the large {}.", "itap of a {}."]


def crop_views(base_u8: torch.Tensor, n_views: int, size: int = VIEW_SIZE) -> torch.Tensor:
    """(3, H, W) uint8 -> (n_views, 3, size, size) uint8: view 0 the centre crop; view v >= 1 the
    crop at offset (p // (m + 1), p mod (m + 1)) with p = 5 v mod (m + 1)^2, m = H - size,
    mirrored for odd v. No two views are equal (for n_views <= (m + 1)^2), so no two have
    exactly equal entropies, where the authors' unstable argsort could order either way."""
    margin = base_u8.shape[-1] - size
    side = margin + 1
    views = []
    for v in range(n_views):
        p = (5 * v) % (side * side)
        y, x = (margin // 2, margin // 2) if v == 0 else (p // side, p % side)
        crop = base_u8[:, y:y + size, x:x + size]
        views.append(crop.flip(-1) if v % 2 else crop)
    return torch.stack(views)


def online_fixture(golden_dir: Path, name: str) -> tuple[dict[str, torch.Tensor], dict]:
    """One online fixture (tensors, its provenance record) from golden_dir/online."""
    import json
    info = json.loads((golden_dir / "online" / "online.json").read_text())["fixtures"][name]
    return torch.load(golden_dir / "online" / f"{name}.pt", map_location="cpu", weights_only=True), info


def stream_views(golden_dir: Path, n_views: int) -> list[torch.Tensor]:
    """The online fixtures' stream: per sample, (n_views, 3, 64, 64) float views in [0, 1]."""
    stream = torch.load(golden_dir / "online" / "stream.pt", weights_only=True)
    return [crop_views(base, n_views).float() / 255 for base in stream["base_u8"]]

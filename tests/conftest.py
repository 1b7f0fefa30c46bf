"""Shared fixtures: a tiny random CLIP, the golden folder, synthetic data."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import shiftlab

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(os.environ.get("SHIFTLAB_GOLDEN", REPO.parent / "shared" / "golden"))

# The golden fixtures' architecture: ModifiedResNet (1,1,1,1) width 16 at 64x64, 2-layer text tower.
TINY_CONFIG = {
    "embed_dim": 32,
    "quick_gelu": True,
    "vision_cfg": {"image_size": 64, "layers": [1, 1, 1, 1], "width": 16, "patch_size": None},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 1, "layers": 2},
}


def make_tiny_model(seed: int = 0) -> shiftlab.ClipModel:
    torch.manual_seed(seed)
    return shiftlab.load_model("shiftlab-tiny", None, model_config=TINY_CONFIG)


@pytest.fixture(scope="session")
def tiny_model() -> shiftlab.ClipModel:
    return make_tiny_model()


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    if not (GOLDEN / "expected.pt").is_file():
        pytest.skip(f"golden fixtures not found at {GOLDEN} (set SHIFTLAB_GOLDEN); CI always has ../shared/golden")
    return GOLDEN


@pytest.fixture(autouse=True)
def _deterministic_threads():
    # The golden values were produced with one thread; thread count changes float rounding.
    prev = torch.get_num_threads()
    yield
    torch.set_num_threads(prev)

"""`torch.load` of a file a method's setting names (a prompt checkpoint, token statistics), its failure one line."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def read_torch_file(path: str | Path, what: str, weights_only: bool = True) -> Any:
    """`torch.load(path)` onto the CPU; a file torch cannot read (no torch file, truncated, empty) is a one-line
    ValueError "`what` `path` cannot be read as a torch file (its error's type)": torch.load's own error runs over
    many lines of advice about weights_only that are no use to whoever named the wrong file."""
    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only)
    except Exception as exc:
        raise ValueError(f"{what} {path} cannot be read as a torch file ({type(exc).__name__})") from None

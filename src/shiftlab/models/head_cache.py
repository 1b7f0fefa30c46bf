"""Class heads kept on disk, so that a second run builds none (CLIP's 80 templates x 1000 classes
are 80,000 prompts through the text tower: minutes on a CPU).

An entry is keyed by everything that decides the head: a digest of the text tower's weights (as
held, dtype included), the device type, the prompts in order (templates x class names) and
`HEAD_VERSION`. A key that does not match is never read; a damaged file is rebuilt. Entries are
safetensors files written atomically (temporary file + rename), so concurrent runs and ranks may
share the folder.

Folder: `$SHIFTLAB_CACHE/heads` (default `~/.cache/shiftlab/heads`); `SHIFTLAB_HEAD_CACHE=0` turns
the cache off. Only heads of at least `MIN_PROMPTS` prompts are kept (smaller ones cost less to
build than to look up).
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn as nn

from .. import writes

HEAD_VERSION = 1
MIN_PROMPTS = 2000
_TEXT_PREFIXES = ("token_embedding.", "positional_embedding", "transformer.", "ln_final.", "text_projection",
                  "text.")


def cache_dir() -> Path | None:
    """Where heads are kept, or None when SHIFTLAB_HEAD_CACHE=0."""
    if os.environ.get("SHIFTLAB_HEAD_CACHE", "1") == "0":
        return None
    root = os.environ.get("SHIFTLAB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "shiftlab")
    return Path(root) / "heads"


def text_tower_digest(clip: nn.Module) -> str:
    """SHA-256 over the text tower's tensors (names, dtypes, shapes, bytes), computed once per module."""
    cached = clip.__dict__.get("_shiftlab_text_digest")
    if cached is not None:
        return cached
    h = hashlib.sha256()
    for name, t in sorted(clip.state_dict().items()):
        if name.startswith(_TEXT_PREFIXES):
            t = t.detach().contiguous().cpu()
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    clip.__dict__["_shiftlab_text_digest"] = digest = h.hexdigest()
    return digest


def head_key(clip: nn.Module, device: torch.device, prompts: Sequence[str]) -> str:
    h = hashlib.sha256(f"v{HEAD_VERSION}:{text_tower_digest(clip)}:{device.type}:{len(prompts)}".encode())
    for p in prompts:
        h.update(p.encode("utf-8") + b"\x1f")
    return h.hexdigest()


def cached_head(clip: nn.Module, device: torch.device, prompts: Sequence[str],
                build: Callable[[], torch.Tensor]) -> torch.Tensor:
    """`build()` (a head for `prompts`), read from the cache when an entry for the same key exists."""
    folder = cache_dir()
    if folder is None or len(prompts) < MIN_PROMPTS:
        return build()
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save
    path = folder / f"{head_key(clip, device, prompts)}.safetensors"
    if path.is_file():
        try:
            return load_file(str(path))["head"].to(device)
        except (SafetensorError, OSError, KeyError, ValueError):
            pass   # damaged or truncated: rebuilt and rewritten below
    head = build()
    try:
        writes.make_dirs(folder)
        writes.clean_orphans(folder)
        writes.write_file(path, save({"head": head.detach().contiguous().cpu()}))
    except OSError:
        pass   # a read-only or full cache folder costs the next run the build, nothing else
    return head

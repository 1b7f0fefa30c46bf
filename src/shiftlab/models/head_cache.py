"""Class heads kept on disk, so that a second run builds none (CLIP's 80 templates x 1000 classes
are 80,000 prompts through the text tower: minutes on a CPU).

An entry is keyed by everything that decides the head: a digest of the text tower's weights (as
held, dtype included), the device type, the prompts in order (templates x class names) and
`HEAD_VERSION`. A key that does not match is never read. Each file carries its key and the SHA-256
of its tensor's bytes in its safetensors metadata, both checked on every load: bytes flipped inside
the tensor (a header that still parses), a truncated file, or another key's intact file copied
under this key's name give one warning line naming the file, and the head is rebuilt and rewritten
(as the feature store binds its rows to their keys). Entries are safetensors files written atomically (temporary file +
rename), so concurrent runs and ranks may share the folder; a cache folder that cannot be written
costs one line, and the head is built in memory.

Folder: `$SHIFTLAB_CACHE/heads` (default `~/.cache/shiftlab/heads`); `SHIFTLAB_HEAD_CACHE=0` turns
the cache off. Only heads of at least `MIN_PROMPTS` prompts are kept (smaller ones cost less to
build than to look up).
"""
from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn as nn

from .. import writes

HEAD_VERSION = 3   # 2: the tensor's SHA-256 in the file's metadata; 3: its key there too
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


def tensor_digest(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes, its dtype and shape."""
    t = t.detach().contiguous().cpu()
    h = hashlib.sha256(f"{t.dtype}:{tuple(t.shape)};".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _warn(msg: str) -> None:
    print(f"shiftlab: warning: {msg}", file=sys.stderr, flush=True)


def _load(path: Path, key: str) -> torch.Tensor | None:
    """The head stored in `path` when it was written for `key` and its bytes are those its digest names;
    None (said) otherwise."""
    from safetensors import SafetensorError, safe_open
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as fh:
            metadata = fh.metadata() or {}
            head = fh.get_tensor("head").clone()   # its own aligned memory, as load_file gives: BLAS kernels
            # round differently on a buffer at the file's offset, and records must not depend on the cache
    except (SafetensorError, OSError, KeyError, ValueError, RuntimeError):
        _warn(f"class-head cache: {path} is damaged or truncated; the head is built again")
        return None
    if metadata.get("key") != key:
        _warn(f"class-head cache: {path} holds the head of another key (a file copied or renamed); the head is "
              "built again")
        return None
    if metadata.get("sha256") != tensor_digest(head):
        _warn(f"class-head cache: {path} does not match its digest (damaged bytes); the head is built again")
        return None
    return head


def cached_head(clip: nn.Module, device: torch.device, prompts: Sequence[str],
                build: Callable[[], torch.Tensor]) -> torch.Tensor:
    """`build()` (a head for `prompts`), read from the cache when an intact entry for the same key exists."""
    folder = cache_dir()
    if folder is None or len(prompts) < MIN_PROMPTS:
        return build()
    from safetensors.torch import save
    key = head_key(clip, device, prompts)
    path = folder / f"{key}.safetensors"
    head = _load(path, key)
    if head is not None:
        return head.to(device)
    head = build()
    try:
        writes.make_dirs(folder)
        writes.clean_orphans(folder)
        stored = head.detach().contiguous().cpu()
        writes.write_file(path, save({"head": stored}, metadata={"key": key, "sha256": tensor_digest(stored)}))
    except OSError as exc:   # read-only or full: this run keeps the head in memory, the next builds it again
        _warn(f"class-head cache: cannot write {folder} ({getattr(exc, 'strerror', None) or exc}); the head is "
              "kept in memory only (set SHIFTLAB_CACHE to a writable folder, or SHIFTLAB_HEAD_CACHE=0)")
    return head

"""Checkpoint files: reading them safely, naming what is wrong with them, finding cached weights.

Every failure is a `ModelLoadError` with a one-line message that says what the file is
(missing, corrupt, a pickle holding Python objects, the wrong architecture) and what to do.
Only a file that is a valid pickle holding non-tensor objects is "untrusted" and met with
the advice to pass --trust-checkpoint; a truncated or garbage file is "corrupt" (download it
again). Nothing in a refused file is ever run to tell the two apart: its pickle is parsed.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pickle
import re
import zipfile
from pathlib import Path

import torch

from ..options import say

# Buffers of OpenAI's TorchScript archives that are facts, not weights.
OPENAI_SCALARS = ("input_resolution", "context_length", "vocab_size")


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says what to download or pass."""


def sha256_file(path: str | Path, chunk_bytes: int = 1 << 20) -> str:
    """SHA-256 of a file, streamed (a 1 GB checkpoint never sits in memory twice)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()


def _first_line(exc: BaseException, limit: int = 200) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:limit]


def _corrupt(path: Path, what: str, exc: BaseException | None = None) -> ModelLoadError:
    detail = f" ({type(exc).__name__}: {_first_line(exc)})" if exc is not None else ""
    return ModelLoadError(f"{path}: corrupt checkpoint: {what}{detail}; download it again")


def _is_torchscript(zf: zipfile.ZipFile) -> bool:
    return any(n.endswith("/constants.pkl") or n == "constants.pkl" for n in zf.namelist())


def _unsafe_globals(exc: BaseException) -> list[str]:
    """The Python objects torch's weights-only unpickler refused, if that is why it failed
    ("Unsupported global: GLOBAL x", "Trying to load unsupported GLOBAL x whose module ... is
    blocked", by torch version)."""
    return re.findall(r"GLOBAL ([\w.]+)", str(exc))


_OBJECT_OPS = frozenset({"GLOBAL", "STACK_GLOBAL", "REDUCE", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "BUILD"})
_SAFE_MODULES = ("torch.", "collections.OrderedDict", "builtins.set", "builtins.frozenset")


def _pickle_stream(path: Path) -> bytes | None:
    """The pickle holding the checkpoint's object: data.pkl of a zip checkpoint, else the file."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if n.endswith("data.pkl")]
            return zf.read(names[0]) if names else None
    return path.read_bytes()


def _pickled_objects(path: Path) -> list[str] | None:
    """Parse (never run) the checkpoint's pickle: None if it is not a well-formed pickle (a
    corrupt file), else the non-tensor globals it names (an empty list: it builds objects by
    other instructions). A legacy checkpoint's first pickle is its magic number; a plain
    pickle's is the object itself."""
    import io
    import pickletools
    try:
        data = _pickle_stream(path)
        if data is None:
            return None
        names, strings, objects = [], [], False
        for op, arg, _ in pickletools.genops(io.BytesIO(data)):
            if op.name == "GLOBAL":
                names.append(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                names.append(f"{strings[-2]}.{strings[-1]}")
            elif isinstance(arg, str):
                strings.append(arg)
            objects |= op.name in _OBJECT_OPS
    except Exception:   # ValueError from genops on bytes that are not a pickle, zip errors, ...
        return None
    if not objects:
        return None
    return sorted({n for n in names if not n.startswith(_SAFE_MODULES)})


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise _corrupt(path, "not a readable .safetensors file (bad header or truncated)", exc) from exc


def _read_torchscript(path: Path) -> dict[str, torch.Tensor]:
    """OpenAI's released .pt files are TorchScript archives: `torch.jit.load` rebuilds only
    tensors and TorchScript code, never arbitrary Python objects."""
    try:
        return dict(torch.jit.load(str(path), map_location="cpu").state_dict())
    except Exception as exc:  # torch.jit raises RuntimeError subclasses with multi-page messages
        raise _corrupt(path, "damaged TorchScript archive", exc) from exc


def _untrusted(path: Path, objects: list[str]) -> ModelLoadError:
    held = f" ({', '.join(objects)})" if objects else ""
    return ModelLoadError(
        f"{path}: untrusted pickle: the checkpoint holds Python objects beyond plain tensors{held}, and "
        f"loading them could run code from the file; pass {say('trust_checkpoint')} if you trust this file")


def read_pickle(path: Path, trust_checkpoint: bool) -> object:
    """A torch-saved file, read weights-only; one holding other Python objects is `untrusted` (a ModelLoadError) unless
    `trust_checkpoint`, and a damaged one `corrupt`: nothing in a refused file is run."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's weights-only unpickler refuses both what it must not run and bytes it cannot
        # parse: a refused global, or a pickle that parses (without running it), is untrusted
        objects = sorted(set(_unsafe_globals(exc)))
        if not objects:
            parsed = _pickled_objects(path)
            if parsed is None:
                raise _corrupt(path, "not a readable PyTorch checkpoint", exc) from exc
            objects = parsed
        if not trust_checkpoint:
            raise _untrusted(path, objects) from exc
    except Exception as exc:  # RuntimeError (damaged zip), EOFError, KeyError... from a truncated or garbage file
        raise _corrupt(path, "not a readable PyTorch checkpoint (truncated or garbage)", exc) from exc
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ModelLoadError(f"{path}: trusted checkpoint could not be unpickled "
                             f"({type(exc).__name__}: {_first_line(exc)})") from exc


# Wrappers a checkpoint's tensors are published in: open_clip's training script (`state_dict`) and the
# TeCoA image towers that R-TPT's rtpt.py and RobustVLM's CLIP_benchmark read (`vision_encoder_state_dict`).
STATE_DICT_WRAPPERS = ("state_dict", "vision_encoder_state_dict")


def _strip_prefix(sd: dict) -> dict:
    wrapper = next((w for w in STATE_DICT_WRAPPERS if isinstance(sd.get(w), dict)), None)
    if wrapper is not None:
        sd = sd[wrapper]
    if sd and all(isinstance(k, str) and k.startswith("module.") for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return sd


def read_checkpoint(path: Path, trust_checkpoint: bool = False) -> tuple[dict[str, torch.Tensor], bool]:
    """Read a checkpoint file -> (state dict of tensors, is an OpenAI TorchScript release).

    Formats: `.safetensors`; OpenAI TorchScript archives; plain or open_clip-trained state
    dicts (`{"state_dict": ...}`, `module.` prefixes); image towers alone (FARE's .pt, TeCoA's
    `{"vision_encoder_state_dict": ...}`), which the loader completes with a base CLIP. Pickles
    holding Python objects other than tensors are refused unless `trust_checkpoint`.
    """
    if not path.is_file():
        raise ModelLoadError(f"checkpoint file {path} does not exist")
    if path.suffix == ".safetensors":
        return _read_safetensors(path), False
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as zf:
                torchscript = _is_torchscript(zf)
        except (zipfile.BadZipFile, OSError) as exc:
            raise _corrupt(path, "damaged zip archive", exc) from exc
        if torchscript:
            return _read_torchscript(path), True
    sd = read_pickle(path, trust_checkpoint)
    if not isinstance(sd, dict):
        raise ModelLoadError(f"{path}: expected a state dict (a mapping of tensors), found {type(sd).__name__}")
    sd = _strip_prefix(sd)
    tensors = {k: v for k, v in sd.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    if not tensors:
        raise ModelLoadError(f"{path}: the checkpoint holds no tensors (keys: {list(sd)[:5]})")
    return tensors, False


def check_finite(path: Path, sd: dict[str, torch.Tensor]) -> None:
    """Refuse a checkpoint holding NaN or Inf in any floating-point tensor: every score of a run on it would
    be an error record (or NaN), so it is said once, at load, naming the tensors."""
    bad = [k for k, v in sd.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise ModelLoadError(f"{path}: corrupt checkpoint: NaN or Inf in {len(bad)} tensor(s) ({shown}); a model "
                             "with such weights gives no usable score; download it again or use other weights")


# -- the weights cache ---------------------------------------------------------------------------

def hf_hub_cache() -> Path:
    hub = os.environ.get("HF_HUB_CACHE")
    if hub:
        return Path(hub).expanduser()
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "hub"


def clip_cache(cache_dir: str | None) -> Path:
    return Path(cache_dir or os.environ.get("SHIFTLAB_MODEL_CACHE", "~/.cache/clip")).expanduser()


def hf_snapshot_files(repo: str, names: tuple[str, ...], cache_dir: str | None = None) -> list[Path]:
    """Files `names` in every cached snapshot of Hugging Face repository `repo` ("org/name"), in the
    HF cache and in `cache_dir` (where open_clip's download puts them when given a cache_dir)."""
    org, _, name = repo.strip("/").partition("/")
    roots = [hf_hub_cache()] + ([Path(cache_dir).expanduser()] if cache_dir else [])
    found = []
    for root in roots:
        snaps = root / f"models--{org}--{name}" / "snapshots"
        if snaps.is_dir():
            found += [d / n for d in sorted(snaps.iterdir()) for n in names]
    return found


WEIGHT_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")


@functools.cache
def openai_url_digests() -> frozenset[str]:
    """SHA-256 digests that are part of OpenAI's official download URLs (.../models/<sha256>/X.pt),
    as open_clip's pretrained table holds them."""
    import open_clip
    urls = (open_clip.get_pretrained_cfg(m, "openai").get("url", "") for m in open_clip.list_models()
            if "openai" in open_clip.list_pretrained_tags_by_model(m))
    return frozenset(found.group(1) for url in urls if (found := re.search(r"/([0-9a-f]{64})/", url)))


def weights_source(path: str | Path, sha256: str) -> str | None:
    """Where a weights file with this SHA-256 verifiably came from, else None:
    - "openai-url": its SHA-256 is the digest in one of OpenAI's official download URLs;
    - "hf-hub:ORG/REPO": it was read from a snapshot of that repository in a Hugging Face cache
      (models--ORG--REPO/snapshots/REV/FILE, a link to models--ORG--REPO/blobs/<sha256>) and its
      SHA-256 equals its blob name, the content address the hub verified on download.
    A copy elsewhere, or a blob whose content does not match its name, has no known source."""
    sha256 = sha256.lower()
    if sha256 in openai_url_digests():
        return "openai-url"
    path = Path(os.path.abspath(path))
    parts = path.parts
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "snapshots" and parts[i - 1].startswith("models--") and "--" in parts[i - 1][8:]:
            repo_dir = Path(*parts[:i])
            blob = Path(os.path.realpath(path))
            if blob.name == sha256 and blob.parent == Path(os.path.realpath(repo_dir / "blobs")):
                return "hf-hub:" + parts[i - 1][len("models--"):].replace("--", "/", 1)
            return None
    return None


def cached_tag_file(pretrained_cfg: dict, cache_dir: str | None) -> tuple[Path | None, str]:
    """(local file or None, where to download it from) for one open_clip pretrained tag.

    Looks where open_clip itself would put the file: the Hugging Face cache for the tag's
    hub repository (what open_clip downloads), and OpenAI's file name in `cache_dir`
    (default `$SHIFTLAB_MODEL_CACHE` or ~/.cache/clip) for tags with an original URL.
    """
    url = pretrained_cfg.get("url") or ""
    hf = (pretrained_cfg.get("hf_hub") or "").strip("/")
    hf_repo, hf_file = (hf, "") if hf.count("/") < 2 else hf.rsplit("/", 1)
    candidates: list[Path] = []
    url_target = clip_cache(cache_dir) / os.path.basename(url) if url else None
    if url_target is not None:
        candidates.append(url_target)
    if hf_repo:
        candidates += hf_snapshot_files(hf_repo, (hf_file,) if hf_file else WEIGHT_FILES, cache_dir)
    for c in candidates:
        if c.is_file():
            return c, ""
    where = []
    if hf_repo:
        where.append(f"the Hugging Face repository {hf_repo} (`hf download {hf_repo}` "
                     f"puts it in the HF cache, {hf_hub_cache()})")
    if url:
        where.append(f"{url} -> {url_target}")
    return None, " or ".join(where) or "the weights"


def require_network(where: str) -> None:
    """Fail in milliseconds, not after a minute of hub retries, when no download host resolves."""
    import socket
    for host in ("huggingface.co", "openaipublic.azureedge.net"):
        try:
            socket.getaddrinfo(host, 443)
            return
        except OSError:
            continue
    raise ModelLoadError(f"no internet connection: cannot download the weights. Download {where} on a machine "
                         f"with internet and copy them there, or pass {say('pretrained_file')}.")

"""CLIP_benchmark's webdataset layout, as its datasets come from the Hugging Face hub
(`clip-benchmark/wds_imagenet-r`, ...): `classnames.txt` (one name per label), and tar shards
`test/0.tar, 1.tar, ...` each holding per sample `<key>.<image ext>` and `<key>.cls` (the label as
text), as CLIP_benchmark's `webdataset_builder.convert_dataset` writes them.

The shards are indexed once with `tarfile` (member names, offsets, sizes; no image is decoded) and
each image is read back by offset, so DataLoader workers need no open file and no webdataset
pipeline. A sample's id is its place in the list sorted by (shard number, key): stable across runs,
so records and `--resume` work as for folders. Its `path` is `<split>/<shard>.tar/<member>`.
For the ImageNet family the class list must be shiftlab's table (the names of
`shiftlab.classnames(name)` in that order); published comparisons rely on it.
"""
from __future__ import annotations

import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from .base import IMAGE_EXTENSIONS, DatasetError, FolderDataset, format_listing
from .imageio import ImageDecodeError, decode_image_bytes
from .specs import DatasetSpec

CLASSNAMES_FILE = "classnames.txt"
SPLITS = ("test", "val", "validation", "")


def shard_dir(directory: Path) -> Path | None:
    """The folder of a webdataset layout's test shards under `directory`, or None when it has none."""
    if not (directory / CLASSNAMES_FILE).is_file():
        return None
    for split in SPLITS:
        folder = directory / split if split else directory
        if folder.is_dir() and any(folder.glob("*.tar")):
            return folder
    return None


def _shard_order(path: Path) -> tuple:
    digits = re.findall(r"\d+", path.stem)
    return (int(digits[-1]) if digits else -1, path.name)


@dataclass
class ShardDataset(FolderDataset):
    """A FolderDataset whose images are tar members: `members[i]` = (shard path relative to root,
    byte offset of the data, size)."""
    members: list[tuple[str, int, int]] = field(default_factory=list)

    def image(self, i: int) -> Image.Image:
        shard, offset, size = self.members[i]
        where = self.root / self.samples[i][0]
        try:
            with open(self.root / shard, "rb") as fh:
                fh.seek(offset)
                data = fh.read(size)
        except OSError as exc:
            raise ImageDecodeError(where, f"cannot read shard ({exc.strerror or exc})") from exc
        if len(data) != size:
            raise ImageDecodeError(where, f"truncated shard: {len(data)} of {size} bytes")
        return decode_image_bytes(data, str(where))


def build_shard_dataset(spec: DatasetSpec, directory: Path, expected: list[str] | None,
                        classnames: list[str] | None = None) -> ShardDataset:
    """Index the shards under `directory` (see the module docstring). `expected`: the class names the
    dataset must have (ImageNet family), in label order; `classnames` overrides the file's names."""
    folder = shard_dir(directory)
    if folder is None:
        raise DatasetError(f"{spec.name}: {directory} holds no webdataset shards ({CLASSNAMES_FILE} and "
                           f"test/*.tar expected)")
    names = [line.strip() for line in (directory / CLASSNAMES_FILE).read_text(encoding="utf-8").splitlines()
             if line.strip()]
    if expected is not None and [n.lower() for n in names] != [n.lower() for n in expected]:
        differ = [f"{i}: {a!r} != {b!r}" for i, (a, b) in enumerate(zip(names, expected)) if a.lower() != b.lower()]
        raise DatasetError(
            f"{spec.name}: {directory / CLASSNAMES_FILE} lists {len(names)} classes that are not shiftlab's "
            f"{len(expected)} {spec.name} classes in order" + (f" ({format_listing(differ)})" if differ else ""))
    entries: dict[tuple[tuple, str, str], dict[str, object]] = {}
    for shard in sorted(folder.glob("*.tar"), key=_shard_order):
        rel = shard.relative_to(directory).as_posix()
        try:
            with tarfile.open(shard, "r:") as tar:
                for member in tar:
                    if not member.isfile() or "." not in member.name:
                        continue
                    key, ext = member.name.split(".", 1)
                    parts = entries.setdefault((_shard_order(shard), rel, key), {})
                    ext = ext.lower()
                    if ext == "cls":
                        parts["cls"] = _label(tar.extractfile(member).read(), f"{rel}/{member.name}")
                    elif "." + ext in IMAGE_EXTENSIONS:
                        parts["image"] = (ext, member.offset_data, member.size)
        except (tarfile.TarError, OSError) as exc:
            raise DatasetError(f"{spec.name}: cannot read shard {shard} ({exc})") from exc
    samples, members, unlabelled = [], [], 0
    for (_, rel, key), parts in sorted(entries.items()):
        if "image" not in parts or "cls" not in parts:
            unlabelled += 1
            continue
        (ext, offset, size), label = parts["image"], parts["cls"]
        if not 0 <= label < len(names):
            raise DatasetError(f"{spec.name}: {rel}/{key}.cls holds label {label}, outside 0..{len(names) - 1}")
        samples.append((f"{rel}/{key}.{ext}", label))
        members.append((rel, offset, size))
    if not samples:
        raise DatasetError(f"{spec.name}: the shards in {folder} hold no image with a .cls label")
    present = {label for _, label in samples}
    warnings = [f"{unlabelled} shard entries without an image or a .cls label were skipped"] if unlabelled else []
    return ShardDataset(root=directory, samples=samples, classnames=list(classnames or expected or names),
                        wnids=spec.wnids(), name=spec.name, warnings=warnings,
                        empty_classes=[n for i, n in enumerate(names) if i not in present], members=members)


def _label(data: bytes, where: str) -> int:
    text = data.decode("ascii", "replace").strip()
    try:
        return int(text)
    except ValueError:
        raise DatasetError(f"{where} holds {text[:20]!r}, not a class index") from None

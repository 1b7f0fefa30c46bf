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


@dataclass(repr=False)   # FolderDataset's one-line repr
class ShardDataset(FolderDataset):
    """A FolderDataset whose images are tar members: `members[i]` = (shard path relative to root,
    byte offset of the data, size)."""
    members: list[tuple[str, int, int]] = field(default_factory=list)
    found_layout: str = "webdataset shards"

    def read_bytes(self, i: int) -> bytes:
        """The member's bytes, read by offset (OSError naming the shard and offset when it cannot be)."""
        shard, offset, size = self.members[i]
        with open(self.root / shard, "rb") as fh:
            fh.seek(offset)
            data = fh.read(size)
        if len(data) != size:
            raise OSError(f"truncated shard {shard}: {len(data)} of {size} bytes at offset {offset}")
        return data

    def image(self, i: int) -> Image.Image:
        where = self.root / self.samples[i][0]
        try:
            data = self.read_bytes(i)
        except OSError as exc:
            raise ImageDecodeError(where, f"cannot read shard ({exc.strerror or exc})") from exc
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
    owner: dict[str, str] = {}   # key -> the first member that named it: a key is one sample in all shards
    lost: list[str] = []
    for shard in sorted(folder.glob("*.tar"), key=_shard_order):
        rel = shard.relative_to(directory).as_posix()
        end = None   # where tar's own reading stopped; None: cut off inside a member
        try:
            with tarfile.open(shard, "r:") as tar:
                for member in _members(tar):
                    if not member.isfile() or "." not in member.name:
                        continue
                    key, ext = member.name.split(".", 1)
                    where = f"{rel}/{member.name}"
                    first = owner.setdefault(key, where)
                    parts = entries.setdefault((_shard_order(shard), rel, key), {})
                    ext = ext.lower()
                    kind = "cls" if ext == "cls" else ("image" if "." + ext in IMAGE_EXTENSIONS else None)
                    if kind is None:
                        continue
                    if kind in parts or not first.startswith(f"{rel}/"):
                        other = parts.get(f"{kind}_member", first)
                        raise DatasetError(f"{spec.name}: duplicate sample key {key!r}: {other} and {where}; "
                                           "each key must be one sample (rebuild the shards)")
                    parts[f"{kind}_member"] = where
                    if kind == "cls":
                        data = _member_bytes(tar, member)
                        if data is None:   # cut off inside the label: said by _truncation
                            tar.__dict__["_shiftlab_cut"] = True
                            break
                        parts["cls"] = _label(data, where)
                    else:
                        parts["image"] = (ext, member.offset_data, member.size)
                end = tar.offset if not tar.__dict__.get("_shiftlab_cut") else None
        except (tarfile.TarError, OSError) as exc:
            raise DatasetError(f"{spec.name}: cannot read shard {shard} ({exc})") from None
        lost += _truncation(shard, rel, end, [(k, p) for (_, r, k), p in entries.items() if r == rel])
    samples, members, unlabelled = [], [], 0
    for (_, rel, key), parts in sorted(entries.items()):
        if parts.get("lost"):
            continue
        if "image" not in parts or "cls" not in parts:
            unlabelled += 1
            continue
        (ext, offset, size), label = parts["image"], parts["cls"]
        if not 0 <= label < len(names):
            raise DatasetError(f"{spec.name}: {rel}/{key}.cls holds label {label}, outside 0..{len(names) - 1}")
        samples.append((f"{rel}/{key}.{ext}", label))
        members.append((rel, offset, size))
    if not samples:
        raise DatasetError(f"{spec.name}: the shards in {folder} hold no image with a .cls label"
                           + (f" ({lost[-1]})" if lost else ""))
    present = {label for _, label in samples}
    warnings = [f"{unlabelled} shard entries without an image or a .cls label were skipped"] if unlabelled else []
    return ShardDataset(root=directory, samples=samples, classnames=list(classnames or expected or names),
                        wnids=spec.wnids(), name=spec.name, warnings=warnings, lost=lost,
                        empty_classes=[n for i, n in enumerate(names) if i not in present], members=members)


def _members(tar: tarfile.TarFile):
    """The tar's members; a file cut off inside a member ends the iteration (the cut is said by
    `_truncation`) instead of raising."""
    while True:
        try:
            member = tar.next()
        except tarfile.ReadError as exc:
            if "unexpected end of data" not in str(exc):
                raise
            tar.__dict__["_shiftlab_cut"] = True
            return
        if member is None:
            return
        yield member


def _member_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes | None:
    """A member's bytes, or None when the file ends inside them."""
    try:
        data = tar.extractfile(member).read()
    except tarfile.ReadError:
        return None
    return data if len(data) == member.size else None


def _truncation(shard: Path, rel: str, end: int | None, entries: list[tuple[str, dict]]) -> list[str]:
    """One line per sample of `shard` that its file cannot deliver, marking those entries `lost`: a
    member whose data runs past the end of the file, a key cut off before its .cls or image, and a
    shard that stops without tar's end-of-archive block (members after `end` are gone: how many
    cannot be known, so the line says where the file stops)."""
    size = shard.stat().st_size
    tail = b""
    if end is not None:
        with open(shard, "rb") as fh:
            fh.seek(end)
            tail = fh.read(512)
    out = []
    for key, parts in entries:
        ext, offset, length = parts.get("image", ("", 0, 0))
        if offset + length > size:
            parts["lost"] = True
            out.append(f"{rel}/{key}.{ext}: the shard is truncated at byte {size}, inside this member "
                       f"(bytes {offset}..{offset + length})")
    complete = len(tail) == 512 and not tail.strip(b"\0")
    if not complete:
        # the members read before the cut are kept; the last key may have lost its partner (image or .cls)
        for key, parts in entries[-1:]:
            if not parts.get("lost") and ("image" not in parts or "cls" not in parts):
                parts["lost"] = True
                out.append(f"{rel}/{key}: the shard ends at byte {size} before this sample's "
                           f"{'label' if 'image' in parts else 'image'}")
        out.append(f"{rel}: the shard ends at byte {size} without tar's end-of-archive block: it is truncated, "
                   "and any sample after that offset is lost")
    return out


def _label(data: bytes, where: str) -> int:
    text = data.decode("ascii", "replace").strip()
    try:
        return int(text)
    except ValueError:
        raise DatasetError(f"{where} holds {text[:20]!r}, not a class index") from None

"""A run's identity: everything that decides its records, kept in `RUN_DIR/run.json`.

    {"shared": {"dataset", "samples_sha256", "n_samples", "classnames_sha256", "model",
                "pretrained", "checkpoint_sha256", "weights_source", "model_seed", "weights_sha256",
                "protocol", "views", "augmix", "seed", "order", "limit", "attack", "precision", "image_size",
                "delta", "stream_seed", "orders", "order_seeds", "batch_size", "corruption", "open_set"},
     "methods": {name: effective config (dataclasses.asdict(method.config)) + <field>_sha256 of each file it
                 names + Method.loaded_weights()},
     "shiftlab": version, "config": the summary's config, "self_sha256": SHA-256 of the rest}

`--resume` continues a run only when the identity matches (`check_resume`), and otherwise
refuses, listing the fields that differ. Two changes are allowed because they keep every
existing record valid: adding methods (the new ones get the same samples and shared
settings) and raising `--limit` (a limited run is a prefix of the stream). The shiftlab
version is recorded but not compared (a fix release must be able to finish a run). The
sample-list fingerprint is what the report uses to decide whether two runs saw the same
images. The attack's config records every field of the attack; a field an older run.json lacks
is taken from the resuming run when that holds the field's default. A run made before
`weights_source` (where the checkpoint verifiably came from) was recorded takes it from the
resuming run: the checkpoint's SHA-256 already pins the weights.
Random weights are pinned by `model_seed` and `weights_sha256` (the digest of the weights as
built); a run made before they were recorded takes them from a resuming run with a checkpoint
(null both), and is refused with random weights (those were unseeded: nothing can rebuild them).
Every rank of a torchrun job builds its identity and they must agree (`check_ranks`).
The stream is recorded whole: its kind (`order`), the dirichlet stream's `delta`, the `stream_seed` when it
is not the run seed (one of `--orders K`'s `order_seeds`, recorded with K as `orders`), and `batch_size` where
a method adapts on batches (null otherwise: no record depends on it). A run.json written before these
existed ran today's defaults, which it takes from a resuming run that holds them (`STREAM_DEFAULTS`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import writes
from ..attacks import catalogue as attack_catalogue
from ..attacks.base import NO_ATTACK
from ..options import say
from ..writes import resume_advice
from .record_files import run_dir_error

IDENTITY_FILE = "run.json"
SELF_CHECKSUM = "self_sha256"   # run.json's checksum of itself (`self_checksum`), verified by `read`
# a change means another stream of samples
STREAM_FIELDS = ("samples_sha256", "seed", "order", "dataset", "delta", "stream_seed", "orders", "order_seeds",
                 "corruption", "open_set", "domains")
ADDED_LATER = ("weights_source",)   # absent from older run.json files: adopted from the resuming run
RANDOM_WEIGHTS = ("model_seed", "weights_sha256")   # absent from older run.json files: adopted when null
# absent from run.json files written before streams and batches were declared: adopted at these values
STREAM_DEFAULTS: dict[str, Any] = {"delta": None, "stream_seed": None, "orders": 1, "order_seeds": None,
                                   "batch_size": None, "domains": None, "attack_subset": None}


class RunIdentityError(ValueError):
    """A resume whose settings differ from the run directory's."""


def _sha256_lines(lines) -> str:
    digest = hashlib.sha256()
    for line in lines:
        digest.update(str(line).encode("utf-8", "surrogateescape") + b"\n")
    return digest.hexdigest()


def samples_fingerprint(dataset: Any) -> str:
    """SHA-256 of the dataset's sorted sample list (relative path and label of every sample)."""
    return _sha256_lines(f"{path}\t{label}" for path, label in dataset.samples)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checkpoint_sha256(model: Any, pretrained: str | None) -> str | None:
    """The loaded checkpoint's SHA-256: the model's own record of it when it has one, else the file's
    (when `pretrained` names a file); None for a tag resolved by open_clip's cache or random weights."""
    known = getattr(model, "checkpoint_sha256", None)
    if known:
        return str(known)
    if pretrained and os.path.isfile(str(pretrained)):
        return file_sha256(Path(pretrained))
    return None


def weights_sha256(model: Any, checkpoint: str | None) -> str | None:
    """The digest of weights that no checkpoint file pins (random ones): the model's own record, made
    once when it was built, or computed here for a model built by other means; None with a checkpoint."""
    known = getattr(model, "weights_sha256", None)
    if known or checkpoint:
        return str(known) if known else None
    clip = getattr(model, "clip", model)
    if not hasattr(clip, "state_dict"):
        return None
    from ..models import state_dict_sha256
    return state_dict_sha256(clip)


def jsonable(value: Any) -> Any:
    """A config value as JSON (tuples -> lists, tensors -> shape + digest, anything else -> repr)."""
    if isinstance(value, (str, bool, int)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "detach") and hasattr(value, "shape"):   # a tensor (e.g. a CoOp context)
        data = value.detach().cpu().contiguous()
        return {"tensor_shape": list(data.shape), "sha256": hashlib.sha256(data.numpy().tobytes()).hexdigest()}
    return repr(value)


def method_settings(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    """A run.json method entry (`method_config`) less what identifies the files and weights it read (its
    `<field>_sha256`, `loaded_weights`): the method's effective config, which summary.json records as
    `method_settings` and a later run takes back as its `method_config`."""
    from ..methods.catalogue import declarations
    try:
        fields = {f.name for f in dataclasses.fields(declarations.spec(name).config_class)}
    except (KeyError, TypeError, ValueError):   # a method this install no longer registers: kept as written
        return dict(entry)
    return {k: v for k, v in entry.items() if k in fields}


def method_config(method: Any) -> dict[str, Any]:
    """A method's effective config, the SHA-256 of each file it names (`<field>_sha256`: a CuPL file, a CoOp
    checkpoint; another file under the same path is another run) and the weights it loaded itself
    (`Method.loaded_weights`: RLCF's reward model), which decide its records as much as its config does."""
    cfg = getattr(method, "config", None)
    out = jsonable(dataclasses.asdict(cfg)) if dataclasses.is_dataclass(cfg) else {}
    if dataclasses.is_dataclass(cfg):
        from ..methods.catalogue.method_plan import named_files
        out |= {f"{field}_sha256": file_sha256(Path(path)) for field, path in named_files(cfg).items()
                if os.path.isfile(path)}
    loaded = getattr(method, "loaded_weights", None)
    return {**out, **jsonable(loaded())} if callable(loaded) else out


def build(config: Any, model: Any, dataset: Any, methods: Mapping[str, Any], version: str) -> dict[str, Any]:
    """The identity of a run of `config` with this model, dataset and method instances."""
    from .stream import canonical_kind, order_seeds
    checkpoint = checkpoint_sha256(model, config.pretrained)
    orders = int(getattr(config, "orders", 1))
    batched = any(m.spec.adapts_on_batches for m in methods.values())
    shared = {
        "dataset": config.dataset,
        "samples_sha256": samples_fingerprint(dataset),
        "n_samples": len(dataset),
        "classnames_sha256": _sha256_lines(dataset.classnames),
        "model": getattr(model, "name", config.model),
        "pretrained": config.pretrained,
        "checkpoint_sha256": checkpoint,
        "weights_source": getattr(model, "weights_source", None),
        "model_seed": getattr(model, "weights_seed", None),
        "weights_sha256": weights_sha256(model, checkpoint),
        "protocol": jsonable(getattr(config, "protocol", None)),
        "views": config.views,
        "augmix": config.augmix,
        "seed": config.seed,
        "order": canonical_kind(config.order),
        "delta": getattr(config, "delta", None),
        "stream_seed": getattr(config, "stream_seed", None),
        "orders": orders,
        "order_seeds": order_seeds(config.seed, orders) if orders > 1 else None,
        "batch_size": int(config.batch_size) if batched else None,
        "limit": config.limit,
        "attack": jsonable(dict(config.attack)),
        "clean_and_robust": config.clean_and_robust,
        "attack_subset": getattr(config, "attack_subset", None),
        "precision": config.precision,
        "image_size": getattr(model, "image_size", None),
        # shifts (engine/shifts.py): the corruption (name, severity, stored or generated with its seed and package)
        # and the open-set mix (OOD sets, ratio, seed, counts); null for a clean, closed-set run
        "corruption": jsonable(getattr(dataset, "corruption_info", None)),
        # a stream of domains (datasets.domains): each domain's corruption (or null), in stream order
        "domains": jsonable(getattr(dataset, "domain_info", None)),
        "open_set": jsonable(getattr(dataset, "open_set_info", None)),
    }
    base = getattr(model, "base_pretrained", None)
    if base is not None:   # an image tower alone (FARE, TeCoA) over a base CLIP: the base's digest too
        shared.update(base_pretrained=base, base_checkpoint_sha256=getattr(model, "base_checkpoint_sha256", None))
    target = getattr(config, "attack_target", "transfer")
    if target != "transfer":   # a transfer run's identity is what it was before adaptive attacks existed
        shared.update(attack_target=target, eot=int(config.eot))
    return {"shared": shared, "methods": {n: method_config(m) for n, m in methods.items()}, "shiftlab": version}


# The JSON types of `shared`'s fields as `build` writes them (a tuple: any of these; None: null).
SHARED_TYPES: dict[str, tuple] = {
    "dataset": (str,), "samples_sha256": (str,), "n_samples": (int,), "classnames_sha256": (str,), "model": (str,),
    "pretrained": (str, None), "checkpoint_sha256": (str, None), "weights_source": (str, None),
    "model_seed": (int, None), "weights_sha256": (str, None), "protocol": (str, None), "views": (int, None),
    "augmix": (bool,), "seed": (int,), "order": (str,), "limit": (int, None), "attack": (dict,),
    "clean_and_robust": (bool,), "attack_subset": (int, None), "precision": (str,), "image_size": (int, None),
    "delta": (float, int, None), "stream_seed": (int, None), "orders": (int,), "order_seeds": (list, None),
    "batch_size": (int, None), "corruption": (dict, None), "open_set": (dict, None),
    "domains": (dict, None),
}
# the fields only some runs write: an attack through the methods' adaptation (`--attack-target adaptive|both`)
# and a checkpoint holding only an image tower completed by a base CLIP (`--base-pretrained`)
OPTIONAL_SHARED_TYPES: dict[str, tuple] = {"attack_target": (str,), "eot": (int,), "base_pretrained": (str,),
                                           "base_checkpoint_sha256": (str, None)}
_JSON_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
               bool: "true or false", None: "null"}


def _json_type(value: Any) -> Any:
    return None if value is None else next((t for t in (bool, int, float, str, list, dict) if isinstance(value, t)),
                                           type(value))


def _expected(types: tuple) -> str:
    return " or ".join(_JSON_NAMES[t] for t in types)


def validate(data: Any, path: Path | str = IDENTITY_FILE) -> dict[str, Any]:
    """`data` (a parsed run.json) if every section has its type: an object with `shared` (an object whose
    known fields have the types of SHARED_TYPES), `methods` (an object of objects) and `shiftlab` (a
    string). Otherwise RunIdentityError, one line naming the file and the first field that is wrong."""
    unknown = f"the run's settings are unknown, so it cannot be resumed safely: restore the file or choose {say('out')}"

    def wrong(field: str, types: tuple, value: Any) -> RunIdentityError:
        got = _JSON_NAMES.get(_json_type(value), "something else")
        return RunIdentityError(f"{path}: {field} must be {_expected(types)}, got {got} ({unknown})")
    if not isinstance(data, dict):
        raise wrong("the file", (dict,), data)
    for section, types in (("shared", (dict,)), ("methods", (dict,)), ("shiftlab", (str,))):
        if section not in data:
            raise RunIdentityError(f"{path}: {section} is missing ({unknown})")
        if _json_type(data[section]) not in types:
            raise wrong(section, types, data[section])
    for key, value in data["shared"].items():
        types = SHARED_TYPES.get(key, OPTIONAL_SHARED_TYPES.get(key))
        if types is not None and _json_type(value) not in types:
            raise wrong(f"shared.{key}", types, value)
    for name, cfg in data["methods"].items():
        if not isinstance(cfg, dict):
            raise wrong(f"methods.{name}", (dict,), cfg)
    return data


def self_checksum(data: Mapping[str, Any]) -> str:
    """SHA-256 of run.json's contents other than its own `self_sha256` (canonical JSON: sorted keys, no spaces)."""
    body = {k: v for k, v in data.items() if k != SELF_CHECKSUM}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read(run_dir: Path) -> dict[str, Any] | None:
    """The run directory's identity, validated (`validate`) and checked against its own checksum (a run.json
    changed by hand is refused; one written before the checksum existed has none and is read as it is); None
    when it has no run.json. The checksum is not part of what it returns."""
    path = Path(run_dir) / IDENTITY_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise RunIdentityError(f"{path} is damaged ({one_line(exc)}); the run's settings are unknown, so it cannot "
                               f"be resumed safely. Choose {say('out')}") from None
    data = validate(data, path)
    if SELF_CHECKSUM in data:
        if data[SELF_CHECKSUM] != self_checksum(data):
            raise RunIdentityError(f"{path} was changed after shiftlab wrote it (its {SELF_CHECKSUM} does not match "
                                   "its contents), so the run's settings cannot be trusted: restore the file, or "
                                   f"choose {say('out')} and run again")
        data = {k: v for k, v in data.items() if k != SELF_CHECKSUM}
    return data


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def write(run_dir: Path, identity: Mapping[str, Any]) -> None:
    path = Path(run_dir) / IDENTITY_FILE
    try:
        sealed = {k: v for k, v in identity.items() if k != SELF_CHECKSUM}
        sealed[SELF_CHECKSUM] = self_checksum(sealed)
        writes.write_file(path, json.dumps(sealed, indent=2, sort_keys=True) + "\n", resume_advice())
    except OSError as exc:
        raise run_dir_error(path, exc) from None


def _shown(value: Any, other: Any) -> str:
    """`value` as JSON, in full up to 120 characters; a longer one around where it departs from `other`'s
    text, so that two long values never read alike."""
    text, against = json.dumps(value, sort_keys=True), json.dumps(other, sort_keys=True)
    if len(text) <= 120:
        return text
    start = next((i for i, (x, y) in enumerate(zip(text, against)) if x != y), min(len(text), len(against)))
    start = max(0, start - 40)
    return ("..." if start else "") + text[start:start + 100] + ("..." if start + 100 < len(text) else "")


def _differences(prefix: str, a: Any, b: Any) -> list[str]:
    """'key old -> new' for each differing leaf of two values, nested dicts as dotted keys (views.augmix)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) if a.get(k) != b.get(k)
                for d in _differences(f"{prefix}.{k}" if prefix else str(k), a.get(k), b.get(k))]
    return [f"{prefix} {_shown(a, b)} -> {_shown(b, a)}"]


@dataclasses.dataclass
class Resume:
    """The outcome of a successful identity check."""
    identity: dict[str, Any]                  # to record: the old one, updated with what this run adds
    added_methods: list[str]
    limit_raised: tuple[Any, Any] | None = None


def check_resume(run_dir: Path, old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> Resume:
    """Compare a run directory's identity with this run's; raises RunIdentityError listing every
    difference, else returns the identity to record (methods merged, limit raised)."""
    if old is None:  # a run directory from before identities were recorded: nothing to compare
        return Resume(dict(new), [])
    diffs = []
    old_shared, new_shared = dict(old.get("shared", {})), dict(new["shared"])
    limit_raised = None
    if isinstance(old_shared.get("attack"), dict) and isinstance(new_shared.get("attack"), dict):
        old_shared["attack"] = _attack_fields_added_later(old_shared["attack"], new_shared["attack"])
    for key in sorted(set(old_shared) | set(new_shared)):
        a, b = old_shared.get(key), new_shared.get(key)
        if key not in old_shared and (key in ADDED_LATER or (key in RANDOM_WEIGHTS and b is None)
                                      or (key in STREAM_DEFAULTS and b == STREAM_DEFAULTS[key])):
            old_shared[key] = b
            continue
        if a == b:
            continue
        if key == "limit" and a is not None and (b is None or b > a):
            limit_raised = (a, b)
            continue
        if isinstance(a, dict) and isinstance(b, dict):   # the attack's config: the fields that differ
            diffs.append(f"{key} " + ", ".join(_differences("", a, b)))
            continue
        diffs.append(f"{key} {_shown(a, b)} -> {_shown(b, a)}")
    old_methods = dict(old.get("methods", {}))
    for name, cfg in new["methods"].items():
        if name in old_methods and old_methods[name] != cfg:
            diffs.append(f"{name}: " + ", ".join(_differences("", old_methods[name], cfg)))
    if diffs:
        stream = any(d.split(" ", 1)[0] in STREAM_FIELDS for d in diffs)
        unseeded = "weights_sha256" not in old_shared and new_shared.get("weights_sha256") is not None
        raise RunIdentityError(
            f"cannot resume {run_dir}: its records were made with other settings ({'; '.join(diffs)})"
            + ("; these define a different stream of samples" if stream else "")
            + ("; its random weights were unseeded (made before shiftlab recorded them), so no run can "
               "rebuild them" if unseeded else "")
            + f". Resume with the original settings or choose {say('out')}")
    merged = {**old_methods, **new["methods"]}
    identity = {"shared": {**old_shared, "limit": new_shared.get("limit")} if limit_raised else old_shared,
                "methods": merged, "shiftlab": new.get("shiftlab")}
    return Resume(identity, [n for n in new["methods"] if n not in old_methods], limit_raised)


def _attack_fields_added_later(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The old attack config with the fields it does not record taken from the new one where the new one
    holds that field's default: a run.json written before the attack recorded a field (or by a library
    call that gave a few) ran it at its default."""
    name = old.get("name")
    if name != new.get("name") or name in (None, NO_ATTACK) or name not in attack_catalogue.names():
        return old
    defaults = jsonable(attack_catalogue.defaults(name))
    return {**old, **{k: v for k, v in new.items() if k not in old and k in defaults and defaults[k] == v}}


def check_ranks(identities: list[Mapping[str, Any]]) -> None:
    """The identities every rank of a torchrun job built (rank order) must be equal: the same model
    above all. Raises RunIdentityError naming the first rank that differs from rank 0 and the fields."""
    first = identities[0]
    for rank, other in enumerate(identities[1:], start=1):
        if other == first:
            continue
        a, b = first.get("shared", {}), other.get("shared", {})
        diffs = [f"{k} {_shown(a.get(k), b.get(k))} -> {_shown(b.get(k), a.get(k))}" for k in sorted(set(a) | set(b))
                 if a.get(k) != b.get(k)]
        ma, mb = first.get("methods", {}), other.get("methods", {})
        diffs += [f"{n}: settings differ" for n in sorted(set(ma) | set(mb)) if ma.get(n) != mb.get(n)]
        raise RunIdentityError(f"rank {rank} of this torchrun job has other settings than rank 0 "
                               f"({'; '.join(diffs) or 'version'}); every rank must load the same model, data and "
                               "settings")

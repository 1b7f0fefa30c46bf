"""Argument checks shared by the subcommands: every bad value is refused while parsing, before any
work (no model loaded, no run directory created), with one line naming the flag and what it accepts.

Each check is an argparse ``type=`` callable: it raises ``argparse.ArgumentTypeError`` and argparse
prefixes the message with the flag (``argument --views: ...``); ``cli.main`` prints it as one line.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import importlib.util
import math
import os
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

from ..attacks import catalogue as attack_catalogue
from ..attacks.base import NO_ATTACK
from ..methods.catalogue import listing as catalogue

MAX_VIEWS = 1024  # 64 is the protocol; far above it a run only ends in an out-of-memory error


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer between `low` and `high` (inclusive; no upper bound when None)."""
    allowed = f"between {low} and {high}" if high is not None else f"at least {low}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer {allowed}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {value}")
        return value
    parse.__name__ = "integer"
    return parse


def fractions_in(low: float, high: float) -> Callable[[str], float | list[float]]:
    """'4/255' -> a float, '1/255,2/255,4/255' -> a list of distinct floats (one pass over several budgets),
    each within [low, high] as `fraction_in` checks it."""
    one = fraction_in(low, high)

    def parse(text: str) -> float | list[float]:
        parts = [p for p in text.split(",")]
        if len(parts) == 1:
            return one(text)
        values = [one(p) for p in parts]
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"the budgets must differ, got {text}")
        return values
    parse.__name__ = "fraction list"
    return parse


def fraction_in(low: float, high: float) -> Callable[[str], float]:
    """'1/255', '0.0039' or '4/255' -> float, within [low, high]."""
    def parse(text: str) -> float:
        try:
            value = float(Fraction(text.strip()))
        except (ValueError, ZeroDivisionError):
            raise argparse.ArgumentTypeError(f"expected a number or a fraction like 1/255, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low:g} and {high:g} (images are scaled to [0, 1]; "
                                             f"e.g. 1/255), got {text}")
        return value
    parse.__name__ = "fraction"
    return parse


def float_where(ok: Callable[[float], bool], expected: str, must: str, name: str) -> Callable[[str], float]:
    """A parser of a number `ok` accepts: text that is no number is refused as "expected <expected>", a number `ok`
    refuses as "must be <must>" (one line each)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {must}, got {text}")
        return value
    parse.__name__ = name
    return parse


# seconds (nan refused too)
non_negative_float = float_where(lambda v: v >= 0, "a number of seconds", "0 or more", "non_negative_float")
# a finite number > 0 (a concentration, a scale)
positive_float = float_where(lambda v: math.isfinite(v) and v > 0, "a number > 0", "a finite number > 0",
                             "positive_float")


def method_names(text: str, refused_too: bool = False) -> list[str]:
    """'tpt,mta' or 'all' -> names, each registered (checked here, against the method catalogue, so that a
    typo costs nothing: no torch is imported). A method registered but refused (GTTA) is refused with its
    reason, unless `refused_too` (`listed_method_names`)."""
    known = catalogue.names()
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"names no method; give 'all' or some of: {', '.join(known)}")
    refused = [catalogue.refusal(n) for n in names if catalogue.refusal(n)]
    if refused and not refused_too:
        raise argparse.ArgumentTypeError(refused[0])
    unknown = [n for n in names if n != "all" and n not in known and not catalogue.refusal(n)]
    if unknown:
        guesses = [f"{n} (did you mean {' or '.join(close)}?)" if close else n
                   for n in unknown for close in [_close_method_names(n, known)]]
        if any("did you mean" in g for g in guesses):
            raise argparse.ArgumentTypeError(f"unknown method {', '.join(guesses)}; `shiftlab methods` lists the "
                                             f"{len(known)} registered ones (or give 'all')")
        raise argparse.ArgumentTypeError(f"unknown method {', '.join(unknown)}; registered: {', '.join(known)} "
                                         "(or 'all')")
    return names


def listed_method_names(text: str) -> list[str]:
    """`shiftlab methods`' names: as `method_names`, a refused method (GTTA) too: it is listed with its reason."""
    return method_names(text, refused_too=True)


def _spelling(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def _close_method_names(name: str, known: list[str]) -> list[str]:
    """The registered names `name` may mean: the one it spells as the papers and the README do ("C-TPT", "TPT",
    "DMN-ZS": its label, or its name in other case or punctuation), else up to 3 close ones."""
    same = [e["name"] for e in catalogue.entries()
            if _spelling(name) in (_spelling(e["name"]), _spelling(e["label"]))]
    return same or difflib.get_close_matches(name.lower(), known, n=3, cutoff=0.6)


def workers(text: str) -> int:
    """--workers: 'auto' (-1 inside: `engine.config.resolve_workers` picks) or a count >= 0."""
    if str(text).strip().lower() == "auto":
        return -1
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a number of workers >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be auto or a number of workers >= 0 (0: decode in the main "
                                         f"process), got {value}")
    return value


def method_override(item: str) -> tuple[str, str, Any]:
    """'tpt.lr=0.01' -> ('tpt', 'lr', 0.01), checked against the method's config field: its type and
    declared range, read from the method catalogue (no torch import) and checked by
    `params.FieldSpec.check`, the check `create_method` applies.

    The value is read as a Python literal (0.01, 4, None, True, 'text'); a str field also takes
    unquoted text. A value outside the field's range is refused (it would make every record an error)."""
    key, sep, raw = item.partition("=")
    method, dot, name = key.strip().partition(".")
    raw = raw.strip()
    if not sep or not dot or not method or not name:
        raise argparse.ArgumentTypeError(f"expected METHOD.FIELD=VALUE (e.g. tpt.lr=0.01), got {item!r}")
    if method not in catalogue.names():
        raise argparse.ArgumentTypeError(f"{item}: unknown method {method}; registered: "
                                         f"{', '.join(catalogue.names())}")
    fields = catalogue.field_specs(method)
    if name not in fields:
        raise argparse.ArgumentTypeError(f"{item}: {method} has no setting {name}; its settings: "
                                         f"{', '.join(fields) or 'none'}")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        value = raw
    spec = fields[name]
    coerce = getattr(spec.hint, "coerce", None)   # e.g. ViewRecipe: a view count or a dict of its fields
    if callable(coerce):
        try:
            coerce(value)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(f"{item}: {method}.{exc}") from None
        return method, name, value   # as given: the protocol merges it onto its own recipe
    try:
        shown = repr(value) if isinstance(value, str) else raw
        return method, name, spec.check(method, name, value, shown=shown)
    except ValueError as exc:
        if isinstance(value, str):
            raise argparse.ArgumentTypeError(str(exc)) from None
        try:   # e.g. ctx_init=1: the text for a str field
            return method, name, spec.check(method, name, raw)
        except ValueError:
            raise argparse.ArgumentTypeError(str(exc)) from None


def method_config(items: list[str] | list[tuple[str, str, Any]]) -> dict[str, dict[str, Any]]:
    """--set values -> {'tpt': {'lr': 0.01}, 'rtpt': {'self_mask': 'threshold'}}; later ones win. The
    attack's (`attack.FIELD=V`, see `attack_spec`) are left out."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        method, name, value = run_override(item) if isinstance(item, str) else item
        if method != ATTACK:
            out.setdefault(method, {})[name] = value
    return out


# -- the attack: --attack NAME, --set attack.FIELD=V and the shortcuts for fields of those names ------------

ATTACK = "attack"   # `--set attack.FIELD=V` sets a field of the chosen --attack (no method may take this name)
# shortcut flag -> the attack field it sets (argparse dest = field name)
ATTACK_SHORTCUTS = {"--eps": "eps", "--alpha": "alpha", "--steps": "steps", "--random-start": "random_start",
                    "--quantize": "quantize", "--eps-l2": "eps_l2"}


def attack_name(text: str) -> str:
    """'none' or a registered attack, read from the attack catalogue (no torch import)."""
    names = [NO_ATTACK, *attack_catalogue.names()]
    if text not in names:
        raise argparse.ArgumentTypeError(f"unknown attack {text!r}; choose from: {', '.join(names)}")
    return text


def run_override(item: str) -> tuple[str, str, Any]:
    """`--set` of `shiftlab run`: METHOD.FIELD=VALUE, checked here (`method_override`), or attack.FIELD=VALUE,
    returned as ('attack', field, text) and checked once the attack is known (`attack_spec`), since --attack
    may come later on the command line."""
    key, sep, raw = item.partition("=")
    target, dot, name = key.strip().partition(".")
    if target != ATTACK:
        return method_override(item)
    if not sep or not dot or not name:
        raise argparse.ArgumentTypeError(f"expected attack.FIELD=VALUE (e.g. attack.eps=4/255), got {item!r}")
    return ATTACK, name.strip(), raw.strip()


def _attack_value(raw: str) -> Any:
    """The text of `--set attack.FIELD=TEXT` as a value: a Python literal (4, None, True, 'a'), a fraction
    like 4/255 (budgets are quoted so), or else the text itself."""
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    try:
        return float(Fraction(raw))
    except (ValueError, ZeroDivisionError):
        return raw


def attack_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The run's attack as `{"name", the fields the command line sets}`: the shortcut flags (--eps, ...)
    then `--set attack.FIELD=V` (later wins), each checked against the attack's field as `build_attack`
    checks it, read from the attack catalogue (no torch import). A one-line ValueError names the flag:
    a field the attack does not have, a value outside the field's range, a field without an attack."""
    name = getattr(args, "attack", NO_ATTACK)
    given: dict[str, tuple[str, Any, str | None]] = {}   # field -> (flag as typed, value, raw text)
    for flag, field in ATTACK_SHORTCUTS.items():
        value = getattr(args, field, None)
        if value is not None:
            given[field] = (flag, value, None)
    for item in getattr(args, "method_config", []):
        target, field, raw = run_override(item) if isinstance(item, str) else item
        if target == ATTACK:
            given[field] = (f"--set attack.{field}={raw}", _attack_value(raw), raw)
    if name == NO_ATTACK:
        if given:
            flag = next(iter(given.values()))[0]
            raise ValueError(f"{flag} sets a field of the attack, but no attack is chosen: add --attack NAME "
                             f"({', '.join(attack_catalogue.names())})")
        return {"name": NO_ATTACK}
    fields = attack_catalogue.field_specs(name)
    spec: dict[str, Any] = {"name": name}
    for field, (flag, value, raw) in given.items():
        if isinstance(value, list):   # --eps 1/255,4/255: every budget checked as one value is
            spec[field] = [_checked_attack_field(name, fields, field, flag, v, None) for v in value]
        else:
            spec[field] = _checked_attack_field(name, fields, field, flag, value, raw)
    try:   # what the config checks across its fields (AutoAttack's parts for the norm): its spec, no torch
        attack_catalogue.check_fields(name, {k: (v[0] if isinstance(v, list) else v) for k, v in spec.items()
                                             if k != "name"})
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    return spec


def _checked_attack_field(name: str, fields: dict, field: str, flag: str, value: Any, raw: str | None) -> Any:
    """One attack field's value from the command line, checked against the attack's field (one-line ValueError)."""
    if field == "eps_l2" and field not in fields:
        takes = [a for a in attack_catalogue.names() if "eps_l2" in attack_catalogue.field_specs(a)]
        raise ValueError(f"{flag}: {name} is an L-inf attack and takes no L2 budget; L2: {', '.join(takes)}")
    if field not in fields:
        raise ValueError(f"{flag}: attack {name} has no field {field}; its fields: {', '.join(fields)}")
    try:
        shown = None if raw is None or isinstance(value, str) else raw
        return fields[field].check(name, field, value, shown=shown)
    except ValueError as exc:
        if raw is None or isinstance(value, str):
            raise ValueError(f"{flag}: {exc}") from None
        try:   # e.g. a str field given 1: the text
            return fields[field].check(name, field, raw)
        except ValueError:
            raise ValueError(f"{flag}: {exc}") from None


DEVICE_HELP = ("auto (the first GPU if there is one, else the CPU), cpu, cuda (GPU 0), cuda:N (the N-th "
               "visible GPU, from 0; CUDA_VISIBLE_DEVICES decides which are visible) or mps")


def device_name(text: str) -> str:
    """'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', refused unless this machine has that device."""
    text = text.strip().lower()
    if text in ("auto", "cpu"):   # the default: torch is imported only to ask about a GPU
        return text
    import torch
    try:
        device = torch.device(text)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cuda", "mps"):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use {DEVICE_HELP}")
    if device.type == "mps":
        if not torch.backends.mps.is_available():
            raise argparse.ArgumentTypeError("mps is not available on this machine; use cpu or auto")
        return text
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise argparse.ArgumentTypeError(f"{text}: no CUDA GPU is visible on this machine "
                                         "(CUDA_VISIBLE_DEVICES, driver); use cpu or auto")
    if device.index is not None and device.index >= count:
        raise argparse.ArgumentTypeError(f"{text}: this machine has {count} visible GPU(s), "
                                         f"cuda:0 to cuda:{count - 1}")
    return text


def model_names() -> list[str]:
    """The architectures `--model` may name: open_clip's (its package's model_configs/*.json) and shiftlab's own
    (models/configs/*.json), read as file names so that no torch is imported. Once open_clip is imported (a
    script that registered an architecture, then called the CLI), its own list answers."""
    if "open_clip" in sys.modules:
        import open_clip

        from ..models.architectures import builtin_configs
        return sorted({*open_clip.list_models(), *builtin_configs()})
    return config_file_names()


def config_file_names() -> list[str]:
    """The stems of open_clip's model_configs/*.json and shiftlab's models/configs/*.json (no import of either)."""
    found: set[str] = set()
    for package, folder in (("open_clip", "model_configs"), ("shiftlab.models", "configs")):
        spec = importlib.util.find_spec(package)   # the package's folder, without running its __init__
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            found.update(path.stem for path in Path(location, folder).glob("*.json"))
    return sorted(found)


def unknown_model(name: str) -> str | None:
    """'unknown model ...' with the closest known names, or None for an architecture open_clip or shiftlab
    knows (`model_names`)."""
    known = model_names()
    if name in known:
        return None
    lowered = {n.lower(): n for n in known}
    close = [lowered[m] for m in difflib.get_close_matches(name.lower(), list(lowered), n=3, cutoff=0.6)]
    guess = f" (did you mean {' or '.join(close)}?)" if close else ""
    return f"unknown model {name!r}{guess}; see `open_clip.list_models()` ({len(known)} architectures)"


def readable_file(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file" if not path.exists() else f"{text} is not a file")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text}: not readable (permission denied)")
    return path


def writable_dir(text: str) -> str:
    """A directory that exists and is writable, or can be created: refused when the path or one of its
    parents is a file, or when the nearest existing parent is not writable. Nothing is created here."""
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
    existing = path
    while not existing.exists():
        if existing.is_symlink():   # a dangling link
            raise argparse.ArgumentTypeError(f"{text}: {existing} is a broken symbolic link")
        existing = existing.parent
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: {existing} is not writable (permission denied or read-only)")
    return text


def folder_path(text: str) -> str:
    """A folder that exists or can be made (a feature store: read-only ones are read, so writability is not asked):
    refused when the path or one of its parents is a file. Nothing is created here."""
    path = Path(text).expanduser()
    for existing in (path, *path.parents):
        if existing.exists() and not existing.is_dir():
            where = "" if existing == path else f": {existing}"
            raise argparse.ArgumentTypeError(f"{text}{where} is a file, not a folder")
    return text


def corruption_name(text: str) -> str:
    """A corruption of Hendrycks & Dietterich's (datasets/corruptions.py: data, no numpy)."""
    from ..datasets.corruptions import CORRUPTIONS
    name = text.strip().lower().replace("-", "_")
    if name not in CORRUPTIONS:
        raise argparse.ArgumentTypeError(f"unknown corruption {text!r}; known: {', '.join(CORRUPTIONS)}")
    return name


def corruption_names(text: str) -> tuple[str, ...]:
    """--corruptions: 'common' (the 15), 'all' (with the 4 extra) or a comma-separated list."""
    from ..datasets.corruptions import parse_corruptions
    try:
        return parse_corruptions(text.strip().lower().replace("-", "_") if text.strip() in ("common", "all")
                                 else [corruption_name(n) for n in text.split(",") if n.strip()])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def severity(text: str) -> str:
    """--severity: 1..5, or 'all' (the corruption suite's five); nothing imported (argparse checks the default)."""
    value = str(text).strip().lower()
    if value not in ("1", "2", "3", "4", "5", "all"):
        raise argparse.ArgumentTypeError(f"must be 1..5 or all, got {text!r}")
    return value


def dataset_list(text: str) -> list[str]:
    """--ood: comma-separated dataset names, each known (datasets/specs.py: data)."""
    from ..datasets.base import DatasetError
    from ..datasets.specs import DATASETS
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected at least one dataset name, e.g. inaturalist-ood,textures-ood")
    try:
        names = [DATASETS.canonical(n) for n in names]
    except DatasetError as exc:
        raise argparse.ArgumentTypeError(" ".join(str(exc).split())) from None
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a dataset is listed twice: {','.join(names)}")
    return names


def ood_ratio(text: str) -> float:
    from ..datasets.openset import MAX_OOD_RATIO
    try:
        value = float(Fraction(text.strip()))
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"expected a number of OOD images per ID image, got {text!r}") from None
    if not 0 < value <= MAX_OOD_RATIO:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most {MAX_OOD_RATIO:g} (OOD images per ID "
                                         f"image), got {text}")
    return value

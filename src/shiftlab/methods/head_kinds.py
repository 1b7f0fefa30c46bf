"""The class heads (text classifiers) methods read: each kind declared once, with how it is built for a
method and how `shiftlab methods` and the README say it in words.

A method names its head: the `text_head` field of its config where it has one (then `--set M.text_head=`
picks among the field's choices), else its class attribute `Method.text_head`. The kinds:

- `zeroshot`: "a photo of a {}." (`ClassHeads.zeroshot`).
- `ensemble`: templates averaged per class (normalised mean of normalised embeddings): the config's
  `templates` (a dataset's own under `--protocol paper`) or `head_templates` (a method's own list: OnZeta),
  else CLIP's 80 (`ClassHeads.ensemble`, `ClassHeads.templated`).
- `tip_cupl`: DMN's head, templates pooled with CuPL's sentences per class (`cupl_file`, not shipped): the
  config's `templates`, else the method's `cupl_templates` ("tip": Tip-Adapter's 7, "clip80": CLIP's 80).
- `prompt`: context vectors the method tunes per image (the TPT family), started from `ctx_init` or a
  `ctx_checkpoint`; the method builds it (shiftlab.models.text.ContextPrompt).

A method with a head of its own declares it in its spec (`methods/<name>/spec.py`) with `register_head`.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..options import name_of, say_set

if TYPE_CHECKING:
    import torch
# no torch, numpy or text tower at import: the specs' head descriptions (`describe`) are read without them

TIP_CUPL = "tip_cupl"
CUPL_TEMPLATES = {"tip": "7 Tip-Adapter templates", "clip80": "CLIP's 80 templates"}


@dataclass(frozen=True)
class HeadKind:
    name: str
    # (method class, its effective config as a dict) -> the head in words
    describe: Callable[[type, Mapping[str, Any]], str]
    # method -> (C, D) normalised class features; None: the method builds it itself
    build: Callable[[Any], torch.Tensor] | None = None


_KINDS: dict[str, HeadKind] = {}


def register_head(name: str, describe: Callable[[type, Mapping[str, Any]], str],
                  build: Callable[[Any], torch.Tensor] | None = None) -> HeadKind:
    """Declare a head kind (once: a second declaration of a name is refused)."""
    if name in _KINDS:
        raise ValueError(f"text head {name!r} is declared twice")
    _KINDS[name] = HeadKind(name, describe, build)
    return _KINDS[name]


def head_kinds() -> list[str]:
    """The declared head kinds, sorted."""
    return sorted(_KINDS)


def kind_of(cls: type, fields: Mapping[str, Any]) -> str:
    """The head kind a method reads under an effective config (`fields`)."""
    return fields.get("text_head", cls.text_head)


def describe(cls: type, fields: Mapping[str, Any]) -> str:
    """The class head a method reads under an effective config (`fields`), in words."""
    kind = kind_of(cls, fields)
    if kind not in _KINDS:
        raise ValueError(f"{cls.name}: text head {kind!r} is not declared (shiftlab.methods.head_kinds.register_head)")
    return _KINDS[kind].describe(cls, fields)


def text_head(method: Any) -> torch.Tensor:
    """The (C, D) class head the method names (its config's `text_head`, else its class's)."""
    kind = getattr(method.config, "text_head", method.spec.text_head)
    found = _KINDS.get(kind)
    if found is None or found.build is None:
        built = ", ".join(repr(k) for k, v in sorted(_KINDS.items()) if v.build is not None)
        raise ValueError(f"{method.name}: text_head must be one of {built}, got {kind!r}")
    return found.build(method)


# -- the kinds ------------------------------------------------------------------------------------------

def _ensemble_templates(config: Any) -> Sequence[str] | None:
    return getattr(config, "templates", None) or getattr(config, "head_templates", None)


def _ensemble_words(cls: type, fields: Mapping[str, Any]) -> str:
    if fields.get("head_templates"):
        return f"{len(fields['head_templates'])} templates of the method's code (head_templates)"
    if fields.get("templates"):
        return f"{len(fields['templates'])} templates of the dataset"
    return "CLIP's 80 templates"


def _ensemble(method: Any) -> torch.Tensor:
    templates = _ensemble_templates(method.config)
    return method.heads.templated(list(templates)) if templates else method.heads.ensemble


def cupl_templates(cls: type) -> str:
    """The templates a method's `tip_cupl` head pools where its config sets none (a key of CUPL_TEMPLATES)."""
    return getattr(cls, "cupl_templates", "tip")


def _tip_cupl_words(cls: type, fields: Mapping[str, Any]) -> str:
    return f"{TIP_CUPL}: {CUPL_TEMPLATES[cupl_templates(cls)]} + CuPL descriptions (cupl_file)"


def _tip_cupl(method: Any) -> torch.Tensor:
    templates = getattr(method.config, "templates", None)
    if cupl_templates(method.spec) == "clip80":
        from ..datasets.classes import load_templates
        templates = tuple(templates) if templates else tuple(load_templates())
    return method.heads.tip_cupl(check_cupl_file(method), f"{method.name}.cupl_file", templates)


def _prompt_words(cls: type, fields: Mapping[str, Any]) -> str:
    init = fields["ctx_init"]
    n_ctx = fields["n_ctx"] if "n_ctx" in fields else len(init.split())   # no n_ctx field: one token per word
    if fields.get("ctx_checkpoint"):
        return f"{n_ctx} tuned context tokens from {fields['ctx_checkpoint']} + '{{}}.'"
    return f"{n_ctx} tuned context tokens from " + (f"'{init}'" if init else "random") + " + '{}.'"


register_head("zeroshot", lambda cls, fields: "'a photo of a {}.'", lambda method: method.heads.zeroshot)
register_head("ensemble", _ensemble_words, _ensemble)
register_head(TIP_CUPL, _tip_cupl_words, _tip_cupl)
register_head("prompt", _prompt_words)


# -- CuPL's descriptions (the tip_cupl head) ------------------------------------------------------------

def check_cupl_file(method: Any) -> str:
    """The method's `cupl_file` when its text head needs one (one-line ValueError when it is not set)."""
    return _cupl_path(method.name, method.config)


def cupl_problem(name: str, config: object) -> str | None:
    """Why method `name` cannot use `config`: its text head is `tip_cupl` but no CuPL file is given (one line),
    or None. Torch-free: a spec's `config_problem` (a run plan, `--methods all`) asks it before torch."""
    if getattr(config, "text_head", None) == TIP_CUPL and hasattr(config, "cupl_file") and not config.cupl_file:
        return _no_cupl_file(name)
    return None


def _no_cupl_file(name: str) -> str:
    return (f"{name}.cupl_file: text_head 'tip_cupl' needs CuPL's class descriptions (a JSON file, class name -> "
            f"sentences, not shipped): pass {say_set(name, 'cupl_file', 'PATH')} "
            f"(or {say_set(name, 'text_head', 'ensemble')})")


def _cupl_path(name: str, config: object) -> str:
    path = config.cupl_file
    if not path:
        raise ValueError(_no_cupl_file(name))
    if os.path.isdir(os.path.expanduser(path)):   # dataset_cupl_file picks the file when the run has a dataset
        raise ValueError(f"{name}.cupl_file: {path!r} is a directory; the run's dataset picks the file in it "
                         f"({name_of('dataset')} or {name_of('suite')}), without one pass the file itself")
    return path


def check_descriptions(name: str, config: object, classnames: Sequence[str] | None) -> None:
    """Refuse (one line) a `tip_cupl` head whose CuPL file is unset, missing, or lacks a class of
    `classnames` (None: only the file's path is checked): before any work, not at the first sample."""
    if getattr(config, "text_head", None) != TIP_CUPL or not hasattr(config, "cupl_file"):
        return
    path = _cupl_path(name, config)
    if classnames is not None:
        from ..models.text import load_descriptions
        load_descriptions(path, classnames, f"{name}.cupl_file")


def dataset_cupl_file(path: str, dataset: str, names: Mapping[str, str], field: str = "cupl_file") -> str:
    """`path` when it is a file; when it is a directory of CuPL's per-dataset files, the one `names` (the
    method's `cupl_files`: canonical dataset -> file name) gives for `dataset`. A one-line ValueError naming
    the directory, the dataset and the expected file when that is missing."""
    from ..datasets.specs import DATASETS
    if not os.path.isdir(os.path.expanduser(path)):
        return path
    expected = names.get(DATASETS.canonical(dataset)) if dataset in DATASETS else None
    if expected is None:
        raise ValueError(f"{field}: {path!r} is a directory of CuPL files, but DMN names none for dataset "
                         f"{dataset!r}: pass the file itself (class name -> sentences)")
    chosen = os.path.join(path, expected)
    if not os.path.isfile(os.path.expanduser(chosen)):
        raise ValueError(f"{field}: directory {path!r} has no CuPL file for dataset {dataset!r} "
                         f"(expected {expected})")
    return chosen

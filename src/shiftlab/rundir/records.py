"""The record: one (sample, method, setting) outcome, its constructors and the one schema every reader applies.

This module owns the contract of `records.jsonl` (docs/ARCHITECTURE.md's schema is tested
against `Record`): the typed record and its constructors, `check_record` (fields and types) and
`RecordSchema` (which run a record belongs to), and the resume key. records.jsonl is strict JSON:
no NaN or Infinity literals are written (a method's non-finite scores become an error record
saying so) and none are read. Writing and reading the files: rundir/record_files.py."""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..options import name_of

if TYPE_CHECKING:
    from ..methods.base import MethodOutput


Key = tuple  # (id, method or None, setting)


@dataclass
class Record:
    """One line of records.jsonl. Optional fields that are None are left out of the JSON.

    A prediction record has pred/top5/confidence/true_prob/correct/seconds/extras; an error
    record has `error` instead (`method` None: the sample failed before any method ran,
    which covers every method of that setting). `attack` is set on attacked settings.
    """
    id: int                              # index in the dataset's sorted sample list
    path: str = ""                       # sample path relative to the dataset root
    label: int | None = None
    setting: str = "clean"               # "clean" or the attack name
    method: str | None = None
    pred: int | None = None
    top5: list[int] | None = None
    confidence: float | None = None      # max softmax probability of the method's score vector
    true_prob: float | None = None       # probability of the true class (for NLL)
    correct: bool | None = None
    seconds: float | None = None         # the method's seconds for this sample (batch mean)
    extras: dict[str, Any] | None = None  # method-specific JSON scalars
    attack: dict[str, Any] | None = None  # {"name", the attack's record_fields, what it measured per sample}
    error: str | None = None
    # open-set runs (engine/shifts.py): whether the sample is out-of-distribution (then `label`, `true_prob` and
    # `correct` are null: it has no ID class) and the method's OOD score, MCM's max softmax probability (higher:
    # more in-distribution); both absent from closed-set runs
    ood: bool | None = None
    ood_score: float | None = None
    # open-set predictions of a method whose spec declares its own OOD score (`MethodSpec.own_ood_score`): that
    # score (any finite number; higher: more in-distribution), beside MCM's `ood_score`
    own_ood_score: float | None = None
    # not a JSON field: the float16 probability vector (C,) of a prediction, for `--save-probs`
    # (shiftlab.rundir.probs); kept out of records.jsonl, equality and repr
    probs: Any = field(default=None, repr=False, compare=False, metadata={"side": True})

    # -- constructors ------------------------------------------------------------------------
    @classmethod
    def prediction(cls, *, id: int, path: str, label: int | None, setting: str, method: str, output: MethodOutput,
                   seconds: float, attack: dict | None = None, ood: bool | None = None) -> Record:
        """From a MethodOutput (logits + extras); an error record when its scores are not finite
        (a diverged tuning step), since records.jsonl holds no NaN. `ood` (open-set runs): the sample is
        out-of-distribution (`label` None) or not; the record then carries its `ood_score`."""
        import torch
        logits = output.logits.detach().float().cpu()
        probs = output.probabilities().detach().float().cpu()
        problem = _non_finite(logits, probs, output.extras)
        own = None if ood is None or output.ood_score is None else float(output.ood_score)
        if not problem and own is not None and not math.isfinite(own):
            problem = f"its own OOD score is {own}"
        if problem:
            return cls.failure(id=id, path=path, label=label, setting=setting, method=method, ood=ood,
                               error=f"non-finite scores from {method}: {problem}").with_attack(attack)
        pred = int(logits.argmax())
        confidence = float(probs.max())
        known = label is not None
        return cls(id=int(id), path=str(path), label=int(label) if known else None, setting=setting, method=method,
                   pred=pred, top5=probs.topk(min(5, probs.numel())).indices.tolist(), confidence=confidence,
                   true_prob=float(probs[label]) if known else None, correct=pred == label if known else None,
                   seconds=seconds, extras=output.extras, attack=attack, probs=probs.to(torch.float16),
                   ood=None if ood is None else bool(ood), ood_score=None if ood is None else ood_score(probs),
                   own_ood_score=own)

    @classmethod
    def failure(cls, *, id: int, path: str, label: int | None, setting: str, method: str | None, error: str,
                ood: bool | None = None) -> Record:
        """An error record: `method` None when the sample failed before any method (decoding)."""
        return cls(id=int(id), path=str(path), label=None if label is None else int(label), setting=setting,
                   method=method, error=error, ood=None if ood is None else bool(ood))

    def with_attack(self, info: dict | None) -> Record:
        """This record with the attack's per-sample info merged in (attacked settings)."""
        return self if info is None else dataclasses.replace(self, attack=dict(info))

    # -- (de)serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in _json_fields():
            value = getattr(self, f.name)
            if value is not None or f.name in ("method", "setting"):
                out[f.name] = value
        if self.ood is True:   # an OOD sample has no ID class: its label (and a prediction's scores of it) are null
            out.update({k: getattr(self, k) for k in (("label",) if self.error is not None
                                                       else ("label", "true_prob", "correct"))})
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Record:
        """Validate a parsed line (`check_record`); raises ValueError when it is not a record."""
        return check_record(data)

    @property
    def is_prediction(self) -> bool:
        """A scorable prediction (not an error record, not a fragment)."""
        return (self.error is None and self.method is not None and isinstance(self.pred, int)
                and isinstance(self.label, int) and not isinstance(self.pred, bool))

    @property
    def key(self) -> Key:
        return (self.id, self.method, self.setting)


def ood_score(probs: Any) -> float:
    """MCM's OOD score of a prediction (Ming et al., NeurIPS 2022): the maximum of the method's own class
    probabilities (for CLIP, the softmax of its scaled cosine logits); higher means more in-distribution."""
    return float(probs.max())


def record_key(rec: Mapping[str, Any] | Record) -> Key:
    """The resume key (id, method, setting); an error record with method None covers every method."""
    if isinstance(rec, Record):
        return rec.key
    return (rec["id"], rec.get("method"), rec.get("setting", "clean"))


def is_missing(sid: int, method: str, setting: str, done: set) -> bool:
    return (sid, method, setting) not in done and (sid, None, setting) not in done


def as_dict(rec: Mapping[str, Any] | Record) -> dict[str, Any]:
    return rec.to_dict() if isinstance(rec, Record) else dict(rec)


def dumps(rec: Mapping[str, Any] | Record) -> str:
    """One line of strict JSON (a NaN would raise here rather than be written as a bare literal)."""
    return json.dumps(as_dict(rec), sort_keys=True, allow_nan=False) + "\n"


def _non_finite(logits: Any, probs: Any, extras: Mapping[str, Any] | None) -> str:
    """Why a method's output cannot be a prediction record ('' when it can). -inf logits are allowed
    (a class ruled out); NaN or +inf logits, non-finite probabilities and extras are not."""
    import torch
    nan, pos = int(torch.isnan(logits).sum()), int((logits == math.inf).sum())
    if nan or pos:
        return " and ".join(f"{k} {what}" for k, what in ((nan, "NaN"), (pos, "+inf")) if k) + \
            f" of {logits.numel()} logits"
    bad = int((~torch.isfinite(probs)).sum())
    if bad:
        return f"{bad} non-finite of {probs.numel()} probabilities"
    extras_bad = [k for k, v in (extras or {}).items() if _has_non_finite(v)]
    return f"non-finite extras ({', '.join(extras_bad)})" if extras_bad else ""


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, Mapping):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_non_finite(v) for v in value)
    return False


# -- the schema: what every reader accepts ---------------------------------------------------

def _json_fields() -> tuple[dataclasses.Field, ...]:
    return tuple(f for f in dataclasses.fields(Record) if not f.metadata.get("side"))


FIELDS = frozenset(f.name for f in _json_fields())
BASE_FIELDS = ("id", "path", "label", "setting", "method")          # both kinds of record
PREDICTION_FIELDS = ("pred", "top5", "confidence", "true_prob", "correct", "seconds")
PROB_SLACK = 1e-5   # float32 softmax (and mixtures of probabilities) may round a hair above 1


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_record(data: Any) -> Record:
    """The record a parsed line holds, or ValueError naming the first thing wrong with it.

    Every record: `id`, `label` (integers >= 0), `path` (a string), `setting` (a non-empty string),
    `method` (a name; null only on an error record). A prediction record also has all of `pred`,
    `top5` (class indices), `confidence` and `true_prob` (probabilities), `correct` (a bool equal
    to pred == label) and `seconds` (>= 0); an error record has a non-empty `error` string and none
    of those. `extras` and `attack` are objects when present. No other field, no non-finite number.
    Open-set runs: `ood` is a bool; an OOD sample's record (`ood` true) has `label`, `true_prob` and
    `correct` null; a prediction of an open-set run has `ood_score` (a probability) as well.
    """
    if not isinstance(data, Mapping):
        raise ValueError("not a JSON object")
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise ValueError(f"unknown field(s): {', '.join(map(str, unknown))}")
    error = data.get("error") is not None
    missing = [k for k in BASE_FIELDS + (("error",) if error else PREDICTION_FIELDS) if k not in data]
    if missing:
        raise ValueError(f"missing field(s): {', '.join(missing)}")

    def wrong(name: str, what: str) -> ValueError:
        return ValueError(f"{name} must be {what}, got {_short(data[name])}")
    ood = data.get("ood")
    if ood is not None and not isinstance(ood, bool):
        raise wrong("ood", "true or false")
    for name in ("id", "label"):
        if name == "label" and ood is True:
            if data[name] is not None:
                raise wrong(name, "null on an out-of-distribution sample (ood true)")
            continue
        if not _is_int(data[name]) or data[name] < 0:
            raise wrong(name, "an integer >= 0")
    if not isinstance(data["path"], str):
        raise wrong("path", "a string")
    if not isinstance(data["setting"], str) or not data["setting"]:
        raise wrong("setting", "a non-empty string")
    if not (isinstance(data["method"], str) and data["method"]) and not (error and data["method"] is None):
        raise wrong("method", "a method name" + (" or null" if error else ""))
    for name in ("extras", "attack"):
        if data.get(name) is not None and not isinstance(data[name], Mapping):
            raise wrong(name, "an object")
        if _has_non_finite(data.get(name)):
            raise ValueError(f"{name} holds a non-finite number")
    if error:
        if not isinstance(data["error"], str):
            raise wrong("error", "a string")
        extra = [k for k in PREDICTION_FIELDS if data.get(k) is not None]
        if extra:
            raise ValueError(f"an error record has no {', '.join(extra)}")
        return Record(**data)
    if not _is_int(data["pred"]) or data["pred"] < 0:
        raise wrong("pred", "an integer >= 0")
    top5 = data["top5"]
    if not isinstance(top5, list) or not top5 or not all(_is_int(c) and c >= 0 for c in top5):
        raise wrong("top5", "a non-empty list of class indices")
    probabilities = ("confidence", "true_prob") + (("ood_score",) if ood is not None else ())
    for name in probabilities:
        if name in ("true_prob", "correct") and ood is True:
            continue
        if not _is_number(data.get(name)) or not 0 <= data[name] <= 1 + PROB_SLACK:
            if name not in data:
                raise ValueError("missing field(s): ood_score (a prediction of an open-set run)")
            raise wrong(name, "a probability in [0, 1]")
    own = data.get("own_ood_score")
    if own is not None and (ood is None or not _is_number(own)):
        raise wrong("own_ood_score", "a finite number on an open-set prediction (ood true or false)")
    if ood is True:
        for name in ("true_prob", "correct"):
            if data[name] is not None:
                raise wrong(name, "null on an out-of-distribution sample (ood true)")
    elif not isinstance(data["correct"], bool) or data["correct"] != (data["pred"] == data["label"]):
        raise wrong("correct", f"pred == label ({data['pred'] == data['label']})")
    if not _is_number(data["seconds"]) or data["seconds"] < 0:
        raise wrong("seconds", "a number of seconds >= 0")
    return Record(**data)


# `--attack-target`: the attack on zero-shot CLIP scored on every method (R-TPT's protocol, the setting named as the
# attack), on each method's own prediction (the setting "<attack>-adaptive"), or both side by side
TRANSFER, ADAPTIVE, BOTH = "transfer", "adaptive", "both"
ATTACK_TARGETS = (TRANSFER, ADAPTIVE, BOTH)
ADAPTIVE_SUFFIX = "-adaptive"


def is_adaptive(setting: str) -> bool:
    """Whether a setting is an attack through the methods' own predictions (`--attack-target adaptive`)."""
    return setting.endswith(ADAPTIVE_SUFFIX)


def run_settings(attack: Mapping[str, Any] | None, clean_and_robust: bool, target: str = TRANSFER) -> list[str]:
    """A run's settings: ["clean"], or the attack's name (after "clean" with clean_and_robust); with `target`
    "adaptive" the attack's adaptive setting "<attack>-adaptive" instead, with "both" the two, transfer first. An
    attack given a list of budgets (`eps: [1/255, 4/255]`, one pass over several) has one setting per budget,
    `budget_setting(name, eps)`: "apgd_ce@eps1", "apgd_ce@eps4" (adaptive: "apgd_ce@eps1-adaptive", ...)."""
    name = (attack or {}).get("name", "none")
    if name == "none":
        return ["clean"]
    eps = (attack or {}).get("eps")
    budgets = [budget_setting(name, e) for e in eps] if isinstance(eps, list) else [name]
    adaptive = [b + ADAPTIVE_SUFFIX for b in budgets]
    attacked = {TRANSFER: budgets, ADAPTIVE: adaptive, BOTH: budgets + adaptive}[target]
    return ["clean", *attacked] if clean_and_robust else attacked


def budget_setting(name: str, eps: float) -> str:
    """The setting of one budget of an eps list: 'pgd@eps4' for 4/255 (k/255 as k), 'pgd@eps=0.01' for
    another value (no '/': a setting may name files)."""
    k = float(eps) * 255
    return f"{name}@eps{round(k)}" if abs(k - round(k)) < 1e-3 else f"{name}@eps={float(eps):.4g}"


@dataclass(frozen=True)
class RecordSchema:
    """`check_record`, and that the record belongs to this run: each field that is None is not known
    to the reader and not checked (the report of a run without run.json checks the fields only)."""
    methods: frozenset[str] | None = None       # the run's methods (run.json's)
    settings: frozenset[str] | None = None
    n_samples: int | None = None                # ids are 0 <= id < n_samples
    ids: frozenset[int] | None = None           # the run's stream (its --limit prefix)
    samples: Sequence[tuple[Any, int]] | None = None   # (path, label) of each id, when the dataset is at hand
    n_classes: int | None = None
    attack: Mapping[str, Any] | None = None     # the run's attack config (run.json's `shared.attack`)

    def check(self, data: Any) -> Record:
        rec = check_record(data)
        if self.attack is not None and rec.setting != "clean" and isinstance(rec.attack, Mapping):
            self._check_attack(rec)
        if self.methods is not None and rec.method is not None and rec.method not in self.methods:
            raise ValueError(f"method {rec.method!r} is not one of the run's methods (run.json)")
        if self.settings is not None and rec.setting not in self.settings:
            raise ValueError(f"setting {rec.setting!r} is not one of the run's ({', '.join(sorted(self.settings))})")
        n = len(self.samples) if self.samples is not None else self.n_samples
        if n is not None and rec.id >= n:
            raise ValueError(f"id {rec.id} is not one of the run's {n} samples")
        if self.ids is not None and rec.id not in self.ids:
            raise ValueError(f"sample {rec.id} is not in the run's stream (its {name_of('limit')})")
        if self.samples is not None:
            path, label = self.samples[rec.id]
            if rec.path != str(path) or rec.label != label:
                raise ValueError(f"path {rec.path!r} and label {rec.label} are not sample {rec.id}'s "
                                 f"({str(path)!r}, {label})")
        if self.n_classes is not None:
            classes = ([rec.label] if rec.label is not None else []) + ([rec.pred] if rec.pred is not None else [])
            top = max(classes + list(rec.top5 or []), default=-1)
            if top >= self.n_classes:
                raise ValueError(f"class {top} is not one of the run's {self.n_classes} classes")
        return rec

    def _check_attack(self, rec: Record) -> None:
        """An attacked record's `attack` fields that the run's attack config has are that config's (an eps list's:
        its setting's budget's): a record of another budget, step count or attack is not this run's."""
        want, got = self.attack, rec.attack
        name = want.get("name")
        if got.get("name") != name:
            raise ValueError(f"attack {got.get('name')!r} is not the run's ({name})")
        eps = want.get("eps")
        setting = rec.setting.removesuffix(ADAPTIVE_SUFFIX)
        k = next((i for i, e in enumerate(eps) if budget_setting(str(name), e) == setting), None) \
            if isinstance(eps, list) else None
        for key, value in want.items():
            if key == "name" or key not in got:
                continue
            if isinstance(value, list):
                if k is None or k >= len(value):
                    continue
                value = value[k]
            if got[key] != value:
                raise ValueError(f"its attack's {key} {got[key]!r} is not the run's ({value!r})")

    @classmethod
    def of_run(cls, identity: Mapping[str, Any] | None, **known: Any) -> RecordSchema:
        """The schema of the run whose run.json holds `identity` (methods, settings, number of samples),
        with what else the reader knows (`ids`, `samples`, `n_classes`)."""
        if not isinstance(identity, Mapping):
            return cls(**known)
        shared = identity.get("shared") if isinstance(identity.get("shared"), Mapping) else {}
        methods = identity.get("methods") if isinstance(identity.get("methods"), Mapping) else {}
        n = shared.get("n_samples")
        attack = shared.get("attack")
        if isinstance(attack, Mapping) and attack.get("name", "none") != "none" and "attack" not in known:
            known["attack"] = attack
        return cls(methods=frozenset(methods),
                   settings=frozenset(run_settings(shared.get("attack"), bool(shared.get("clean_and_robust")),
                                                   shared.get("attack_target", TRANSFER))),
                   n_samples=n if _is_int(n) else None, **known)


_FIELDS_ONLY = RecordSchema()


def schema_fields() -> list[str]:
    """The record's JSON keys, in declaration order (docs/ARCHITECTURE.md is tested against them)."""
    return [f.name for f in _json_fields()]

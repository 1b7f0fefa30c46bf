"""Read run directories into per-(method, setting) arrays.

records.jsonl is the source of truth for every metric; summary.json only
supplies the run config and the timing. A run still being written, or killed
mid-line, must still be reportable, so lines the records' schema refuses (read
with the run's own schema from run.json, as `shiftlab merge` reads them) are
counted and named in a warning, not fatal.
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from shiftlab.results.display import attack_label, run_label
from shiftlab.results.summary import run_config, run_schema
from shiftlab.rundir import probs
from shiftlab.rundir.identity import RunIdentityError
from shiftlab.rundir.identity import read as read_identity
from shiftlab.rundir.record_files import record_files, scan
from shiftlab.rundir.records import ADAPTIVE_SUFFIX, is_adaptive


class ReportError(Exception):
    """A problem with the inputs that the user must fix (bad path, no records)."""


@dataclass
class Series:
    """One method's predictions in one setting of one run, aligned arrays sorted by id."""

    run: Run
    method: str
    setting: str          # as in the records: "clean" or the attack name
    setting_label: str    # "clean" or the attack's label, e.g. "pgd eps=1/255", so different budgets never mix
    attack_eps: float | None   # the attack's `eps` field, for an attack that has one
    ids: np.ndarray
    labels: np.ndarray
    preds: np.ndarray
    correct: np.ndarray
    confidence: np.ndarray
    true_prob: np.ndarray
    top5: list | None     # None when any record lacks a top-5 list
    paths: list[str]
    seconds: np.ndarray
    errors: int = 0
    key: str = ""         # unique display name across the report (set by assign_keys)
    probs: np.ndarray | None = None   # (n, C) float16 vectors (--save-probs); None unless every record has one
    # an open-set run (engine/shifts.py): the OOD scores of its ID samples (this series' records) and of its OOD
    # samples (no class: not in the arrays above); None for a closed-set run
    id_scores: np.ndarray | None = None
    ood_scores: np.ndarray | None = None
    # where a method of the run has an OOD score of its own: this series' "own score" column (results.ood.score_own:
    # its own score, or MCM's), {"score", "auroc", "fpr95", "aupr", ...}; None otherwise
    own_ood: dict | None = None

    @property
    def n(self) -> int:
        return int(self.ids.size)


@dataclass
class Run:
    path: Path
    name: str
    config: dict
    summary: dict
    series: list[Series] = field(default_factory=list)
    error_records: list[dict] = field(default_factory=list)
    bad_lines: int = 0
    duplicates: int = 0
    warnings: list[str] = field(default_factory=list)

    samples_tag: str = ""   # set by load_runs when runs of one dataset name saw different sample lists

    @property
    def dataset(self) -> str:
        """The dataset's name; runs only share a dataset (and are paired by sample id) when they
        saw the same sample list, so otherwise a tag from the sample-list fingerprint is added."""
        name = str(self.config.get("dataset") or "unknown")
        return f"{name} [{self.samples_tag}]" if self.samples_tag else name

    @property
    def samples_sha256(self) -> str | None:
        """Fingerprint of the sample list the run saw (summary.json's identity, else run.json)."""
        ident = self.summary.get("identity")
        if not isinstance(ident, dict):
            try:
                ident = json.loads((self.path / "run.json").read_text())
            except (OSError, ValueError):
                ident = {}
        value = (ident.get("shared") or {}).get("samples_sha256") if isinstance(ident, dict) else None
        return str(value) if value else None

    @property
    def label(self) -> str:
        """Human label from the config: model (weights) on dataset [, attack]."""
        c = self.config
        return run_label(c.get("model"), c.get("pretrained"), self.dataset, self.summary.get("attack"))

    @property
    def classnames(self) -> list[str] | None:
        names = self.config.get("classnames")
        return [str(x) for x in names] if isinstance(names, list) else None

    def seconds_per_image(self, method: str) -> float | None:
        value = (self.summary.get("methods") or {}).get(method, {}).get("seconds_per_image")
        return float(value) if isinstance(value, (int, float)) else None


def _setting_label(setting: str, attack: dict | None) -> str:
    if setting == "clean" or not attack:
        return setting
    adaptive = is_adaptive(setting)   # 'pgd eps=4/255 adaptive': one column for every method, whatever its mode
    setting = setting.removesuffix(ADAPTIVE_SUFFIX)
    # one budget of an eps list ("apgd_ce@eps4"): its record's attack names the attack and its budget
    name = attack.get("name") if setting.startswith(f"{attack.get('name')}@") else setting
    return attack_label({**attack, "name": name}) + (" adaptive" if adaptive else "")


def load_run(path: str | Path) -> Run:
    path = Path(path)
    if not path.is_dir():
        raise ReportError(f"run directory not found: {path}")
    files = record_files(path)  # records.jsonl, plus per-rank shards of a run still going
    if not files:
        raise ReportError(f"{path / 'records.jsonl'} does not exist: {path} is not a shiftlab run "
                          f"directory (expected records.jsonl in it)")
    summary: dict = {}
    warnings = []
    summary_path = path / "summary.json"
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text())
        except json.JSONDecodeError as exc:
            warnings.append(f"{summary_path} is not valid JSON ({exc}); config unknown")
    else:
        warnings.append(f"{summary_path} is missing (run unfinished?): config unknown, "
                        f"seconds per image taken from the records")
    try:
        ident = read_identity(path) or {}
    except RunIdentityError as exc:
        ident = {}
        warnings.append(f"{exc}: the records are checked for their fields only")
    config = summary.get("config") if isinstance(summary.get("config"), dict) else {}
    run = Run(path=path, name=path.resolve().name, config=dict(config or run_config(ident)),
              summary=summary, warnings=warnings)
    schema = run_schema(ident, stream=False)
    problems: list[str] = []
    summary_attack = summary.get("attack") if isinstance(summary.get("attack"), dict) else None

    # (method, setting) -> {id: record}. The first record of a key wins, as in
    # shiftlab.rundir.record_files.load_records (resume never rewrites a finished key).
    groups: dict[tuple[str, str], dict[int, dict]] = {}
    ood_groups: dict[tuple[str, str], dict[int, dict]] = {}   # open-set runs: the OOD samples' records
    error_keys: set = set()
    attack_of: dict[str, dict | None] = {}   # setting -> its attack config (a record's, else the summary's)
    for file in files:
        for line in scan(file, include_torn=True, schema=schema):
            rec = line.record
            if rec is None:          # garbage, a NUL-filled block, a killed writer's torn last line, not a record
                run.bad_lines += 1
                problems.append(f"{file}:{line.number}: {line.problem}")
                continue
            sid = rec["id"]
            setting = str(rec.get("setting") or "clean")
            if "error" in rec:
                key = (sid, rec.get("method"), setting)
                run.duplicates += key in error_keys
                if key not in error_keys:
                    error_keys.add(key)
                    run.error_records.append(rec)
                continue
            if setting != "clean" and setting not in attack_of:
                attack_of[setting] = rec.get("attack") or summary_attack
            bucket = (ood_groups if rec.get("ood") is True else groups).setdefault((str(rec["method"]), setting), {})
            run.duplicates += sid in bucket
            bucket.setdefault(sid, rec)

    errors = Counter((r.get("method"), str(r.get("setting") or "clean")) for r in run.error_records)
    for (method, setting), by_id in sorted(groups.items()):
        run.series.append(_to_series(run, method, setting, attack_of.get(setting), by_id,
                                     errors[(method, setting)] + errors[(None, setting)]))
    _attach_probs(run, groups)
    _attach_ood_scores(run, groups, ood_groups)
    if not run.series:
        run.warnings.append(f"{path} holds no prediction records")
    if run.bad_lines:
        run.warnings.append(f"{run.bad_lines} unreadable or incomplete line(s) in the records skipped ("
                            + "; ".join(problems[:3]) + ("; ..." if len(problems) > 3 else "") + ")")
    if run.duplicates:
        run.warnings.append(f"{run.duplicates} duplicate (id, method, setting) record(s); the first one was used")
    return run


def _to_series(run: Run, method: str, setting: str, attack: dict | None, by_id: dict[int, dict],
               errors: int) -> Series:
    recs = [by_id[i] for i in sorted(by_id)]

    def floats(name):
        return np.array([float(r[name]) if isinstance(r.get(name), (int, float)) else np.nan
                         for r in recs], dtype=np.float64)

    labels = np.array([int(r["label"]) for r in recs], dtype=np.int64)
    preds = np.array([int(r["pred"]) for r in recs], dtype=np.int64)
    correct = np.array([bool(r.get("correct", p == y)) for r, p, y in zip(recs, preds, labels)])
    top5 = [r.get("top5") for r in recs]
    return Series(
        run=run, method=method, setting=setting, setting_label=_setting_label(setting, attack),
        attack_eps=_eps(attack), ids=np.array(sorted(by_id), dtype=np.int64), labels=labels, preds=preds,
        correct=correct, confidence=floats("confidence"), true_prob=floats("true_prob"),
        top5=None if any(not isinstance(t, list) for t in top5) else top5,
        paths=[str(r.get("path", "")) for r in recs], seconds=floats("seconds"), errors=errors)


def _attach_ood_scores(run: Run, groups: dict, ood_groups: dict) -> None:
    """Each series' OOD scores of an open-set run: its ID records' and the OOD records' of the same method (and the
    own-score column where a method of the run has a score of its own)."""
    from ..methods.catalogue.listing import own_ood_score
    from ..results.ood import score_own
    with_own = any(isinstance(r.get("own_ood_score"), (int, float))
                   for g in (groups, ood_groups) for recs in g.values() for r in recs.values())
    for s in run.series:
        id_recs = groups.get((s.method, s.setting), {}).values()
        if not any(isinstance(r.get("ood"), bool) for r in id_recs) and (s.method, s.setting) not in ood_groups:
            continue
        s.id_scores = np.array([float(r["ood_score"]) for r in id_recs if isinstance(r.get("ood_score"), (int, float))])
        s.ood_scores = np.array([float(r["ood_score"]) for r in ood_groups.get((s.method, s.setting), {}).values()
                                 if isinstance(r.get("ood_score"), (int, float))])
        if with_own:
            s.own_ood = score_own([*id_recs, *ood_groups.get((s.method, s.setting), {}).values()],
                                  own_ood_score(s.method))


def _eps(attack: dict | None) -> float | None:
    eps = (attack or {}).get("eps")
    return float(eps) if isinstance(eps, (int, float)) and not isinstance(eps, bool) else None


def _attach_probs(run: Run, groups: dict[tuple[str, str], dict[int, dict]]) -> None:
    """Each series' probability vectors (shiftlab.rundir.probs), when every one of its records has one."""
    if not probs.has_probs(run.path):
        return
    vectors = probs.match(run.path, [rec for by_id in groups.values() for rec in by_id.values()])
    for s in run.series:
        have = [vectors.get((int(i), s.method, s.setting)) for i in s.ids]
        missing = sum(v is None for v in have)
        if missing:
            run.warnings.append(f"{missing} of {s.n} {s.method} ({s.setting}) record(s) have no probability vector "
                                f"in {run.path / probs.PROBS}: metrics from the vectors (Brier) left out for it")
        elif have:
            s.probs = np.stack(have)


def _unique_run_names(runs: list[Run]) -> None:
    """Dir basenames, widened to parent/name and then numbered when they collide."""
    counts = Counter(r.name for r in runs)
    for r in runs:
        if counts[r.name] > 1:
            r.name = f"{r.path.resolve().parent.name}/{r.path.resolve().name}"
    seen: Counter = Counter()
    for r in runs:
        seen[r.name] += 1
        if seen[r.name] > 1:
            r.name = f"{r.name}#{seen[r.name]}"


def assign_keys(runs: list[Run]) -> None:
    """Display key per method: its name in a one-run report, else `name [run name]` for every
    method, so that no key reads as if it covered all runs while its neighbour does not. A method that read
    other test images carries its block in its key, `stata (batch-transductive)`, so every table, plot legend
    and paired row that names it says so (issue 40 case 5), not only the page's caveats."""
    _unique_run_names(runs)
    several = sum(1 for r in runs if r.series) > 1
    for r in runs:
        for s in r.series:
            recorded = r.config.get("reads_ahead")   # the run's record (single-image methods absent), else ""
            name = s.method + block_mark(s.method, recorded.get(s.method) if isinstance(recorded, dict) else "")
            s.key = f"{name} [{r.name}]" if several else name


def block_mark(method: str, reads_ahead: str | None = "") -> str:
    """' (batch-transductive)' or ' (transductive)' for a method that reads other test images, '' for a
    single-image one: from what the run recorded (`reads_ahead`: None or a value), else from the method's
    spec ("": not recorded; shiftlab.methods.catalogue.listing.block)."""
    from ..methods.catalogue import listing as catalogue
    if reads_ahead == "":
        block = catalogue.block(method)
    else:
        block = {"batch": catalogue.BATCH_TRANSDUCTIVE, "test_set": catalogue.TRANSDUCTIVE}.get(
            reads_ahead, catalogue.SINGLE_IMAGE)
    return "" if block == catalogue.SINGLE_IMAGE else f" ({block})"


def tag_sample_lists(runs: list[Run]) -> None:
    """Runs with one dataset name but different sample-list fingerprints (two `imagefolder` datasets,
    another version of a dataset) get distinct dataset labels, so the report never pairs their samples
    by id. A run without a fingerprint (older shiftlab) only matches others without one."""
    by_name: dict[str, set] = {}
    for r in runs:
        by_name.setdefault(r.dataset, set()).add(r.samples_sha256)
    for r in runs:
        if len(by_name[r.dataset]) > 1:
            fp = r.samples_sha256
            r.samples_tag = f"samples {fp[:8]}" if fp else "samples unknown"
            r.warnings.append(f"{r.path}: other runs of dataset {r.config.get('dataset')!r} saw a different "
                              f"sample list; its samples are not paired with theirs")


def load_runs(paths: Sequence[str | Path]) -> list[Run]:
    if not paths:
        raise ReportError("no run directories given")
    runs = [load_run(p) for p in paths]
    tag_sample_lists(runs)
    assign_keys(runs)
    if not any(r.series for r in runs):
        raise ReportError("none of the runs holds a prediction record: nothing to report")
    return runs

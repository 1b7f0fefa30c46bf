"""Run directories: records.jsonl (append-only, resumable), summary.json, summary.md.

A record's key is (id, method, setting). Records are appended one sample at a time
with a single write and a flush, so a process killed at any point leaves at most
one partial last line, which readers ignore and writers cut off before appending.
Under torchrun each rank appends to its own shard in `shards/`; `merge_records`
folds shards into records.jsonl (deduplicated, sorted), and is idempotent.
"""
from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from . import metrics
from .display import attack_label, is_random_weights, model_label

RECORDS = "records.jsonl"
SUMMARY = "summary.json"
SUMMARY_MD = "summary.md"
SHARDS = "shards"


def record_key(rec: dict) -> tuple:
    return (rec["id"], rec.get("method"), rec.get("setting", "clean"))


def iter_records(path: Path) -> Iterator[dict]:
    """Complete JSON lines of a records file; a torn last line is skipped."""
    if not path.is_file():
        return
    with open(path, "rb") as fh:
        for line in fh:
            if not line.endswith(b"\n"):
                break  # torn write of a killed process
            line = line.strip()
            if line:
                yield json.loads(line)


def record_files(run_dir: Path) -> list[Path]:
    run_dir = Path(run_dir)
    files = [run_dir / RECORDS] if (run_dir / RECORDS).is_file() else []
    shard_dir = run_dir / SHARDS
    if shard_dir.is_dir():
        files += sorted(shard_dir.glob("*.jsonl"))
    return files


def load_records(run_dir: Path) -> list[dict]:
    """All records of a run (merged file and shards), first occurrence of each key wins."""
    seen: set = set()
    out = []
    for path in record_files(run_dir):
        for rec in iter_records(path):
            key = record_key(rec)
            if key not in seen:
                seen.add(key)
                out.append(rec)
    return out


def done_keys(records: Iterable[dict]) -> set[tuple]:
    return {record_key(r) for r in records}


def _sort_key(rec: dict) -> tuple:
    return (rec["id"], rec.get("setting", "clean"), rec.get("method") or "")


def merge_records(run_dir: Path) -> Path:
    """Fold shards into records.jsonl, deduplicated and sorted by (id, setting, method)."""
    run_dir = Path(run_dir)
    records = sorted(load_records(run_dir), key=_sort_key)
    target = run_dir / RECORDS
    tmp = run_dir / (RECORDS + ".tmp")
    with open(tmp, "w") as fh:
        for rec in records:
            fh.write(json.dumps(rec, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    shard_dir = run_dir / SHARDS
    if shard_dir.is_dir():
        for shard in shard_dir.glob("*.jsonl"):
            shard.unlink()
        shard_dir.rmdir() if not any(shard_dir.iterdir()) else None
    return target


class RecordWriter:
    """Appends one sample's records per call with a single write + flush."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _cut_torn_tail(self.path)
        self._fh = open(self.path, "a", encoding="utf-8")

    def write(self, records: list[dict]) -> None:
        if records:
            self._fh.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
            self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _cut_torn_tail(path: Path) -> None:
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as fh:
        data = fh.read()
        if not data.endswith(b"\n"):
            fh.truncate(data.rfind(b"\n") + 1)


# -- summaries -------------------------------------------------------------------------

def score_records(recs: list[dict]) -> dict[str, Any]:
    return {
        "top1": metrics.top1([r["correct"] for r in recs]),
        "top5": metrics.topk_from_lists([r["label"] for r in recs], [r["top5"] for r in recs], 5),
        "ece": metrics.ece([r["confidence"] for r in recs], [r["correct"] for r in recs]),
        # 20 bins: C-TPT's ECE_Loss(20), the bin count of the published ECEs it is compared with
        "ece20": metrics.ece([r["confidence"] for r in recs], [r["correct"] for r in recs], n_bins=20),
        "nll": metrics.nll([r["true_prob"] for r in recs]),
        "n": len(recs),
    }


def summarize(records: list[dict], config: dict, timings: dict[str, float] | None = None) -> dict:
    """summary.json content from records (the source of truth) and measured timings."""
    by: dict[tuple[str, str], list[dict]] = defaultdict(list)
    errors = 0
    for r in records:
        if "error" in r:
            errors += 1
            continue
        by[(r["method"], r.get("setting", "clean"))].append(r)
    methods: dict[str, dict] = {}
    attack_setting = None
    for (name, setting), recs in sorted(by.items()):
        entry = methods.setdefault(name, {})
        scored = score_records(recs)
        seconds = sum(r.get("seconds", 0.0) for r in recs) / max(len(recs), 1)
        if setting == "clean":
            entry.update(scored)
            entry["method_seconds_per_image"] = seconds
        else:
            attack_setting = setting
            entry["robust"] = {"setting": setting, **scored, "method_seconds_per_image": seconds}
    timings = timings or {}
    shared = timings.get("shared_seconds_per_image", 0.0)
    for entry in methods.values():
        own = entry.get("method_seconds_per_image", entry.get("robust", {}).get("method_seconds_per_image", 0.0))
        entry["seconds_per_image"] = own + shared
    summary = {"config": config, "methods": methods, "errors": errors, "timings": timings}
    if attack_setting is not None:
        # `flipped` is measured on the zero-shot model and is the same in every method's record of a
        # sample, so count each attacked sample once, whichever methods ran.
        flips = {r["id"]: r["attack"]["flipped"] for r in records
                 if r.get("setting") == attack_setting and "attack" in r}
        summary["attack"] = {**config.get("attack", {}),
                             "success_rate": metrics.top1(list(flips.values())) if flips else None,
                             "n": len(flips)}
    return summary


def _fmt(x: Any) -> str:
    return "—" if x is None or (isinstance(x, float) and x != x) else f"{x:.2f}"


def summary_markdown(summary: dict, published: dict[str, dict] | None = None) -> str:
    published = published or {}
    robust = any("robust" in m for m in summary["methods"].values())
    head = ["method", "top-1", "top-5", "ECE", "ECE20", "NLL", "n", "s/img"]
    if robust:
        head += ["robust top-1"]
    if published:
        head += ["published top-1"]
    published_ece = any(row.get("paper_ece") is not None for row in published.values())
    if published_ece:
        head += ["published ECE (20 bins)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, m in summary["methods"].items():
        row = [name, _fmt(m.get("top1")), _fmt(m.get("top5")), _fmt(m.get("ece")), _fmt(m.get("ece20")),
               _fmt(m.get("nll")),
               str(m.get("n", 0)), f"{m.get('seconds_per_image', 0.0):.3f}"]
        if robust:
            row.append(_fmt(m.get("robust", {}).get("top1")))
        if published:
            row.append(_published_cell(published.get(name)))
        if published_ece:
            row.append(_fmt((published.get(name) or {}).get("paper_ece")))
        lines.append("| " + " | ".join(row) + " |")
    cfg = summary.get("config", {})
    title = f"{cfg.get('dataset', '?')} · {model_label(cfg.get('model'), cfg.get('pretrained'))}"
    if is_random_weights(cfg.get("pretrained")):
        title += " · RANDOM WEIGHTS: accuracies are meaningless"
    notes = [f"errors: {summary.get('errors', 0)}"]
    if "attack" in summary:
        a = summary["attack"]
        notes.append(f"attack {attack_label(a)} steps={a.get('steps')}, "
                     f"success rate on zero-shot {_fmt(a.get('success_rate'))}%")
    return f"### {title}\n\n" + "\n".join(lines) + "\n\n" + "; ".join(notes) + "\n"


def _published_cell(row: dict | None) -> str:
    if not row:
        return "—"
    vals = [str(v) for k, v in row.items() if k in ("seed_leaderboard", "paper") and v is not None]
    return " / ".join(vals) if vals else "—"


def write_summary(run_dir: Path, summary: dict, published: dict[str, dict] | None = None) -> str:
    run_dir = Path(run_dir)
    tmp = run_dir / (SUMMARY + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=False))
    os.replace(tmp, run_dir / SUMMARY)
    md = summary_markdown(summary, published)
    (run_dir / SUMMARY_MD).write_text(md)
    return md

"""Benchmark suites: every dataset of a paper table, one resumable run directory per dataset.

    shiftlab run --suite natural-shift --data ROOT --out runs/ns-rn50 --methods tpt,zeroshot
    shiftlab run --datasets imagenet-r,imagenet-a --data ROOT --out runs/two

A suite directory holds `suite.json` (what was asked for), one run directory per dataset
(`SUITE_DIR/<dataset>/`, each exactly what `shiftlab run --out SUITE_DIR/<dataset>` writes,
resumable on its own) and the suite table (`suite.md`, `suite.csv`): top-1 per method and
dataset (with its ECE and n beside it, and a "partial: --limit N" mark on a dataset whose run did
not cover it all), the average, and for natural shift the OOD average over the four shifted sets,
as in TPT's Table 1. Every number is recomputed from the datasets' records.jsonl.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import writes
from ..datasets.suites import SUITES, Suite, parse_corruption_entry
from ..results.suite_table import (
    SUITE_FILE,
    dataset_dir,
    read_manifest,
    suite_table,
    table_markdown,
    write_suite_table,
)

if TYPE_CHECKING:
    from ..models import ClipModel
    from .config import RunConfig
    from .run_plan import RunPlan


def write_manifest(suite_dir: Path, suite: Suite, config: dict, rewrote: Sequence[str] | None = None,
                   kept: Sequence[str] = ()) -> None:
    """suite.json: the suite, its config, and which datasets the last command ran (`rewrote`)
    and which rows it kept from earlier commands (`kept`)."""
    writes.make_dirs(suite_dir)   # a folder that could not be made holds nothing to resume
    writes.clean_orphans(suite_dir)   # one suite command at a time writes the suite's own files
    manifest = {"suite": suite.name, "datasets": list(suite.datasets), "ood": list(suite.ood),
                "title": suite.title, "kind": suite.kind, "base": suite.base, "config": config,
                "rewrote": list(suite.datasets if rewrote is None else rewrote), "kept": list(kept)}
    writes.write_file(suite_dir / SUITE_FILE, json.dumps(manifest, indent=2), writes.resume_advice())


# RunConfig fields that do not change a result: a dataset run with other values of these (and the
# method list, compared per method in the table) can share a table with this run. `config_file` is where the
# flags came from (path, digest, values): the settings it gave are compared as themselves
_NOT_RESULTS = frozenset({"methods", "resume", "progress", "device", "workers", "batch_size", "limit", "cache_dir",
                          "download", "data", "online_checkpoint_seconds", "online_checkpoint_samples",
                          "trust_checkpoint", "save_probs", "allow_partial", "config_file"})


@dataclass(frozen=True)
class SuiteMerge:
    """What a command that runs `ran` into an existing suite directory does with the other rows."""

    suite: Suite                     # the suite the table covers
    ran: tuple[str, ...]             # the datasets this command runs (their rows are rewritten)
    kept: tuple[str, ...]            # earlier datasets whose rows stay (records on disk, same config)
    # earlier datasets with records that are left out of the table (another configuration), and why
    dropped: tuple[str, ...] = ()
    reason: str = ""

    def message(self) -> str | None:
        if not self.kept and not self.dropped:
            return None
        words = [f"suite: this command runs {', '.join(self.ran)}"]
        if self.kept:
            words.append(f"the table keeps {', '.join(self.kept)} from earlier runs (not re-run)")
        if self.dropped:
            words.append(f"and leaves out {', '.join(self.dropped)} ({self.reason}; their folders stay on disk)")
        return "; ".join(words)


def merge_with_previous(suite_dir: str | Path, suite: Suite, config: dict) -> SuiteMerge:
    """A command given fewer (or other) datasets than the suite directory's suite.json: the table
    keeps the earlier datasets that have records and were run with the same configuration, in
    their order, then the new ones (nothing lost); earlier datasets run otherwise are left out
    of the table and named (nothing mixed)."""
    from ..rundir.record_files import record_files
    previous = read_manifest(suite_dir)
    earlier = [d for d in (previous or {}).get("datasets", []) if isinstance(d, str) and d not in suite.datasets]
    started = [d for d in earlier if record_files(dataset_dir(suite_dir, d))]
    if not started:
        return SuiteMerge(suite, suite.datasets, ())

    def results(c: dict) -> dict:
        return {k: v for k, v in json.loads(json.dumps(c)).items() if k not in _NOT_RESULTS}
    old, new = results(previous.get("config") or {}), results(config)
    differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if differ:
        return SuiteMerge(suite, suite.datasets, (), tuple(started), f"run with another {', '.join(differ)}")
    # the earlier suite's datasets (not started ones too: the table shows them as missing), then the new
    order = [d for d in previous["datasets"] if d in earlier or d in suite.datasets]
    order += [d for d in suite.datasets if d not in order]
    known = next((k for k in SUITES.values() if k.datasets and set(k.datasets) == set(order)), None)
    merged = known or Suite("custom", tuple(order), title="Datasets " + ", ".join(order))
    if suite.kind == "corruption":   # more corruptions or severities than this command's: the same suite
        merged = dataclasses.replace(suite, datasets=tuple(order))
    return SuiteMerge(merged, suite.datasets, tuple(d for d in merged.datasets if d in started))


def run_suite(config: RunConfig, suite: Suite, model: ClipModel | None = None, datasets: dict | None = None,
              plan: RunPlan | None = None) -> dict:
    """Run `config` (an engine RunConfig whose `out` is the suite directory) on every dataset of
    the suite, each into `out/<dataset>`; then write the suite table. Returns the table. Without `model` or
    some of the `datasets` (by name), every dataset and the model are prepared first (`engine.prepare`:
    every problem at once, the partial-dataset rule, `config.allow_partial`); `config` is not changed. `plan`: the
    suite's (`engine.run_plan.resolve_plan` over its datasets, as the CLI's checks resolve it), else resolved here;
    each dataset's run is handed its part."""
    from . import distributed
    from .config import check_run_config, expand_methods
    from .loop import run as run_engine
    from .prepare import prepare

    config = check_run_config(config)
    # "all" -> names, in order
    config = dataclasses.replace(config, methods=expand_methods(config.methods, config.model, config.method_config,
                                                                config.settings() != ["clean"], run=config,
                                                                datasets=suite.datasets))
    if model is None or set(datasets or {}) < set(suite.datasets):   # as `shiftlab run --suite` starts
        prepared = prepare(config, suite.datasets, model=model, given=datasets)
        model, datasets = prepared.model, prepared.datasets
    suite_dir = Path(config.out)
    plan = check_suite_settings(config, suite, datasets, plan)
    rank0 = distributed.context().rank == 0
    settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("dataset", "out", "classnames")}
    merge = merge_with_previous(suite_dir, suite, settings)
    if rank0:
        write_manifest(suite_dir, merge.suite, settings, rewrote=merge.ran, kept=merge.kept)
        if merge.message():
            print(merge.message(), file=sys.stderr)
    for name in suite.datasets:
        if config.progress and rank0:
            print(f"== {suite.name}: {name} -> {dataset_dir(suite_dir, name)}")
        per_dataset = dataclasses.replace(config, **entry_settings(suite, name), out=str(dataset_dir(suite_dir, name)),
                                          methods=list(config.methods))
        run_engine(per_dataset, model=model, dataset=(datasets or {}).get(per_dataset.dataset),
                   plan=plan.for_dataset(per_dataset))
    if not rank0:
        return {}
    table = suite_table(suite_dir)
    write_suite_table(suite_dir, table)
    if config.progress:
        print(table_markdown(table))
    return table


def entry_settings(suite: Suite, entry: str) -> dict:
    """The RunConfig fields a suite entry sets: its dataset (and no class-name file: those are per dataset), or,
    in a corruption suite, its corruption and severity (the dataset, its classes and the rest stay the command's)."""
    if suite.kind == "corruption":
        corruption, severity = parse_corruption_entry(entry)
        return {"corruption": corruption, "severity": severity}
    return {"dataset": entry, "classnames": None}


def check_suite_settings(config: RunConfig, suite: Suite, datasets: dict | None = None,
                         plan: RunPlan | None = None) -> RunPlan:
    """Build every dataset's method configs before the first dataset runs, so a setting that cannot work
    on a later dataset stops the suite now with its one-line error, not hours in: an unknown field, DMN-ZS's
    CuPL file missing from a `cupl_file` directory or lacking one of the dataset's classes (when
    `datasets` holds the built dataset). Returns the suite's plan (`plan` where it is this config's)."""
    from ..methods.head_kinds import check_descriptions
    from .run_plan import resolve_plan

    names = (suite.base,) if suite.kind == "corruption" else suite.datasets
    if suite.kind == "corruption":   # resolved as its first entry runs: the command names no one corruption
        config = dataclasses.replace(config, **entry_settings(suite, suite.datasets[0]))
    if plan is None or plan.config != config or not set(names) <= set(plan.datasets):
        plan = resolve_plan(config, names)   # every dataset's method configs (a PlanError: one line)
    for name in names:
        classnames = getattr((datasets or {}).get(name), "classnames", None)
        for method, method_config in plan.method_configs(name).items():
            check_descriptions(method, method_config, classnames)
    return plan

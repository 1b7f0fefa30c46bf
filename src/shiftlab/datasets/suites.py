"""The field's two tables as lists of datasets (suites), and `--datasets a,b,c` as a suite."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..options import name_of, say
from .corruptions import DEFAULT_SEVERITY, SEVERITIES
from .specs import DATASETS


@dataclass(frozen=True)
class Suite:
    name: str
    datasets: tuple[str, ...]        # its entries: dataset names; for kind "corruption" `<corruption>-<severity>`
    ood: tuple[str, ...] = ()        # datasets of the "OOD average" column (none: no such column)
    title: str = ""
    kind: str = "datasets"           # "datasets", or "corruption": one dataset (`base`) under each corruption
    base: str = ""                   # kind "corruption": the dataset corrupted (stored ImageNet-C/CIFAR-C or generated)


SUITES: dict[str, Suite] = {
    "natural-shift": Suite(
        "natural-shift", ("imagenet", "imagenet-a", "imagenet-v2", "imagenet-r", "imagenet-sketch"),
        ood=("imagenet-a", "imagenet-v2", "imagenet-r", "imagenet-sketch"),
        title="Natural distribution shift (ImageNet and its four shifted sets; TPT's Table 1)"),
    "cross-dataset": Suite(
        "cross-dataset", ("flowers102", "dtd", "oxford-pets", "stanford-cars", "ucf101", "caltech101",
                          "food101", "sun397", "fgvc-aircraft", "eurosat"),
        title="Cross-dataset generalization (ten fine-grained sets, CoOp's test splits; TPT's Table 2)"),
    # entries are filled from --dataset, --corruptions and --severity by `corruption_suite`
    "corruption": Suite("corruption", (), kind="corruption",
                        title="Common corruptions (Hendrycks & Dietterich's 15, severity 5 unless asked)"),
}


def corruption_entry(corruption: str, severity: int) -> str:
    """A corruption suite's entry (its run directory and column): 'gaussian_noise-5'."""
    return f"{corruption}-{int(severity)}"


def parse_corruption_entry(entry: str) -> tuple[str, int]:
    corruption, _, severity = entry.rpartition("-")
    return corruption, int(severity)


def parse_severities(text: str | int | None) -> tuple[int, ...]:
    """`--severity 1..5` or 'all' (the corruption suite) as severities; ValueError otherwise."""
    if text is None:
        return (DEFAULT_SEVERITY,)
    if str(text).strip().lower() == "all":
        return SEVERITIES
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{name_of('severity')} must be 1..5 or all, got {text!r}") from None
    if value not in SEVERITIES:
        raise ValueError(f"{name_of('severity')} must be 1..5 or all, got {text!r}")
    return (value,)


def corruption_suite(dataset: str, corruptions: Sequence[str], severities: Sequence[int]) -> Suite:
    """Every method over `dataset` under each corruption at each severity: one run directory per entry."""
    entries = tuple(corruption_entry(c, s) for c in corruptions for s in severities)
    sev = f"severity {severities[0]}" if len(severities) == 1 else "severities " + ",".join(map(str, severities))
    name = DATASETS.canonical(dataset) if dataset in DATASETS else dataset
    return Suite("corruption", entries, kind="corruption", base=name,
                 title=f"Common corruptions of {name} ({len(corruptions)} corruptions, {sev}; Hendrycks & Dietterich)")


class SuiteError(ValueError):
    """A suite request the user must fix (unknown suite, empty dataset list, not a suite directory)."""


def resolve_suite(suite: str | None, datasets: str | Sequence[str] | None) -> Suite:
    """The suite for `--suite NAME` or `--datasets a,b,c` (exactly one of them)."""
    if suite and datasets:
        raise SuiteError(f"give either {name_of('suite')} or {name_of('datasets')}, not both")
    if suite:
        if suite not in SUITES:
            raise SuiteError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
        return SUITES[suite]
    names = [d.strip() for d in (datasets.split(",") if isinstance(datasets, str) else datasets or ()) if d.strip()]
    names = [DATASETS.canonical(n) if n in DATASETS else n for n in names]  # R, imagenet_r, flowers -> canonical
    if not names:
        raise SuiteError(f"{name_of('datasets')} needs at least one dataset name, e.g. "
                         f"{say('datasets', 'imagenet-r,imagenet-a')}")
    if len(set(names)) != len(names):
        raise SuiteError(f"{name_of('datasets')} lists a dataset twice: {','.join(names)}")
    known = next((s for s in SUITES.values() if s.datasets == tuple(names)), None)
    return known or Suite("custom", tuple(names), title="Datasets " + ", ".join(names))

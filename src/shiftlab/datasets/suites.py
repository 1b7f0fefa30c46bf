"""The field's two tables as lists of datasets (suites), and `--datasets a,b,c` as a suite."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .specs import DATASETS


@dataclass(frozen=True)
class Suite:
    name: str
    datasets: tuple[str, ...]
    ood: tuple[str, ...] = ()        # datasets of the "OOD average" column (none: no such column)
    title: str = ""


SUITES: dict[str, Suite] = {
    "natural-shift": Suite(
        "natural-shift", ("imagenet", "imagenet-a", "imagenet-v2", "imagenet-r", "imagenet-sketch"),
        ood=("imagenet-a", "imagenet-v2", "imagenet-r", "imagenet-sketch"),
        title="Natural distribution shift (ImageNet and its four shifted sets; TPT's Table 1)"),
    "cross-dataset": Suite(
        "cross-dataset", ("flowers102", "dtd", "oxford-pets", "stanford-cars", "ucf101", "caltech101",
                          "food101", "sun397", "fgvc-aircraft", "eurosat"),
        title="Cross-dataset generalization (ten fine-grained sets, CoOp's test splits; TPT's Table 2)"),
}


class SuiteError(ValueError):
    """A suite request the user must fix (unknown suite, empty dataset list, not a suite directory)."""


def resolve_suite(suite: str | None, datasets: str | Sequence[str] | None) -> Suite:
    """The suite for `--suite NAME` or `--datasets a,b,c` (exactly one of them)."""
    if suite and datasets:
        raise SuiteError("give either --suite or --datasets, not both")
    if suite:
        if suite not in SUITES:
            raise SuiteError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
        return SUITES[suite]
    names = [d.strip() for d in (datasets.split(",") if isinstance(datasets, str) else datasets or ()) if d.strip()]
    names = [DATASETS.canonical(n) if n in DATASETS else n for n in names]  # R, imagenet_r, flowers -> canonical
    if not names:
        raise SuiteError("--datasets needs at least one dataset name, e.g. --datasets imagenet-r,imagenet-a")
    if len(set(names)) != len(names):
        raise SuiteError(f"--datasets lists a dataset twice: {','.join(names)}")
    known = next((s for s in SUITES.values() if s.datasets == tuple(names)), None)
    return known or Suite("custom", tuple(names), title="Datasets " + ", ".join(names))

"""#31 item 2: a method's own OOD score, where its paper defines one, recorded beside MCM's and scored in a column
of its own (AUROC, FPR95, AUPR), the other methods of the run falling back to MCM in that column.

No method registered today defines one in its authors' code (docs/PROTOCOLS.md says which were read); the hook is
tested with a test-only method whose own score is the energy score (logsumexp of its logits)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from _registered import registered
from _synthetic import make_imagenet_r, random_image
from shiftlab.methods.base import Method, MethodOutput
from shiftlab.results.ood import ood_metrics
from shiftlab.rundir import record_files
from shiftlab.rundir.records import check_record

PROBE = "own_score_probe"
ENERGY = "energy score (test-only: logsumexp of the logits)"


class OwnScoreProbe(Method):
    """Zero-shot logits; its own OOD score is their logsumexp, or `bad` (a non-finite score) for sample `bad_id`."""
    needs_views = False
    own_ood_score = ENERGY
    bad_id: int | None = None

    def predict_context(self, ctx):
        logits = ctx.zeroshot_logits.detach().float().cpu()
        score = math.nan if ctx.sample_id == self.bad_id else float(logits.logsumexp(-1))
        return MethodOutput(logits, ood_score=score)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("own-score")
    make_imagenet_r(root, classes=range(0, 200, 40), size=(48, 40))      # 5 ID images
    folder = root / "NINCO" / "NINCO_OOD_classes" / "some_class"
    folder.mkdir(parents=True)
    for k in range(5):
        random_image((40, 32), 700 + k).save(folder / f"x{k}.png")
    return root


@pytest.fixture
def probe():
    """The test-only method, registered for one test: the registry-wide tests (the methods table, "all") never
    see it."""
    with registered(PROBE, OwnScoreProbe):
        yield PROBE


def _run(data: Path, out: Path, methods: list[str]) -> Path:
    from shiftlab.engine.config import RunConfig
    from shiftlab.engine.loop import run
    from shiftlab.synthetic import tiny_clip
    run(RunConfig(dataset="imagenet-r", data=str(data), model="shiftlab-tiny", pretrained=None, methods=methods,
                  views=1, out=str(out), workers=0, batch_size=4, progress=False, ood=["ninco"], ood_ratio=1.0,
                  allow_partial=True), model=tiny_clip(0))
    return out


@pytest.mark.slow
def test_an_own_score_is_recorded_beside_mcm_and_scored_in_its_own_column(data, tmp_path, probe):
    from shiftlab.report.build import build_report
    out = _run(data, tmp_path / "run", ["zeroshot", PROBE])
    recs = list(record_files.iter_records(out / "records.jsonl"))
    probe = [r for r in recs if r["method"] == PROBE]
    zeroshot = [r for r in recs if r["method"] == "zeroshot"]
    assert len(probe) == 10 and all(r["ood_score"] == r["confidence"] for r in probe)      # MCM stays
    assert all(isinstance(r["own_ood_score"], float) and r["own_ood_score"] > 1.0 for r in probe)
    assert all("own_ood_score" not in r for r in zeroshot)
    methods = json.loads((out / "summary.json").read_text())["methods"]
    xin = [r["own_ood_score"] for r in probe if not r["ood"]]
    xood = [r["own_ood_score"] for r in probe if r["ood"]]
    want = ood_metrics(xin, xood)
    assert methods[PROBE]["ood_own"] == {"score": ENERGY, **want}
    # the method without a score of its own: MCM's figures in the column, said so
    assert methods["zeroshot"]["ood_own"] == {"score": "MCM", **methods["zeroshot"]["ood"]}
    md = (out / "summary.md").read_text()
    assert "| own OOD score | AUROC (own) | FPR95 (own) | AUPR (own) |" in md
    assert f"| {ENERGY} | {want['auroc']:.2f} |" in md
    page = build_report([out], tmp_path / "report", n_resamples=10).read_text()
    assert "AUROC (own) %" in page and ENERGY in page and "else by MCM" in page
    # with scikit-learn where it is installed: the same AUROC on the same own scores
    skm = pytest.importorskip("sklearn.metrics")
    labels = np.r_[np.ones(len(xin)), np.zeros(len(xood))]
    assert want["auroc"] == pytest.approx(100 * skm.roc_auc_score(labels, np.r_[xin, xood]))


def test_a_run_without_own_scores_has_no_such_column(data, tmp_path):
    out = _run(data, tmp_path / "run", ["zeroshot"])
    assert "ood_own" not in json.loads((out / "summary.json").read_text())["methods"]["zeroshot"]
    assert "own OOD score" not in (out / "summary.md").read_text()


def test_a_non_finite_own_score_is_an_error_record_and_the_field_is_checked(data, tmp_path, probe):
    OwnScoreProbe.bad_id = 7
    try:
        out = _run(data, tmp_path / "run", [PROBE])
    finally:
        OwnScoreProbe.bad_id = None
    bad = [r for r in record_files.iter_records(out / "records.jsonl") if r["id"] == 7]
    assert bad[0]["error"] == f"non-finite scores from {PROBE}: its own OOD score is nan"
    base = {"id": 3, "path": "a.png", "setting": "clean", "method": PROBE, "pred": 4, "top5": [4, 1],
            "confidence": 0.4, "seconds": 0.1, "label": 4, "true_prob": 0.4, "correct": True}
    assert check_record({**base, "ood": False, "ood_score": 0.4, "own_ood_score": -12.5}).own_ood_score == -12.5
    with pytest.raises(ValueError, match="own_ood_score must be a finite number on an open-set prediction"):
        check_record({**base, "own_ood_score": 3.0})                    # a closed-set record has none
    with pytest.raises(ValueError, match="own_ood_score must be a finite number"):
        check_record({**base, "ood": False, "ood_score": 0.4, "own_ood_score": "high"})

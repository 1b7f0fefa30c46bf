"""The transductive track (docs/PROTOCOLS.md): a method that reads more than the current sample and its past
declares it once (`Capabilities.reads_ahead`), runs record it, a method that reads the whole test set is shown
it before the stream (and a resumed run is exact), and every table shows such methods in a labelled block of
their own, never among the single-image methods."""
from __future__ import annotations

import json
import re

import pytest
import torch

from _registered import registered
from _runs import Crash, comparable, crash_before_step, json_lines
from _synthetic import make_image_folder
from shiftlab.datasets import suites
from shiftlab.datasets.build import build_dataset
from shiftlab.engine import suite as suite_runs
from shiftlab.engine.config import RunConfig
from shiftlab.engine.loop import run
from shiftlab.methods.base import MethodOutput
from shiftlab.methods.catalogue import listing as catalogue
from shiftlab.methods.catalogue.declarations import Capabilities, MethodSpec
from shiftlab.methods.kinds import TestSetMethod
from shiftlab.report.build import build_report
from shiftlab.results import suite_table

pytestmark = pytest.mark.usefixtures("one_thread")
TEST_SET_METHOD = "test_set_centre"
SCALE = 50.0   # the centred logits are small on the random tiny CLIP, whose images look alike


class TestSetCentre(TestSetMethod):
    __test__ = False   # a method, not a test class
    """Test-only test-set method, online: SCALE x (zero-shot logits minus their mean over the whole test set);
    `extras.seen` counts the stream samples it predicted before this one (its online state)."""
    needs_views = False
    episodic = False
    reads_ahead = "test_set"
    summary = "test: zero-shot logits centred on the whole test set's mean"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.observed: list[torch.Tensor] = []
        self.mean: torch.Tensor | None = None
        self.seen = 0
        self.observed_ids: list[int] = []

    def observe_test_set(self, ctxs):
        self.observed += [c.zeroshot_logits.float() for c in ctxs]
        self.observed_ids += [c.sample_id for c in ctxs]

    def end_test_set(self):
        self.mean = torch.stack(self.observed).mean(0)

    def predict_context(self, ctx):
        out = MethodOutput(SCALE * (ctx.zeroshot_logits.float() - self.mean), extras={"seen": self.seen})
        self.seen += 1
        return out

    def state_dict(self):
        return {"seen": self.seen, "mean": self.mean.clone()}

    def load_state_dict(self, state):
        self.seen, self.mean = int(state["seen"]), state["mean"].clone()


@pytest.fixture
def test_set_method():
    with registered(TEST_SET_METHOD, TestSetCentre):   # other test modules are parametrised over the registry
        yield TEST_SET_METHOD


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = make_image_folder(tmp_path_factory.mktemp("transductive") / "data", ["cat", "dog", "fox", "owl"],
                             per_class=2, size=(48, 40))
    return build_dataset("imagefolder", root)


def _config(out, **kw):
    base = dict(dataset="imagefolder", methods=["zeroshot", TEST_SET_METHOD], workers=0, progress=False,
                batch_size=3, seed=1, out=str(out), device="cpu", online_checkpoint_seconds=0)
    return RunConfig(**{**base, **kw})


# ------------------------------------------------------------------ the declaration


def test_one_declaration_refused_when_inconsistent():
    assert Capabilities().reads_ahead is None and not Capabilities().transductive
    assert Capabilities(batches=True).reads_ahead == "batch"   # a batch method reads its batch
    assert Capabilities(reads_ahead="test_set").reads_test_set
    assert Capabilities(batches=True, reads_ahead="test_set").reads_ahead == "test_set"
    with pytest.raises(ValueError, match="reads_ahead 'batch' without batches=True"):
        Capabilities(reads_ahead="batch")
    with pytest.raises(ValueError, match="reads_ahead must be None or one of batch, test_set, got 'future'"):
        Capabilities(reads_ahead="future")
    with pytest.raises(TypeError, match="instead of `transductive`"):
        type("Old", (MethodSpec,), {"name": "old", "transductive": True})
    # a test-set method must take the pass
    spec = type("TSpec", (MethodSpec,), {"name": "t", "impl": f"{__name__}:NoPass",
                                         "capabilities": Capabilities(reads_ahead="test_set")})
    with pytest.raises(TypeError, match="must define observe_test_set"):
        type("NoPass", (TestSetMethod,), {"spec": spec, "__module__": __name__, "__qualname__": "NoPass"})


def test_the_catalogue_blocks_read_the_capabilities(test_set_method):
    assert catalogue.block("zeroshot") == catalogue.SINGLE_IMAGE
    assert catalogue.block("stata") == catalogue.block("oga_batch") == catalogue.BATCH_TRANSDUCTIVE
    assert catalogue.block("tda@pos_alpha=2") == catalogue.SINGLE_IMAGE
    assert catalogue.block(test_set_method) == catalogue.TRANSDUCTIVE   # registered at run time
    assert catalogue.published_note("stata") == "batch-transductive" and catalogue.published_note("tpt") == ""
    assert catalogue.by_block(["stata", "zeroshot", test_set_method, "tpt"]) == [
        ("single-image", ["zeroshot", "tpt"]), ("batch-transductive", ["stata"]), ("transductive", [test_set_method])]
    entry = next(e for e in catalogue.entries() if e["name"] == "stata")
    assert (entry["reads_ahead"], entry["block"]) == ("batch", "batch-transductive")


# ------------------------------------------------------------------ the test-set pass


def _zeroshot_logits(model, data, seed=1) -> dict[int, torch.Tensor]:
    """Each sample's zero-shot logits of view 0, straight from the model (no engine)."""
    from shiftlab.methods.context import ClassHeads, SampleContext
    from shiftlab.views.generator import ViewConfig, ViewGenerator
    heads = ClassHeads(model, data.classnames)
    gen = ViewGenerator(ViewConfig(n_views=1), seed=seed, preprocess=model.preprocess)
    out = {}
    for sid in range(len(data)):
        views = model.normalize(gen(data.image(sid), sid).float().div(255))
        out[sid] = SampleContext(model, heads, views).zeroshot_logits.float()
    return out


def test_a_test_set_method_sees_the_whole_set_first_checked_against_a_straightforward_computation(
        test_set_method, data, tiny_model, tmp_path):
    run(_config(tmp_path / "run"), model=tiny_model, dataset=data)
    logits = _zeroshot_logits(tiny_model, data)
    mean = torch.stack(list(logits.values())).mean(0)
    recs = {r["id"]: r for r in json_lines(tmp_path / "run" / "records.jsonl") if r["method"] == test_set_method}
    assert sorted(recs) == list(range(len(data)))
    for sid, rec in recs.items():
        probs = (SCALE * (logits[sid] - mean)).softmax(-1)
        assert rec["pred"] == int(probs.argmax()) and rec["confidence"] == pytest.approx(float(probs.max()), abs=1e-4)
    stream = json.loads((tmp_path / "run" / "stream.json").read_text())["ids"]
    assert [recs[s]["extras"]["seen"] for s in stream] == list(range(len(data)))   # online along the stream
    # recorded: run.json's config and summary.json's entry; summary.md says it
    config = json.loads((tmp_path / "run" / "run.json").read_text())["config"]
    assert config["reads_ahead"] == {test_set_method: "test_set"}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["methods"][test_set_method]["reads_ahead"] == "test_set"
    assert "reads_ahead" not in summary["methods"]["zeroshot"]
    md = (tmp_path / "run" / "summary.md").read_text()
    assert f"transductive (not comparable with single-image methods): {test_set_method} reads the whole test set" in md


def test_the_test_set_pass_does_not_depend_on_the_stream_order(test_set_method, data, tiny_model, tmp_path):
    run(_config(tmp_path / "a", order="sorted"), model=tiny_model, dataset=data)
    run(_config(tmp_path / "b", order="shuffled", seed=1), model=tiny_model, dataset=data)
    strip = [{k: v for k, v in r.items() if k not in ("seconds", "extras")}
             for r in json_lines(tmp_path / "a" / "records.jsonl") if r["method"] == test_set_method]
    other = [{k: v for k, v in r.items() if k not in ("seconds", "extras")}
             for r in json_lines(tmp_path / "b" / "records.jsonl") if r["method"] == test_set_method]
    assert sorted(map(json.dumps, strip)) == sorted(map(json.dumps, other))


def test_the_library_refuses_a_test_set_method_before_its_pass(test_set_method, data, tiny_model):
    from shiftlab.methods.base import create_method
    from shiftlab.methods.context import ClassHeads, SampleContext
    from shiftlab.views.generator import ViewConfig, ViewGenerator
    method = create_method(test_set_method, tiny_model, data.classnames)
    gen = ViewGenerator(ViewConfig(n_views=1), seed=1, preprocess=tiny_model.preprocess)
    views = [tiny_model.normalize(gen(data.image(s), s).float().div(255)) for s in range(len(data))]
    with pytest.raises(ValueError, match=f"^{test_set_method} reads the whole test set before predicting"):
        method.predict(views[0])
    heads = ClassHeads(tiny_model, data.classnames)
    method.observe_test_set([SampleContext(tiny_model, heads, v) for v in views])
    method.finish_test_set()
    logits = _zeroshot_logits(tiny_model, data)
    mean = torch.stack(list(logits.values())).mean(0)
    assert torch.allclose(method.predict(views[3]), SCALE * (logits[3] - mean), atol=1e-3)


def test_a_killed_test_set_run_resumes_with_identical_records(test_set_method, data, tiny_model, tmp_path):
    run(_config(tmp_path / "ref"), model=tiny_model, dataset=data)
    reference = json_lines(tmp_path / "ref" / "records.jsonl")

    with pytest.raises(Crash):
        run(_config(tmp_path / "cut"), model=tiny_model, dataset=data, hooks=crash_before_step(1))
    assert 0 < len(json_lines(tmp_path / "cut" / "records.jsonl")) < len(reference)
    run(_config(tmp_path / "cut", resume=True), model=tiny_model, dataset=data)
    assert comparable(json_lines(tmp_path / "cut" / "records.jsonl")) == comparable(reference)


def test_a_finished_test_set_run_resumes_to_nothing(test_set_method, data, tiny_model, tmp_path):
    """A --resume of a finished run has no record to compute: the test-set pass (a whole pass over the set)
    is not repeated, and the records are unchanged."""
    run(_config(tmp_path / "run"), model=tiny_model, dataset=data)
    before = (tmp_path / "run" / "records.jsonl").read_text()
    shown = []
    original = TestSetCentre.observe_test_set

    def counting(self, ctxs):
        shown.extend(c.sample_id for c in ctxs)
        return original(self, ctxs)
    TestSetCentre.observe_test_set = counting
    try:
        run(_config(tmp_path / "run", resume=True), model=tiny_model, dataset=data)
    finally:
        TestSetCentre.observe_test_set = original
    assert shown == []
    assert (tmp_path / "run" / "records.jsonl").read_text() == before


# ------------------------------------------------------------------ the blocks of every table


def _single_image_rows(markdown: str) -> str:
    """suite.md up to the first transductive block's label: the single-image table."""
    return re.split(r"\*\*(Batch-transductive|Transductive) methods", markdown)[0]


def test_a_suite_shows_transductive_methods_in_their_own_labelled_blocks(test_set_method, data, tiny_model,
                                                                          tmp_path):
    suite_dir = tmp_path / "suite"
    suite = suites.resolve_suite(None, "imagenet-r")
    methods = ["zeroshot", test_set_method, "stata"]
    suite_runs.write_manifest(suite_dir, suite, {"methods": methods, "model": "shiftlab-tiny"})
    run(_config(suite_dir / "imagenet-r", methods=methods), model=tiny_model, dataset=data)
    table = suite_table.suite_table(suite_dir)
    suite_table.write_suite_table(suite_dir, table)
    md = (suite_dir / "suite.md").read_text()
    single = _single_image_rows(md)
    assert "| zeroshot |" in single
    assert test_set_method not in single and "| stata |" not in single   # never in the single-image block
    batch_at, whole_at = md.index(f"**{catalogue.BLOCKS['batch-transductive']}**"), md.index(
        f"**{catalogue.BLOCKS['transductive']}**")
    assert batch_at < md.index("| stata |") < whole_at < md.index(f"| {test_set_method} |")
    rows = {(r["method"], r["dataset"]): r["block"] for r in
            __import__("csv").DictReader((suite_dir / "suite.csv").open())}
    assert rows[("stata", "imagenet-r")] == "batch-transductive" and rows[("zeroshot", "average")] == "single-image"
    # the report: the suite table's single-image rows hold neither; each block is its own labelled table
    html = build_report([suite_dir], tmp_path / "out", n_resamples=10).read_text()
    section = re.search(r'<section id="suite">.*?</section>', html, re.S).group(0)
    main = re.search(r'<table[^>]*id="suite-table-0".*?</table>', section, re.S).group(0)
    assert ">zeroshot<" in main and test_set_method not in main and ">stata<" not in main
    for block, method in (("batch-transductive", "stata"), ("transductive", test_set_method)):
        own = re.search(rf'<h4>{re.escape(catalogue.BLOCKS[block])}</h4>\s*<table[^>]*id="suite-table-0-{block}"'
                        r'.*?</table>', section, re.S)
        assert own is not None and f">{method}<" in own.group(0) and ">zeroshot<" not in own.group(0)
    results = re.search(r'<section id="results">.*?</section>', html, re.S).group(0)
    metrics = re.search(r'<table[^>]*id="metrics-table".*?</table>', results, re.S).group(0)
    assert ">zeroshot<" in metrics and test_set_method not in metrics and ">stata<" not in metrics
    assert re.search(r'id="metrics-table-transductive".*?' + test_set_method, results, re.S)

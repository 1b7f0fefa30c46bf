"""The episodic-batch protocol (`--batch-size B`, `Method.adapts_on_batches`): a batch method sees whole
batches of the stream, its records are checked against a straightforward computation, a resume inside a
batch is exact, B is in run.json, and every single-image method gives the same records at any B."""
from __future__ import annotations

import json

import pytest
import torch

import shiftlab
from _records import small_config
from _registered import registered
from _runs import comparable, json_lines
from _synthetic import make_image_folder
from shiftlab.datasets.build import build_dataset
from shiftlab.engine.config import RunConfig, run_stream
from shiftlab.engine.loop import run
from shiftlab.methods import base as method_base
from shiftlab.methods.base import Method, MethodOutput, list_methods
from shiftlab.rundir.identity import RunIdentityError

pytestmark = pytest.mark.usefixtures("one_thread")
BATCH = "batch_centre"
SCALE = 50.0   # the centred logits are small on the random tiny CLIP, whose images look alike


class BatchCentre(Method):
    """Test-only batch method, output-only: SCALE x (zero-shot logits minus the batch's mean zero-shot logits);
    alone in its batch an image gets uniform probabilities."""
    needs_views = False
    adapts_on_batches = True
    summary = "test: batch mean-centring of zero-shot logits"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.resets = 0

    def reset(self):
        self.resets += 1

    def adapt_batch(self, ctxs):
        logits = torch.stack([c.zeroshot_logits.float() for c in ctxs])
        centred = SCALE * (logits - logits.mean(0, keepdim=True))
        return [MethodOutput(row, extras={"batch": len(ctxs)}) for row in centred]


@pytest.fixture
def batch_method():
    with registered(BATCH, BatchCentre):   # other test modules are parametrised over the registry
        yield BATCH


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = make_image_folder(tmp_path_factory.mktemp("batch") / "data", ["cat", "dog", "fox", "owl"], per_class=2,
                             size=(48, 40))
    return build_dataset("imagefolder", root)


def _config(out, **kw):
    base = dict(dataset="imagefolder", methods=["zeroshot", BATCH], workers=0, progress=False, batch_size=3, seed=1,
                out=str(out), device="cpu", online_checkpoint_seconds=0)
    return RunConfig(**{**base, **kw})


def _by_key(out):
    return {(r["id"], r["method"]): r for r in json_lines(out / "records.jsonl")}


def test_batch_method_sees_whole_batches_checked_against_a_straightforward_computation(
        batch_method, data, tiny_model, tmp_path):
    config = _config(tmp_path / "b3")
    run(config, model=tiny_model, dataset=data)
    recs = _by_key(tmp_path / "b3")
    stream = run_stream(config, data)
    zeroshot = shiftlab.create_method("zeroshot", tiny_model, data.classnames, allow_duplicate_names=True)
    logits = {sid: zeroshot.predict_image(data.image(sid), seed=1, sample_id=sid).logits.float() for sid in stream}
    for start in range(0, len(stream), 3):
        batch = stream[start:start + 3]
        mean = torch.stack([logits[s] for s in batch]).mean(0)
        for sid in batch:
            probs = (SCALE * (logits[sid] - mean)).softmax(-1)
            rec = recs[(sid, BATCH)]
            assert rec["pred"] == int(probs.argmax()) and rec["extras"]["batch"] == len(batch)
            assert rec["confidence"] == pytest.approx(float(probs.max()), rel=1e-3)
            assert rec["true_prob"] == pytest.approx(float(probs[rec["label"]]), rel=1e-3)
    assert [recs[(sid, BATCH)]["extras"]["batch"] for sid in stream] == [3, 3, 3, 3, 3, 3, 2, 2]
    # the batch decides the records: one image at a time gives other confidences
    run(_config(tmp_path / "b1", batch_size=1), model=tiny_model, dataset=data)
    single = _by_key(tmp_path / "b1")
    assert all(single[(s, BATCH)]["confidence"] == pytest.approx(1 / len(data.classnames)) for s in stream)
    assert max(recs[(s, BATCH)]["confidence"] for s in stream) > 1.05 / len(data.classnames)
    for s in stream:   # a single-image method beside it is unchanged (up to the encoder's batch-shape rounding)
        assert single[(s, "zeroshot")]["pred"] == recs[(s, "zeroshot")]["pred"]
        assert single[(s, "zeroshot")]["confidence"] == pytest.approx(recs[(s, "zeroshot")]["confidence"], abs=1e-5)


def test_batch_size_is_recorded_and_a_resume_with_another_is_refused(batch_method, data, tiny_model, tmp_path):
    run(_config(tmp_path / "r", limit=4), model=tiny_model, dataset=data)
    shared = json.loads((tmp_path / "r" / "run.json").read_text())["shared"]
    assert shared["batch_size"] == 3 and shared["order"] == "shuffled" and shared["orders"] == 1
    with pytest.raises(RunIdentityError, match=r"batch_size 3 -> 4"):
        run(_config(tmp_path / "r", limit=4, batch_size=4, resume=True), model=tiny_model, dataset=data)
    # without a batch method B is null in the identity (no prediction depends on it), but the records move in the
    # last float bits with it (a step encodes its batch together; issue 40 case 18), so another B is refused too
    run(_config(tmp_path / "z", methods=["zeroshot"], limit=4), model=tiny_model, dataset=data)
    assert json.loads((tmp_path / "z" / "run.json").read_text())["shared"]["batch_size"] is None
    with pytest.raises(RunIdentityError, match=r"with batch_size 2: its records were made with 3"):
        run(_config(tmp_path / "z", methods=["zeroshot"], batch_size=2, resume=True), model=tiny_model, dataset=data)
    run(_config(tmp_path / "z", methods=["zeroshot"], resume=True), model=tiny_model, dataset=data)
    assert len(json_lines(tmp_path / "z" / "records.jsonl")) == len(data)


def test_resume_inside_a_batch_evaluates_the_whole_batch_again(batch_method, data, tiny_model, tmp_path):
    run(_config(tmp_path / "ref"), model=tiny_model, dataset=data)
    reference = json_lines(tmp_path / "ref" / "records.jsonl")
    run(_config(tmp_path / "cut"), model=tiny_model, dataset=data)
    stream = run_stream(_config(tmp_path / "cut"), data)
    lost = stream[4]   # the middle of the second batch: its batch-mates' records stay on disk
    path = tmp_path / "cut" / "records.jsonl"
    kept = [r for r in json_lines(path) if not (r["id"] == lost and r["method"] == BATCH)]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    run(_config(tmp_path / "cut", resume=True), model=tiny_model, dataset=data)
    assert comparable(json_lines(path)) == comparable(reference)


def test_episodic_batch_method_is_reset_before_every_batch(batch_method, data, tiny_model, tmp_path):
    from shiftlab.engine.step import Evaluator
    evaluator = Evaluator(tiny_model, data.classnames, [BATCH])
    method = evaluator.methods[BATCH]
    before = method.resets
    size = tiny_model.image_size
    ctxs = evaluator.contexts([torch.zeros(1, 3, size, size, dtype=torch.uint8)] * 2, [0, 1], all_views=False)
    assert len(evaluator.predict(BATCH, ctxs)) == 2 and method.resets == before + 1


@pytest.mark.slow
def test_every_single_image_method_gives_the_same_records_inside_batches(data, tiny_model, tmp_path):
    # the registered batch methods see whole batches by design; every other method is checked
    methods = [n for n in list_methods() if not method_base.get_method_class(n).spec.adapts_on_batches]
    # the batch methods are those whose spec declares batches (a new one joins by declaring it: no list to edit here)
    from shiftlab.methods.catalogue.declarations import spec
    batch = set(list_methods()) - set(methods)
    assert batch == {n for n in list_methods() if spec(n).capabilities.batches}
    assert {"stata", "oga_batch", "tent", "lame", "clipartt"} <= batch   # the kinds of batch method so far
    # the methods bound to ViTs (their spec's `towers`: TCA) run on the tiny ViT, the others on the tiny ResNet
    vit_only = [n for n in methods if "resnet" not in method_base.get_method_class(n).spec.towers]
    groups = [([n for n in methods if n not in vit_only], tiny_model, "shiftlab-tiny"),
              (vit_only, shiftlab.load_model("shiftlab-tiny-vit", None, seed=0), "shiftlab-tiny-vit")]
    for names, model, model_name in groups:
        offline = {n: small_config(n) for n in names}   # the specs' small test configs
        outs = []
        for bs in (1, 3):
            out = tmp_path / f"{model_name}-b{bs}"
            run(_config(out, methods=names, method_config=offline, batch_size=bs, views=8, limit=5,
                        model=model_name), model=model, dataset=data)
            outs.append(_by_key(out))
        assert outs[0].keys() == outs[1].keys() and len(outs[0]) == 5 * len(names)
        for key, a in outs[0].items():
            b = outs[1][key]
            assert a["pred"] == b["pred"] and a["top5"] == b["top5"], key
            assert a["confidence"] == pytest.approx(b["confidence"], abs=1e-4), key


CONTINUAL = "batch_memory"


class BatchMemory(Method):
    """Test-only continual batch method: each batch is predicted with the mean zero-shot logits of every
    earlier batch added (its state, kept across batches and checkpointed), then joins that memory."""
    needs_views = False
    adapts_on_batches = True
    episodic = False
    summary = "test: continual batch memory"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.total, self.seen = None, 0

    def adapt_batch(self, ctxs):
        logits = torch.stack([c.zeroshot_logits.float() for c in ctxs])
        memory = self.total / self.seen if self.seen else torch.zeros_like(logits[0])
        outs = [MethodOutput(SCALE * (row - memory), extras={"seen": self.seen}) for row in logits]
        self.total = logits.sum(0) if self.total is None else self.total + logits.sum(0)
        self.seen += len(ctxs)
        return outs

    def state_dict(self):
        return {"total": self.total, "seen": self.seen}

    def load_state_dict(self, state):
        self.total, self.seen = state["total"], state["seen"]


class _Crash(Exception):
    pass


def test_continual_batch_method_keeps_its_state_and_resumes_exactly(data, tiny_model, tmp_path):
    from shiftlab.engine.loop import RunHooks
    with registered(CONTINUAL, BatchMemory):
        config = dict(methods=["zeroshot", CONTINUAL], batch_size=3)
        run(_config(tmp_path / "ref", **config), model=tiny_model, dataset=data)
        reference = json_lines(tmp_path / "ref" / "records.jsonl")
        stream = run_stream(_config(tmp_path / "ref"), data)
        seen = {r["id"]: r["extras"]["seen"] for r in reference if r["method"] == CONTINUAL}
        assert [seen[s] for s in stream] == [0, 0, 0, 3, 3, 3, 6, 6]   # the state kept from batch to batch

        class CrashAfterTwo(RunHooks):
            steps = 0

            def before_step(self, ids):
                if self.steps == 2:
                    raise _Crash
                self.steps += 1
        with pytest.raises(_Crash):
            run(_config(tmp_path / "cut", **config), model=tiny_model, dataset=data, hooks=CrashAfterTwo())
        assert 0 < len(json_lines(tmp_path / "cut" / "records.jsonl")) < len(reference)
        run(_config(tmp_path / "cut", resume=True, **config), model=tiny_model, dataset=data)
        assert comparable(json_lines(tmp_path / "cut" / "records.jsonl")) == comparable(reference)

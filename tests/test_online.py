"""Online methods (TDA, DMN-ZS) and the stream protocol: cache rules on hand-made streams,
reset, state round trips, the engine's stream order, and resume after a crash or a SIGKILL."""
from __future__ import annotations

import dataclasses
import io
import json
import math
import signal
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _gate import GatedRun
from conftest import model_for_method
from shiftlab.cli import main as cli_main
from shiftlab.datasets import build_dataset
from shiftlab.datasets.imageio import decode_image
from shiftlab.engine.config import RunConfig
from shiftlab.engine.loop import RunHooks, run
from shiftlab.methods.catalogue.declarations import spec
from shiftlab.methods.common.dmn_memory import DynamicMemory, memory_logits
from shiftlab.methods.common.tda_cache import CacheEntry, TDASample, cache_logits, update_cache
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.rundir import record_files
from shiftlab.rundir.records import budget_setting
from shiftlab.rundir.stream import stream_order
from shiftlab.synthetic import make_imagenet_r, random_image, tiny_clip
from shiftlab.views.generator import ViewConfig, ViewGenerator

CLASSNAMES = ["cat", "dog", "car", "tree", "boat", "house"]
FAST = {"tda": {"text_head": "zeroshot"}, "dmn_zs": {"text_head": "zeroshot"}}   # skips the 80-template head


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def tiny_model(request, tiny_model):
    """The tiny ResNet CLIP, or the tiny ViT for a method bound to ViTs (conftest.model_for_method)."""
    return model_for_method(request, tiny_model)


_HEADS: dict[int, ClassHeads] = {}


@pytest.fixture
def heads(tiny_model):
    """The class heads of the test's tiny CLIP, built once per model (as a module fixture did)."""
    if id(tiny_model) not in _HEADS:
        _HEADS[id(tiny_model)] = ClassHeads(tiny_model, CLASSNAMES)
    return _HEADS[id(tiny_model)]


def _entry(tag: float, loss: float, probs=None) -> CacheEntry:
    return CacheEntry(torch.full((4,), tag), loss, probs)


def _tags(cache, label):
    return [float(e.feature[0]) for e in cache[label]]


# -- TDA cache rules on hand-made streams ------------------------------------------------------

def test_positive_cache_keeps_the_lowest_entropy_entries_per_class():
    cache: dict = {}
    for tag, loss in [(1, 0.5), (2, 0.3), (3, 0.9)]:
        assert update_cache(cache, 0, _entry(tag, loss), capacity=3)
    assert _tags(cache, 0) == [2, 1, 3]                        # sorted by loss
    assert update_cache(cache, 0, _entry(4, 0.7), 3)           # full: replaces the worst (0.9)
    assert _tags(cache, 0) == [2, 1, 4]
    assert not update_cache(cache, 0, _entry(5, 0.8), 3)       # worse than the worst: dropped
    assert not update_cache(cache, 0, _entry(6, 0.7), 3)       # ties the worst: dropped (strict)
    assert update_cache(cache, 0, _entry(7, 0.1), 3)
    assert _tags(cache, 0) == [7, 2, 1]
    assert [e.loss for e in cache[0]] == [0.1, 0.3, 0.5]
    # other classes are independent, and an equal loss goes after the older entry
    update_cache(cache, 5, _entry(8, 0.2), 3)
    update_cache(cache, 5, _entry(9, 0.2), 3)
    assert _tags(cache, 5) == [8, 9] and _tags(cache, 0) == [7, 2, 1]
    # the negative cache has capacity 2
    neg: dict = {}
    for tag, loss in [(1, 0.4), (2, 0.6), (3, 0.5)]:
        update_cache(neg, 2, _entry(tag, loss), capacity=2)
    assert _tags(neg, 2) == [1, 3]
    assert not update_cache(neg, 1, _entry(1, 0.0), capacity=0) and 1 not in neg


def test_cache_logits_follow_the_affinity_function():
    keys = F.normalize(torch.tensor([[1.0, 0, 0], [0.6, 0.8, 0], [0, 0, 1.0]]), dim=-1)
    f = F.normalize(torch.tensor([0.8, 0.6, 0.0]), dim=-1)
    cache = {2: [CacheEntry(keys[1], 0.1)], 0: [CacheEntry(keys[0], 0.1), CacheEntry(keys[2], 0.2)]}
    got = cache_logits(f, cache, alpha=2.0, beta=5.0, num_classes=4)
    w = [math.exp(-5.0 * (1 - float(k @ f))) for k in keys]
    torch.testing.assert_close(got, torch.tensor([2 * (w[0] + w[2]), 0, 2 * w[1], 0]), rtol=1e-6, atol=0)
    probs = [torch.tensor([0.5, 0.02, 0.48, 0.0]), torch.tensor([0.9, 0.05, 0.04, 0.01])]
    neg = {1: [CacheEntry(keys[0], 0.3, probs[0])], 3: [CacheEntry(keys[1], 0.3, probs[1])]}
    got = cache_logits(f, neg, alpha=0.5, beta=1.0, num_classes=4, mask_range=(0.03, 1.0))
    w = [math.exp(-(1 - float(k @ f))) for k in keys[:2]]
    # masks: p in (0.03, 1.0) -> [1, 0, 1, 0] and [1, 1, 1, 0]
    torch.testing.assert_close(got, 0.5 * torch.tensor([w[0] + w[1], w[1], w[0] + w[1], 0]), rtol=1e-6, atol=0)
    assert torch.equal(cache_logits(f, {}, 1.0, 1.0, 4), torch.zeros(4))


def test_tda_negative_cache_takes_only_the_entropy_band(tiny_model, heads):
    tda = shiftlab.create_method("tda", tiny_model, CLASSNAMES, heads=heads)
    probs = torch.full((6,), 1 / 6)
    for i, h in enumerate([0.1, 0.2, 0.3, 0.5, 0.45, 0.7]):
        tda.update(TDASample(torch.full((4,), float(i)), torch.zeros(6), probs, loss=h, norm_entropy=h, pred=i // 3))
    assert {k: _tags(tda.pos_cache, k) for k in tda.pos_cache} == {0: [0.0, 1.0, 2.0], 1: [4.0, 3.0, 5.0]}
    assert {k: _tags(tda.neg_cache, k) for k in tda.neg_cache} == {0: [2.0], 1: [4.0]}   # strictly inside (0.2, 0.5)
    assert all(e.probs is not None for v in tda.neg_cache.values() for e in v)


def test_tda_sample_summary_averages_the_confident_views(tiny_model, heads):
    gen = torch.Generator().manual_seed(0)
    feats = F.normalize(torch.randn(10, heads.ensemble.shape[1], generator=gen), dim=-1)
    for ratio, k in [(0.1, 1), (0.3, 3), (0.05, 1)]:
        tda = shiftlab.create_method("tda", tiny_model, CLASSNAMES, heads=heads, view_ratio=ratio)
        s = tda.summarize_sample(feats)
        logits = tiny_model.logit_scale * feats @ heads.ensemble.T        # TDA's classifier: 80 templates
        ent = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
        kept = ent.argsort()[:k]
        torch.testing.assert_close(s.feature, feats[kept].mean(0))
        torch.testing.assert_close(s.logits, logits[kept].mean(0))
        mean_p = logits[kept].softmax(-1).mean(0)
        torch.testing.assert_close(s.probs, mean_p)
        assert s.loss == pytest.approx(float(-(mean_p * mean_p.log()).sum()), rel=1e-5)
        assert s.norm_entropy == pytest.approx(s.loss / math.log2(6))          # the authors' log2 normaliser
        assert s.pred == int(logits[kept].mean(0).argmax())


# -- DMN memory rules ---------------------------------------------------------------------------

def test_dynamic_memory_capacity_and_replacement():
    mem = DynamicMemory(num_classes=3, capacity=2)
    f = lambda tag: torch.full((4,), float(tag))   # noqa: E731
    assert mem.update(1, f(1), 0.5) == 0 and mem.update(1, f(2), 0.7) == 1
    assert mem.update(1, f(3), 0.9) is None          # full, higher entropy than every slot
    assert mem.update(1, f(4), 0.7) is None          # ties the worst: kept out (strict)
    assert mem.update(1, f(5), 0.6) == 1             # replaces the highest-entropy slot in place
    assert mem.features[1, :, 0].tolist() == [1, 5] and mem.entropies[1].tolist() == pytest.approx([0.5, 0.6])
    assert mem.update(1, f(6), 0.5) == 1 and mem.entropies[1].tolist() == pytest.approx([0.5, 0.5])
    assert mem.update(1, f(7), 0.1) == 1             # tie among the worst: the last slot goes
    assert mem.update(0, f(8), 2.0) == 0 and len(mem) == 3 and mem.counts == [1, 2, 0]


def test_memory_readout_is_a_similarity_weighted_prototype():
    text = F.normalize(torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]), dim=-1)
    f = F.normalize(torch.tensor([0.6, 0.8, 0.0]), dim=-1)
    mem = DynamicMemory(2, capacity=3)
    # empty memory: each prototype is the text feature -> zero-shot logits
    torch.testing.assert_close(memory_logits(f, mem, text, 5.5, 10.0), 10.0 * text @ f)
    m0 = F.normalize(torch.tensor([0.0, 0.6, 0.8]), dim=-1)
    mem.update(0, m0, 0.3)
    w_m, w_t = math.exp(-5.5 * (1 - float(m0 @ f))), math.exp(-5.5 * (1 - float(text[0] @ f)))
    proto0 = F.normalize(w_m * m0 + w_t * text[0], dim=-1)
    want = torch.stack([10.0 * proto0 @ f, 10.0 * text[1] @ f])
    torch.testing.assert_close(memory_logits(f, mem, text, 5.5, 10.0), want, rtol=1e-6, atol=1e-6)


def test_first_views_do_not_depend_on_the_view_count(tmp_path):
    # DMN-ZS uses the first 32 views of a 64-view run: they must be the views of a 32-view run
    random_image((50, 40), seed=1).save(tmp_path / "img.png")
    img = decode_image(tmp_path / "img.png")
    many = ViewGenerator(ViewConfig(n_views=8, size=32), seed=3)(img, 11)
    few = ViewGenerator(ViewConfig(n_views=4, size=32), seed=3)(img, 11)
    assert torch.equal(many[:4], few)


def test_dmn_mixes_zero_shot_and_memory_probabilities(tiny_model, heads):
    dmn = shiftlab.create_method("dmn_zs", tiny_model, CLASSNAMES, heads=heads, dynamic_weight=0.5)
    feats = F.normalize(torch.randn(8, heads.ensemble.shape[1], generator=torch.Generator().manual_seed(1)), dim=-1)
    out = dmn.predict_context(SampleContext(tiny_model, heads, torch.zeros(8, 3, 1, 1), image_features=feats))
    scale = tiny_model.logit_scale
    p_zs = (scale * feats[0] @ heads.ensemble.T).softmax(-1)
    p_dyn = memory_logits(feats[0], dmn.memory, heads.ensemble, 5.5, scale).softmax(-1)
    torch.testing.assert_close(out.probs, (p_zs + 0.5 * p_dyn) / 1.5)
    torch.testing.assert_close(out.logits.softmax(-1), out.probs)
    assert len(dmn.memory) == 1 and out.extras["stored"]
    assert int(dmn.memory.counts[out.extras["pseudo_label"]]) == 1
    assert torch.equal(dmn.memory.features[out.extras["pseudo_label"], 0], feats[0])   # the original view


# -- online state: reset and round trip -----------------------------------------------------------

def _stream(tiny_model, heads, n: int, views: int = 8, pixels: bool = False):
    """n samples: view features scattered around random classes, or (`pixels`, for a method that reads
    pixels through a tower of its own) one random image each at the model's input size."""
    gen = torch.Generator().manual_seed(7)
    dim = heads.zeroshot.shape[1]
    ctxs = []
    for _ in range(n):
        if pixels:
            size = tiny_model.image_size
            image = tiny_model.normalize(torch.rand(1, 3, size, size, generator=gen))
            ctxs.append(SampleContext(tiny_model, heads, image))
            continue
        centre = heads.zeroshot[int(torch.randint(0, len(CLASSNAMES), (1,), generator=gen))]
        feats = F.normalize(centre + 0.6 * torch.randn(views, dim, generator=gen), dim=-1)
        ctxs.append(SampleContext(tiny_model, heads, torch.zeros(views, 3, 1, 1), image_features=feats))
    return ctxs


# each online method's small config (its spec's `test_config`): what fills its state on a short stream
SMALL = {name: spec(name).test_config for name in shiftlab.list_methods(kind="online")}
ONLINE_METHODS = shiftlab.list_methods(kind="online")


def test_every_online_method_has_a_small_test_config():
    # a new online method is tested here once its spec declares one (a config its state fills up with)
    assert [name for name in ONLINE_METHODS if not SMALL[name]] == []
    assert SMALL["boostadapter"] == {**SMALL["tda"], "view_ratio": 0.25, "delta": 1}   # 2 boosting views of 8


@pytest.mark.parametrize("name", ONLINE_METHODS)
def test_state_round_trips_and_resumes_the_same_stream(name, tiny_model, heads, tmp_path):
    ctxs = _stream(tiny_model, heads, 24, pixels=spec(name).needs_pixels)
    whole = shiftlab.create_method(name, tiny_model, CLASSNAMES, heads=heads, **SMALL[name])
    assert whole.spec.episodic is False
    want = [whole.predict_context(c) for c in ctxs]

    first = shiftlab.create_method(name, tiny_model, CLASSNAMES, heads=heads, **SMALL[name])
    for c in ctxs[:12]:
        first.predict_context(c)
    state = first.state_dict()
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)          # plain tensors and lists only
    second = shiftlab.create_method(name, tiny_model, CLASSNAMES, heads=heads, **SMALL[name])
    second.load_state_dict(loaded)
    got = [second.predict_context(c) for c in ctxs[12:]]
    for g, w in zip(got, want[12:]):
        assert torch.equal(g.logits, w.logits) and g.extras == w.extras
    _assert_state_equal(second.state_dict(), whole.state_dict())
    if hasattr(whole, "pos_cache"):   # TDA's caches: the stream filled both and the classes' capacity
        assert whole.neg_cache and max(len(v) for v in whole.pos_cache.values()) == 2
    elif name == "dmn_zs":
        assert max(whole.memory.counts) == 2
    elif name == "dota":   # the per-class covariances were allocated and carried over
        assert whole.scatter is not None and loaded["scatter"].shape == whole.scatter.shape
    elif name == "onzeta":   # the dual variable moved and the proxies left the text head
        assert whole.rho.max() > 0 and not torch.equal(whole.proxy, whole.text())
    elif name == "dynaprompt":   # the carried buffer was tuned and every prompt used
        assert loaded["residuals"].abs().max() > 0 and min(loaded["uses"]) > 0
    elif name in ("oga", "oga_batch"):      # the covariance was estimated and carried over
        assert whole.estimated and loaded["estimated"] and int(whole.filled.sum(1).max()) == 3
    elif name == "ecalp":    # the graph holds every sample (and the last one's duplicate node)
        assert whole.graph.features.shape[0] == 24 and whole.graph.knn_idx.shape[0] == 25

    with pytest.raises(ValueError, match="classes"):
        other = shiftlab.create_method(name, tiny_model, CLASSNAMES[:3], **SMALL[name])
        other.load_state_dict(loaded)


@pytest.mark.parametrize("name", ONLINE_METHODS)
def test_reset_returns_to_the_initial_state(name, tiny_model, heads):
    ctxs = _stream(tiny_model, heads, 10, pixels=spec(name).needs_pixels)
    method = shiftlab.create_method(name, tiny_model, CLASSNAMES, heads=heads, **SMALL[name])
    fresh = shiftlab.create_method(name, tiny_model, CLASSNAMES, heads=heads, **SMALL[name])
    empty = fresh.state_dict()
    first = [method.predict_context(c).logits for c in ctxs]
    assert method.state_dict()["seen"] == 10
    method.reset()
    _assert_state_equal(method.state_dict(), empty)
    again = [method.predict_context(c).logits for c in ctxs]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    # and the online state does carry over between samples (the stream matters)
    assert not torch.equal(first[-1], fresh.predict_context(ctxs[-1]).logits)


def _assert_state_equal(a, b):
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_state_equal(a[k], b[k])
    elif isinstance(a, torch.Tensor):
        assert a.shape == b.shape and torch.equal(a, b)
    else:
        assert a == b


# -- through the engine ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_imagenet_r(tmp_path_factory.mktemp("data"), per_class=1, classes=range(0, 200, 5))   # 40 images


def _records(run_dir: Path) -> list[dict]:
    recs = record_files.load_records(run_dir)
    for r in recs:
        r.pop("seconds", None)
    return sorted(recs, key=lambda r: (r["id"], r["setting"], r["method"] or ""))


@pytest.mark.slow
def test_engine_runs_online_methods_along_the_seeded_stream(data, tmp_path):
    cfg = RunConfig(data=str(data), methods=["tda", "dmn_zs", "zeroshot"], views=8, workers=0, progress=False,
                    batch_size=4, seed=3, out=str(tmp_path / "run"), device="cpu")
    summary = run(cfg, model=tiny_clip(0), dataset=build_dataset("imagenet-r", data))
    assert summary["config"]["order"] == "shuffled" and summary["config"]["seed"] == 3
    assert {m: summary["methods"][m]["n"] for m in ("tda", "dmn_zs", "zeroshot")} == {m: 40 for m in
                                                                                       ("tda", "dmn_zs", "zeroshot")}
    recs = {(r["id"], r["method"]): r for r in _records(Path(cfg.out))}
    order = stream_order(40, "shuffled", 3)
    # the caches grow along the stream order, one sample at a time
    pos = [recs[(sid, "tda")]["extras"]["pos_entries"] for sid in order]
    mem = [recs[(sid, "dmn_zs")]["extras"]["memory_entries"] for sid in order]
    assert pos[0] == 1 and mem == list(range(1, 41))
    assert all(b - a in (0, 1) for a, b in zip(pos, pos[1:]))
    assert (Path(cfg.out) / "online_state.pt").is_file()


@pytest.mark.slow
def test_engine_equals_a_replay_of_the_stream(data, tmp_path):
    """The engine's records for online methods are those of one instance fed the stream in order."""
    model = tiny_clip(0)
    dataset = build_dataset("imagenet-r", data)
    cfg = RunConfig(data=str(data), methods=["tda", "dmn_zs"], method_config=FAST, views=8, workers=0,
                    progress=False, batch_size=1, seed=1, limit=25, out=str(tmp_path / "run"), device="cpu")
    run(cfg, model=model, dataset=dataset)
    recs = {(r["id"], r["method"]): r for r in _records(Path(cfg.out))}
    heads = ClassHeads(model, dataset.classnames)
    methods = {n: shiftlab.create_method(n, model, dataset.classnames, heads=heads, **FAST[n]) for n in FAST}
    views = ViewGenerator(ViewConfig(n_views=8, size=model.image_size), seed=1)
    for sid in stream_order(len(dataset), "shuffled", 1)[:25]:
        x = model.normalize(views(decode_image(dataset.path(sid)), sid).float().div_(255))
        with torch.no_grad():
            feats = model.encode_normalized(x).float()
        ctx = SampleContext(model, heads, x, image_features=feats, sample_id=sid)
        for name, method in methods.items():
            out = method.predict_context(ctx)
            rec = recs[(sid, name)]
            assert rec["pred"] == int(out.logits.argmax())
            assert rec["confidence"] == float(out.probabilities().max())
            assert rec["extras"] == out.extras


# a transfer and an adaptive attack at two budgets, one step each: the settings of issue 41's command, made cheap
SEVERAL = {"name": "pgd", "eps": [1 / 255, 4 / 255], "alpha": 1 / 1020, "steps": 1}


def _settings_alone(base: dict, tmp_path: Path, model, dataset) -> list[dict]:
    """The records of one run per setting of `base` with SEVERAL --clean-and-robust --attack-target both: clean
    (no attack), and each budget alone, by transfer and adaptively."""
    run(RunConfig(**base, out=str(tmp_path / "clean")), model=model, dataset=dataset)
    out = _records(tmp_path / "clean")
    for eps in SEVERAL["eps"]:
        for target in ("transfer", "adaptive"):
            one = tmp_path / f"{target}{eps}"
            run(RunConfig(**base, out=str(one), attack={**SEVERAL, "eps": [eps]}, attack_target=target),
                model=model, dataset=dataset)
            # a run of one budget names its setting after the attack alone ("pgd", "pgd-adaptive")
            out += [{**r, "setting": r["setting"].replace("pgd", budget_setting("pgd", eps))} for r in _records(one)]
    return sorted(out, key=lambda r: (r["id"], r["setting"], r["method"] or ""))


@pytest.mark.slow
def test_online_methods_adapt_along_each_settings_stream_as_a_run_of_that_setting_alone(data, tmp_path):
    """A run of several settings (clean, two budgets by transfer and adaptively) gives an online method one state
    per setting: its records for each setting are those of a run of that setting alone (one shared state would
    adapt along every setting's samples interleaved, and its clean records would see attacked samples)."""
    dataset, model = build_dataset("imagenet-r", data), tiny_clip(0)
    base = dict(data=str(data), methods=["tda", "tent", "zeroshot"], method_config=FAST, views=8, workers=0,
                progress=False, batch_size=2, seed=2, device="cpu", limit=3)
    run(RunConfig(**base, out=str(tmp_path / "several"), attack=SEVERAL, attack_target="both", clean_and_robust=True),
        model=model, dataset=dataset)
    several = _records(tmp_path / "several")
    assert {r["setting"] for r in several} == {"clean", "pgd@eps1", "pgd@eps4", "pgd@eps1-adaptive",
                                               "pgd@eps4-adaptive"}
    assert len(several) == 3 * 3 * 5 and not [r for r in several if "error" in r]
    assert several == _settings_alone(base, tmp_path, model, dataset)


class _Crash(Exception):
    pass


@pytest.mark.slow
def test_resume_after_a_crash_between_checkpoint_and_append(data, tmp_path, monkeypatch):
    """Killed after the online state of a batch is saved but before its records are appended:
    the resumed run writes them back from the checkpoint and continues the same stream."""
    base = dict(data=str(data), methods=["tda", "dmn_zs", "zeroshot"], method_config=FAST, views=8, workers=0,
                progress=False, batch_size=4, seed=2, device="cpu", online_checkpoint_seconds=0)
    calls = _crash_at_third_checkpoint(base, data, tmp_path)
    partial = record_files.load_records(tmp_path / "cut")
    # two batches written; of the third, the episodic zeroshot records (appended before the online
    # checkpoint) but not the online ones (only checkpointed)
    assert len(partial) == 2 * 4 * 3 + 4
    assert {r["method"] for r in partial if r["id"] in calls[2]} == {"zeroshot"}
    run(RunConfig(**base, out=str(tmp_path / "cut"), resume=True), model=tiny_clip(0),
        dataset=build_dataset("imagenet-r", data))
    assert _records(tmp_path / "cut") == _records(tmp_path / "whole")


def _crash_at_third_checkpoint(base: dict, data: Path, tmp_path: Path, model=None) -> list:
    """Run `base` whole into tmp_path/whole, then into tmp_path/cut crashing right after its third online
    checkpoint (state saved, that batch's online records not appended); returns the checkpointed batches."""
    dataset = build_dataset("imagenet-r", data)
    model = model if model is not None else tiny_clip(0)
    run(RunConfig(**base, out=str(tmp_path / "whole")), model=model, dataset=dataset)
    calls = []

    class CrashAtThirdCheckpoint(RunHooks):
        def after_checkpoint(self, ids):
            calls.append(ids)
            if len(calls) == 3:
                raise _Crash

    with pytest.raises(_Crash):
        run(RunConfig(**base, out=str(tmp_path / "cut")), model=model, dataset=dataset,
            hooks=CrashAtThirdCheckpoint())
    return calls


def _tower_groups(names: list[str]) -> list[tuple[list[str], dict, shiftlab.ClipModel]]:
    """`names` split by the tiny CLIP they run on: (methods, RunConfig's model, the model `run` gets); the tiny
    ResNet, and the tiny ViT for the methods bound to ViTs (their spec's `towers`)."""
    vit_only = [n for n in names if "resnet" not in spec(n).towers]
    groups = [([n for n in names if n not in vit_only], {"model": "RN50"}, tiny_clip(0)),
              (vit_only, {"model": "shiftlab-tiny-vit"}, shiftlab.load_model("shiftlab-tiny-vit", None, seed=0))]
    return [g for g in groups if g[0]]


def _fast(name: str) -> dict:
    """SMALL[name] with the one-template head where the method has a text_head field (no 80-template build)."""
    from shiftlab.params import field_range
    fields = {f.name: f for f in dataclasses.fields(shiftlab.methods.get_method_class(name).spec.config_class)}
    head = field_range(fields["text_head"]) if "text_head" in fields else None
    return {**SMALL[name], **({"text_head": "zeroshot"} if head and "zeroshot" in (head.choices or ()) else {})}


@pytest.fixture(scope="module")
def crashed_and_resumed(data, tmp_path_factory, one_thread_module) -> dict[str, tuple[list[dict], list[dict]]]:
    """{online method: (its records of the resumed run, of one uninterrupted run)}: every online method (with
    zeroshot) in one run, killed after its third checkpoint and resumed (one run per tiny tower)."""
    out = {}
    for names, named, model in _tower_groups(ONLINE_METHODS):
        tmp = tmp_path_factory.mktemp("crash-" + named["model"])
        base = dict(data=str(data), methods=[*names, "zeroshot"], method_config={n: _fast(n) for n in names},
                    views=8, workers=0, progress=False, batch_size=4, seed=2, limit=24, device="cpu",
                    online_checkpoint_seconds=0, **named)
        assert len(_crash_at_third_checkpoint(base, data, tmp, model)) == 3
        run(RunConfig(**base, out=str(tmp / "cut"), resume=True), model=model,
            dataset=build_dataset("imagenet-r", data))
        cut, whole = _records(tmp / "cut"), _records(tmp / "whole")
        assert len(whole) == 24 * (len(names) + 1)
        out.update({n: ([r for r in cut if r["method"] == n], [r for r in whole if r["method"] == n])
                    for n in [*names, "zeroshot"]})
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ONLINE_METHODS)
def test_every_online_method_resumes_exactly_after_a_crash_mid_stream(name, crashed_and_resumed):
    """Each online method, killed after its third checkpoint and resumed, writes the records of one
    uninterrupted run: its state_dict carries everything the stream built (the engine's replay rules). All the
    online methods share that run (the engine's kill and resume path is the same for each; each one's state is
    its own entry of the checkpoint)."""
    cut, whole = crashed_and_resumed[name]
    assert len(whole) == 24 and cut == whole


@pytest.fixture(scope="module")
def robust_runs(data, tmp_path_factory, one_thread_module) -> dict[str, dict]:
    """{online method: the summary of its attacked run}: every online method in one run (one per tiny tower)."""
    out = {}
    for names, named, model in _tower_groups(ONLINE_METHODS):
        cfg = RunConfig(data=str(data), methods=names, method_config={n: _fast(n) for n in names}, views=8,
                        workers=0, progress=False, seed=1, limit=4, device="cpu",
                        out=str(tmp_path_factory.mktemp("adv") / "run"),
                        attack={"name": "pgd", "eps": 1 / 255, "alpha": 1 / 1020, "steps": 1}, **named)
        summary = run(cfg, model=model, dataset=build_dataset("imagenet-r", data))
        records = record_files.load_records(Path(cfg.out))
        out.update({n: (summary, [r for r in records if r["method"] == n]) for n in names})
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ONLINE_METHODS)
def test_every_online_method_scores_robust_accuracy_and_ece_in_the_same_pass(name, robust_runs):
    summary, records = robust_runs[name]
    robust = summary["methods"][name]["robust"]
    assert robust["setting"] == "pgd" and robust["n"] == 4 and 0 <= robust["ece"] <= 100
    assert len(records) == 4 and [r for r in records if "error" in r] == []


# -- through the CLI, killed with SIGKILL mid-stream -------------------------------------------------

def _sigkill_argv(data: Path, checkpoint: Path) -> list[str]:
    return ["run", "--allow-partial", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained", str(checkpoint),
            "--methods", "tda,dmn_zs,zeroshot", "--views", "8", "--workers", "0", "--batch-size", "1",
            "--seed", "4", "--device", "cpu", "--no-progress", "--online-checkpoint-seconds", "0",
            "--set", "tda.text_head=zeroshot", "--set", "dmn_zs.text_head=zeroshot"]


@pytest.fixture(scope="module")
def uninterrupted_cli_run(data, tiny_checkpoint, tmp_path_factory, one_thread_module) -> Path:
    """The run both kill points are compared with, made once for the module."""
    out = tmp_path_factory.mktemp("sigkill") / "whole"
    assert cli_main(_sigkill_argv(data, tiny_checkpoint) + ["--out", str(out)]) == 0
    return out


# Killed after the 6th sample of 40 (the online state checkpointed at every step): after its step, every
# record of the 6 samples is written; after its checkpoint, the 6th sample's two online records are only
# in the checkpoint (written, not yet appended), and the resume must restore them from there.
@pytest.mark.slow
@pytest.mark.parametrize("at,written", [("after_step:6", 3 * 6), ("after_checkpoint:6", 3 * 6 - 2)],
                         ids=["after-step", "between-checkpoint-and-records"])
def test_cli_resume_after_sigkill_equals_an_uninterrupted_run(data, tmp_path, tiny_checkpoint, at, written,
                                                               uninterrupted_cli_run, capsys):
    argv = _sigkill_argv(data, tiny_checkpoint)
    model = shiftlab.load_model("shiftlab-tiny", str(tiny_checkpoint))
    assert model.name == "shiftlab-tiny" and model.image_size == 64    # the tiny architecture, as named

    out = tmp_path / "killed"
    with GatedRun(tmp_path / "gate", [*argv, "--out", str(out)], at=at) as child:
        child.wait_reached()
        assert child.kill() == -signal.SIGKILL
    assert len(record_files.load_records(out)) == written and (out / "online_state.pt").is_file()

    capsys.readouterr()
    assert cli_main(argv + ["--out", str(out), "--resume"]) == 0
    err, restored = capsys.readouterr().err, 3 * 6 - written
    assert (f"; {restored} online record(s) restored from the last checkpoint" in err) if restored else \
        "restored" not in err
    assert _records(out) == _records(uninterrupted_cli_run)


@pytest.mark.slow
def test_a_run_of_several_settings_killed_between_checkpoint_and_records_resumes_each_settings_state(
        data, tmp_path, tiny_checkpoint, capsys):
    """Issue 41's command (`--attack autoattack --eps 1/255,4/255`, adaptive, here with transfer and clean too) for
    its online methods TDA and TENT on the tiny CLIP, killed after the 1st of 2 samples' online checkpoint, before
    its records are appended: the checkpoint holds their state for each of the 5 settings, the resume restores the
    1st sample's records from it and continues each setting's state (no replay) to the records of an uninterrupted
    run, and summary.json scores each setting. (Its episodic methods: tests/attacks/test_adaptive.py.)"""
    argv = _sigkill_argv(data, tiny_checkpoint)
    argv[argv.index("--methods") + 1] = "tda,tent"
    small = ["attack.steps=1", "attack.queries=2", "attack.targets=1", "attack.attack_misclassified=True"]
    argv += ["--limit", "2", "--attack", "autoattack", "--eps", "1/255,4/255", "--attack-target", "both",
             "--clean-and-robust", *[a for item in small for a in ("--set", item)]]
    settings = {"clean", "autoattack@eps1", "autoattack@eps4", "autoattack@eps1-adaptive", "autoattack@eps4-adaptive"}
    assert cli_main(argv + ["--out", str(tmp_path / "whole")]) == 0
    out = tmp_path / "killed"
    with GatedRun(tmp_path / "gate", [*argv, "--out", str(out)], at="after_checkpoint:1") as child:
        child.wait_reached()
        assert child.kill() == -signal.SIGKILL
    assert record_files.load_records(out) == []
    states = torch.load(out / "online_state.pt", weights_only=True)["states"]
    assert {n: set(states[n]["settings"]) for n in states} == {"tda": settings, "tent": settings}
    capsys.readouterr()
    assert cli_main(argv + ["--out", str(out), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "; 10 online record(s) restored from the last checkpoint" in err and "replay" not in err
    assert _records(out) == _records(tmp_path / "whole")
    summary = json.loads((out / "summary.json").read_text())
    for name in ("tda", "tent"):
        m = summary["methods"][name]
        assert set(m["robust_by_setting"]) == {"autoattack@eps1", "autoattack@eps4"}
        assert m["adaptive_by_setting"]["autoattack@eps4-adaptive"]["mode"] == spec(name).adaptive.label


@pytest.mark.slow
def test_resume_on_another_stream_is_refused(data, tmp_path):
    """An online state continued along a different stream (another seed) would silently mix two streams."""
    base = dict(data=str(data), methods=["tda"], method_config=FAST, views=8, workers=0, progress=False,
                batch_size=2, device="cpu", online_checkpoint_seconds=0, out=str(tmp_path / "run"), limit=4)
    dataset = build_dataset("imagenet-r", data)
    run(RunConfig(**base, seed=1), model=tiny_clip(0), dataset=dataset)
    with pytest.raises(ValueError, match="different stream"):
        run(RunConfig(**{**base, "limit": None}, seed=2, resume=True), model=tiny_clip(0), dataset=dataset)
    run(RunConfig(**{**base, "limit": None}, seed=1, resume=True), model=tiny_clip(0), dataset=dataset)
    assert len(record_files.load_records(tmp_path / "run")) == len(dataset)


@pytest.mark.parametrize("damage", ["truncated", "not a checkpoint"])
def test_a_damaged_checkpoint_is_said_and_the_stream_replayed(data, tmp_path, capsys, damage):
    """online_state.pt cut short or overwritten: nothing of it is trusted (a warning naming it, the stream replayed from
    the initial state), and the records equal an uninterrupted run's, instead of torch.load's traceback."""
    base = dict(data=str(data), methods=["tda"], method_config=FAST, views=4, workers=0, progress=False,
                batch_size=2, device="cpu", online_checkpoint_seconds=0, seed=1)
    dataset, model = build_dataset("imagenet-r", data), tiny_clip(0)
    run(RunConfig(**base, limit=6, out=str(tmp_path / "whole")), model=model, dataset=dataset)
    out = tmp_path / "run"
    run(RunConfig(**base, limit=4, out=str(out)), model=model, dataset=dataset)
    state = out / "online_state.pt"
    state.write_bytes(state.read_bytes()[:200] if damage == "truncated" else b"garbage")
    capsys.readouterr()
    run(RunConfig(**base, limit=6, out=str(out), resume=True), model=model, dataset=dataset)
    err = capsys.readouterr().err
    assert f"shiftlab: warning: {state} is damaged or not an online checkpoint" in err
    assert _records(out) == _records(tmp_path / "whole")


def test_a_checkpoint_of_another_config_is_not_continued(data, tmp_path, capsys):
    """online_state.pt copied from a run of other settings along the same stream (TDA's caches of capacity 1): its
    state is not this run's, so the stream is replayed, said, and the records are an uninterrupted run's."""
    base = dict(data=str(data), methods=["tda"], views=4, workers=0, progress=False, batch_size=2, device="cpu",
                online_checkpoint_seconds=0, seed=1)
    dataset, model = build_dataset("imagenet-r", data), tiny_clip(0)
    run(RunConfig(**base, method_config=FAST, limit=6, out=str(tmp_path / "whole")), model=model, dataset=dataset)
    run(RunConfig(**base, method_config=FAST, limit=4, out=str(tmp_path / "run")), model=model, dataset=dataset)
    other = {"tda": {**FAST["tda"], "pos_capacity": 1}}
    run(RunConfig(**base, method_config=other, limit=4, out=str(tmp_path / "other")), model=model, dataset=dataset)
    (tmp_path / "run" / "online_state.pt").write_bytes((tmp_path / "other" / "online_state.pt").read_bytes())
    capsys.readouterr()
    run(RunConfig(**base, method_config=FAST, limit=6, out=str(tmp_path / "run"), resume=True), model=model,
        dataset=dataset)
    err = capsys.readouterr().err
    assert "online_state.pt holds tda's state under other settings" in err
    assert _records(tmp_path / "run") == _records(tmp_path / "whole")

"""COSMIC: its pieces against straightforward computations, the CLIP-only variant and the DINOv2 path (a random
timm DINOv2), and the authors' own code on the golden stream (tests/fixtures/golden/cosmic, made by the driver
beside it from hf618/COSMIC's `direct_inference`, float32 on the CPU, 24 samples of 8 views; their random
DINOv2 ViT-S/14's view-0 features are replayed, shiftlab's CLIP side computes its own).

Tolerances: features FEATURES; probabilities and clique scores LOSS; labels, cache decisions and cliques
exactly, the cliques after a check that no similarity lies within FEATURES of the graph's threshold.
"""
from __future__ import annotations

import hashlib
import itertools
import json

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FEATURES, FIXTURES, LOSS, assert_close, check_margin, stream_views
from conftest import make_tiny_model
from shiftlab import ClassHeads, SampleContext
from shiftlab.methods.common.dmn_memory import DynamicMemory
from shiftlab.methods.cosmic import method as cosmic

NAMES = ["cat", "dog", "car", "tree", "boat", "house"]

pytestmark = pytest.mark.usefixtures("one_thread")


def _unit(*shape: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


# -- the pieces ---------------------------------------------------------------------------------------------

def test_degree_graph_reaches_the_target_degree_and_second_order_needs_two_common_neighbours():
    space = _unit(30, 8, seed=0)
    plain = cosmic.degree_graph(space, 4.0, second_order=False)
    assert torch.equal(plain, plain.T) and plain.diagonal().sum() == 0
    assert abs(float(plain.sum()) / 30 - 4.0) < 1e-2 + 2 / 30      # bisection over a finite set of sims
    sog = cosmic.degree_graph(space, 4.0, second_order=True)
    for i, j in itertools.product(range(30), repeat=2):
        common = int((plain[i] * plain[j]).sum())
        assert bool(sog[i, j]) == (bool(plain[i, j]) and common >= 2), (i, j)


def _their_bisection(sim: torch.Tensor, target: float) -> float:
    """utils_cosmic.py build_graph_by_degree's loop, written out."""
    n = sim.shape[0]
    low, high = sim.min().item(), sim.max().item()
    for _ in range(500):
        mid = (low + high) / 2
        adj = (sim > mid).float()
        adj.fill_diagonal_(0)
        degree = adj.sum() / n
        if abs(degree - target) < 1e-2:
            break
        if degree < target:
            high = mid
        else:
            low = mid
    return mid


@pytest.mark.parametrize("spread", [1.0, 0.01])     # 0.01: features as alike as random weights give (500 steps)
def test_degree_threshold_is_their_bisection_exactly(spread):
    gen = torch.Generator().manual_seed(0)
    x = F.normalize(spread * torch.randn(300, 16, generator=gen) + torch.randn(1, 16, generator=gen), dim=-1)
    sim = x @ x.T
    assert cosmic.degree_threshold(sim, 4.0) == _their_bisection(sim, 4.0)


def test_maximal_cliques_are_maximal_and_cover_every_node():
    adj = torch.zeros(6, 6)
    for i, j in [(0, 1), (1, 2), (0, 2), (2, 3), (4, 5)]:
        adj[i, j] = adj[j, i] = 1
    cliques = cosmic.maximal_cliques(adj)
    assert sorted(sorted(c) for c in cliques) == [[0, 1, 2], [2, 3], [4, 5]]
    adj[4, 5] = adj[5, 4] = 0
    assert sorted(sorted(c) for c in cosmic.maximal_cliques(adj)) == [[0, 1, 2], [2, 3], [4], [5]]


def test_clique_scores_read_the_nodes_of_the_nearest_cliques():
    space = _unit(6, 4, seed=1)
    cliques = [[0, 1], [2, 3], [4, 5], [1, 4], [3], [5]]
    anchors = cosmic.clique_anchors(space, cliques)
    torch.testing.assert_close(anchors[0], (space[0] + space[1]) / 2)
    x = space[2]
    got = cosmic.clique_scores(x, anchors, space, cliques, ratio=0.34, alpha=2.0, beta=8.0)
    nearest = sorted(range(6), key=lambda k: -float(x @ anchors[k]))[:2]          # max(1, int(6 x 0.34)) = 2
    nodes = {v for k in nearest for v in cliques[k]}
    want = torch.tensor([2.0 * float(torch.exp(-8 * (1 - x @ space[v]))) if v in nodes else 0.0 for v in range(6)])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_cache_keeps_the_lowest_losses_sorted():
    cache: dict = {}
    f = torch.zeros(2)
    assert cosmic.cache_update(cache, 3, f, 0.5, 2)
    assert cosmic.cache_update(cache, 3, f + 1, 0.2, 2)
    assert [loss for _, loss in cache[3]] == [0.2, 0.5]
    assert not cosmic.cache_update(cache, 3, f + 2, 0.7, 2)        # worse than the worst: dropped
    assert cosmic.cache_update(cache, 3, f + 3, 0.1, 2)            # replaces the highest loss
    assert [loss for _, loss in cache[3]] == [0.1, 0.2]
    centres = cosmic.cache_centres(cache, 5, 2, f)
    torch.testing.assert_close(centres[3], torch.tensor([2.0, 2.0])) and centres[[0, 1, 2, 4]].abs().sum() == 0


def test_memory_centres_are_the_attention_weighted_memory_and_text():
    text = _unit(3, 4, seed=2)
    mem = DynamicMemory(3, 2)
    stored = _unit(2, 4, seed=3)
    mem.update(1, stored[0], 0.3)
    mem.update(1, stored[1], 0.2)
    x = _unit(4, seed=4)
    got = cosmic.memory_centres(x, mem, text, beta=5.5)
    values = [stored[0], stored[1], text[1]]
    want = F.normalize(sum(float(torch.exp(-5.5 * (1 - x @ v))) * v for v in values), dim=-1)
    torch.testing.assert_close(got[1], want, rtol=0, atol=1e-6)
    torch.testing.assert_close(got[0], text[0], rtol=0, atol=1e-6)   # no memory: the text feature


# -- the method ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model():
    return make_tiny_model(seed=2)


def _views(model, i: int) -> torch.Tensor:
    return model.normalize(torch.rand(8, 3, 64, 64, generator=torch.Generator().manual_seed(i)))


def test_clip_only_variant_runs_resumes_and_its_probabilities_sum_to_one(model):
    m = shiftlab.create_method("cosmic", model, NAMES, clip_shots=2, dino_model=None)
    outs = [m.predict_context(SampleContext(model, m.heads, _views(model, i))) for i in range(6)]
    state = m.state_dict()
    later = [m.predict_context(SampleContext(model, m.heads, _views(model, i))) for i in range(6, 9)]
    fresh = shiftlab.create_method("cosmic", model, NAMES, clip_shots=2, dino_model=None)
    fresh.load_state_dict(state)
    again = [fresh.predict_context(SampleContext(model, fresh.heads, _views(model, i))) for i in range(6, 9)]
    for a, b in zip(later, again):
        assert torch.equal(a.probs, b.probs) and a.extras == b.extras
    for out in outs:
        assert float(out.probs.sum()) == pytest.approx(1.0, abs=1e-6) and "dino_cliques" not in out.extras
    assert outs[-1].extras["memory_entries"] <= 2 * len(NAMES)


def test_dino_path_with_a_random_timm_dinov2(model):
    m = shiftlab.create_method("cosmic", model, NAMES, clip_shots=2, dino_shots=2, dino_pretrained="none",
                               dino_model="vit_small_patch14_reg4_dinov2")
    outs = [m.predict_context(SampleContext(model, m.heads, _views(model, i))) for i in range(4)]
    assert all("dino_cliques" in o.extras for o in outs) and len(m.dino_cache) >= 1
    feature = next(iter(m.dino_cache.values()))[0][0]
    assert feature.shape == (384,) and float(feature.norm()) == pytest.approx(1.0, abs=1e-5)
    no_dino = shiftlab.create_method("cosmic", model, NAMES, clip_shots=2, dino_shots=2, dino_pretrained="none",
                                     dino_model="vit_small_patch14_reg4_dinov2", dino_clique_weight=0.0)
    zero = [no_dino.predict_context(SampleContext(model, no_dino.heads, _views(model, i))) for i in range(4)]
    clip_only = shiftlab.create_method("cosmic", model, NAMES, clip_shots=2, dino_model=None)
    plain = [clip_only.predict_context(SampleContext(model, clip_only.heads, _views(model, i))) for i in range(4)]
    for a, b in zip(zero, plain):
        torch.testing.assert_close(a.probs, b.probs, rtol=0, atol=1e-6)
    assert any((a.probs - c.probs).abs().max() > 1e-4 for a, c in zip(zero, outs))


def test_the_dino_checkpoint_digest_is_in_the_run_identity(model, tmp_path):
    path = tmp_path / "dino.pth"
    path.write_bytes(b"not really weights")
    m = shiftlab.create_method("cosmic", model, NAMES, dino_pretrained=str(path))
    assert m.loaded_weights() == {"dino_checkpoint_sha256": hashlib.sha256(b"not really weights").hexdigest()}
    assert shiftlab.create_method("cosmic", model, NAMES, dino_model=None).loaded_weights() == {
        "dino_checkpoint_sha256": None}


# -- DINOv2 as a frozen encoding: computed once per sample, held by a feature store ---------------------------

def test_the_frozen_encoder_declaration_is_checked_at_registration():
    from shiftlab.methods.catalogue.declarations import FROZEN_ENCODER, FROZEN_FEATURES, OWN_TOWER, Capabilities
    from shiftlab.methods.kinds import OnlineMethod
    for reads in ((FROZEN_ENCODER,), (FROZEN_FEATURES, OWN_TOWER, FROZEN_ENCODER)):
        with pytest.raises(ValueError, match="'frozen_encoder' is read beside 'frozen_features' and never with"):
            Capabilities(reads=reads)
    assert Capabilities(reads=(FROZEN_FEATURES, FROZEN_ENCODER)).reads_frozen_encoder
    spec = cosmic.COSMIC.spec
    assert spec.capabilities.reads_frozen_encoder and not spec.needs_pixels and spec.reads_features
    module, qualname = spec.impl.split(":")
    body = {"spec": spec, "__module__": module, "__qualname__": qualname,
            "save_state": cosmic.COSMIC.save_state, "load_state": cosmic.COSMIC.load_state}
    with pytest.raises(TypeError, match="cosmic: a method reading a frozen encoder of its own .* must define "
                                        "frozen_encoder"):
        type(qualname, (OnlineMethod,), body)
    # and its spec says the encoder's identity under a config (what a run plan keys the store entry with)
    from shiftlab.methods.catalogue.declarations import MethodSpec
    with pytest.raises(TypeError, match="NoIdentitySpec: reads 'frozen_encoder' and must define "
                                        "frozen_encoder_identity"):
        type("NoIdentitySpec", (MethodSpec,), {"capabilities": Capabilities(reads=(FROZEN_FEATURES, FROZEN_ENCODER))})


def test_the_dino_key_is_its_checkpoint_digest_model_and_seed(model, tmp_path):
    a, b = tmp_path / "a.pth", tmp_path / "b.pth"
    a.write_bytes(b"weights one")
    b.write_bytes(b"weights two")

    def identity(**kw):
        return shiftlab.create_method("cosmic", model, NAMES, **kw).frozen_encoder().identity
    assert identity(dino_pretrained=str(a))["checkpoint_sha256"] == hashlib.sha256(b"weights one").hexdigest()
    ids = {json.dumps(identity(**kw), sort_keys=True) for kw in (
        {"dino_pretrained": str(a)}, {"dino_pretrained": str(b)}, {"dino_pretrained": "none"},
        {"dino_pretrained": "none", "dino_seed": 1}, {"dino_pretrained": "none", "dino_model": DINO_S})}
    assert len(ids) == 5                      # another checkpoint, seed or model: another store entry
    assert shiftlab.create_method("cosmic", model, NAMES, dino_model=None).frozen_encoder() is None


DINO_S = "vit_small_patch14_reg4_dinov2"


@pytest.mark.slow
def test_dino_features_come_from_the_store_and_the_records_are_identical(tmp_path, capsys):
    """`shiftlab encode` stores each image's DINOv2 feature beside its CLIP views; a run then decodes no image and
    encodes nothing, with the records of a run without the store; another DINOv2 seed is a miss; a damaged entry
    is refused in one warning line and encoded again."""
    from _runs import comparable, json_lines
    from _synthetic import make_image_folder
    from shiftlab import RunConfig, run
    from shiftlab.datasets import build_dataset
    from shiftlab.engine.features import encode
    from shiftlab.rundir.feature_store import FeatureStore
    tiny = make_tiny_model()
    data = build_dataset("imagefolder", make_image_folder(tmp_path / "data", ["cat", "dog", "car"], size=(40, 30)))
    cosmic_config = {"clip_shots": 1, "dino_shots": 1, "dino_pretrained": "none", "dino_model": DINO_S}

    def config(out, store=True, **dino):
        return RunConfig(dataset="imagefolder", methods=["cosmic"], method_config={"cosmic": {**cosmic_config, **dino}},
                         views=2, workers=0, progress=False, batch_size=2, out=str(tmp_path / out), device="cpu",
                         features=str(tmp_path / "fs") if store else None, features_dtype="fp32")
    run(config("plain", store=False), model=tiny, dataset=data)
    assert encode(config("unused"), model=tiny, dataset=data)["encoded"] == 3
    capsys.readouterr()
    run(config("stored"), model=tiny, dataset=data)
    assert "3 sample(s) read from the store" in capsys.readouterr().err
    reference = comparable(json_lines(tmp_path / "plain" / "records.jsonl"))
    assert comparable(json_lines(tmp_path / "stored" / "records.jsonl")) == reference
    (entry,) = [e for e in FeatureStore(tmp_path / "fs") if "encoder" in e.key]
    assert entry.key["encoder"]["model"] == DINO_S and entry.key["encoder"]["random_seed"] == 0
    assert entry.features(0).shape == (1, 384) and len(entry) == 3
    run(config("seed1", dino_seed=1), model=tiny, dataset=data)          # another DINOv2: nothing served
    assert "0 sample(s) read from the store" in capsys.readouterr().err
    (binary,) = entry.dir.glob("*.bin")
    damaged = bytearray(binary.read_bytes())
    damaged[7] ^= 0xFF
    binary.write_bytes(bytes(damaged))
    run(config("damaged"), model=tiny, dataset=data)
    err = capsys.readouterr().err
    assert err.count("is damaged or truncated") == 1 and "3 encoded and stored" in err
    assert comparable(json_lines(tmp_path / "damaged" / "records.jsonl")) == reference


def test_missing_dino_weights_say_what_to_download(model, tmp_path):
    m = shiftlab.create_method("cosmic", model, NAMES, dino_pretrained=str(tmp_path / "nope.pth"))
    with pytest.raises(ValueError) as err:
        m.predict_context(SampleContext(model, m.heads, _views(model, 0)))
    msg = str(err.value)
    assert "\n" not in msg and "dinov2_vitl14_reg4_pretrain.pth" in msg and "nope.pth" in msg


# -- golden: the authors' code ----------------------------------------------------------------------------------

VARIANTS = {"cosmic": 16, "cosmic_small": 1}


@pytest.fixture(scope="module")
def golden(golden_dir, one_thread_module):
    info = json.loads((golden_dir / "golden.json").read_text())
    model = shiftlab.load_model("shiftlab-tiny", str(golden_dir / "tiny_clip_openai.pt"))
    heads = ClassHeads(model, info["classnames"])
    views = stream_views(golden_dir, 8)
    results = {}
    for variant, shots in VARIANTS.items():
        expected = torch.load(FIXTURES / "cosmic" / f"{variant}.pt", weights_only=True)
        m = shiftlab.create_method("cosmic", model, info["classnames"], heads=heads, clip_shots=shots,
                                   dino_shots=shots, text_head="zeroshot", dino_pretrained="none",
                                   dino_model="vit_small_patch14_reg4_dinov2")
        got = []
        dino = m.frozen_encoder().id   # their DINOv2 features, replayed as the engine hands a stored one
        for i, v in enumerate(views):
            ctx = SampleContext(model, heads, model.normalize(v), encoded={dino: expected[f"{i}/dino_feature"]})
            out = m.predict_context(ctx)
            got.append({"out": out, "features": ctx.image_features.clone(),
                        "clip_cliques": [list(c) for c in m.clip_graph.cliques],
                        "dino_cliques": [list(c) for c in m.dino_graph.cliques],
                        "centres": cosmic.memory_centres(ctx.image_features[0], m.memory, heads.zeroshot, 5.5),
                        "clip_space_sim": _space_sim(torch.cat([heads.zeroshot, cosmic.memory_centres(
                            ctx.image_features[0], m.memory, heads.zeroshot, 5.5)]))})
        results[variant] = (expected, got)
    return results


def _space_sim(space: torch.Tensor) -> torch.Tensor:
    return space @ space.T


def _cliques(expected, key):
    flat, sizes = expected[key].tolist(), expected[key.replace("_cliques", "_clique_sizes")].tolist()
    out, start = [], 0
    for n in sizes:
        out.append(flat[start:start + n])
        start += n
    return out


@pytest.mark.golden
@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_sample_against_the_authors_code(golden, variant):
    expected, got = golden[variant]
    n_classes = 200
    failures = []
    for i, g in enumerate(got):
        out = g["out"]
        try:
            assert_close(g["features"], expected[f"{i}/clip_features"], FEATURES, f"{i}/clip_features")
            assert out.extras["pseudo_label"] == int(expected[f"{i}/pseudo_label"]), f"{i}/pseudo_label"
            assert out.extras["stored"] == bool(expected[f"{i}/stored"]), f"{i}/stored"
            assert out.extras["dino_cached"] == bool(expected[f"{i}/dino_cached"]), f"{i}/dino_cached"
            if f"{i}/centres" in expected:
                assert_close(g["centres"], expected[f"{i}/centres"], FEATURES, f"{i}/centres")
            for space in ("clip", "dino"):
                key = f"{i}/{space}_cliques"
                if key in expected:
                    want = sorted(sorted(c) for c in _cliques(expected, key))
                    assert sorted(sorted(c) for c in g[f"{space}_cliques"]) == want, key
                    if space == "clip":      # no similarity within FEATURES of the bisected threshold
                        sim = g["clip_space_sim"]
                        t = cosmic.degree_threshold(sim, 4.0)
                        off = sim[~torch.eye(sim.shape[0], dtype=torch.bool)]
                        check_margin(float((off - t).abs().min()), FEATURES, f"{key} threshold")
            clip_scores = expected[f"{i}/clip_scores"]
            score = (expected[f"{i}/zeroshot_probs"] + (clip_scores[:n_classes] + clip_scores[n_classes:]) / 2
                     + expected[f"{i}/dino_scores"])
            assert_close(out.probs, score / score.sum(), LOSS, f"{i}/probs")
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0])
    assert not failures, "\n".join(failures)

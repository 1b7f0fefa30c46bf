"""TCA: the token condensation, the reservoir, the refusals, and the authors' code (golden)."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FEATURES, LOGITS, assert_close, assert_top1_margin, fixture_tolerances, stream_views
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.methods.head_kinds import text_head
from shiftlab.methods.tca.condense import condensed_forward, coreset_merge
from shiftlab.methods.tca.method import Entry, add_to_reservoir, layer_weights, reservoir_logits

TCA_CACHE = fixture_tolerances("tca")["cache"]  # tests/fixtures/golden/tca/tolerances.json


def vit12_model() -> shiftlab.ClipModel:
    """The golden TCA model: shiftlab-tiny-vit with 12 blocks (their pruning blocks 3, 6, 9), seed 0, every weight
    rounded to float16 (their `clip.load` converts to half: exact on both sides)."""
    from shiftlab.models.architectures import builtin_configs
    cfg = json.loads(json.dumps(builtin_configs()["shiftlab-tiny-vit"]))
    cfg["vision_cfg"]["layers"] = 12
    model = shiftlab.load_model("shiftlab-tiny-vit12", None, model_config=cfg, seed=0)
    model.clip.load_state_dict({k: v.half().float() if v.is_floating_point() else v
                                for k, v in model.clip.state_dict().items()})
    return model


@pytest.fixture(scope="module")
def tiny_vit():
    return shiftlab.load_model("shiftlab-tiny-vit", None, seed=0)


def _image(model, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return model.normalize(torch.rand(1, 3, model.image_size, model.image_size, generator=gen))


def test_a_resnet_is_refused_in_one_line_before_and_at_load(tiny_model):
    from shiftlab.engine.config import RunConfig, settings_problem
    with pytest.raises(ValueError, match=r"^tca: runs on a ViT image tower only, and shiftlab-tiny is a ResNet: "):
        shiftlab.create_method("tca", tiny_model, ["a", "b"])
    problem = settings_problem(RunConfig(dataset="imagenet-r", model="RN50-quickgelu", methods=["tca"]))
    assert problem.startswith("tca: runs on a ViT image tower only, and RN50-quickgelu is a ResNet")
    assert "\n" not in problem
    assert settings_problem(RunConfig(dataset="imagenet-r", model="ViT-B-16", methods=["tca"])) is None


def test_condense_blocks_default_to_their_places_and_beyond_the_tower_are_refused(tiny_vit):
    assert shiftlab.create_method("tca", tiny_vit, ["a", "b"]).condense_blocks == (1, 2, 3)
    assert shiftlab.create_method("tca", vit12_model(), ["a", "b"]).condense_blocks == (3, 6, 9)   # theirs
    with pytest.raises(ValueError, match=r"^tca.condense_blocks: \(3, 6, 9\) must name distinct blocks of "
                                         r"shiftlab-tiny-vit's ViT, 0..3 \(None: "):
        shiftlab.create_method("tca", tiny_vit, ["a", "b"], condense_blocks=(3, 6, 9))


def test_without_condensing_or_cache_the_feature_is_the_towers_own(tiny_vit):
    # a drop rate removing no merged tokens still reorders tokens: compare the plain blocks' path instead, and that
    # the class tokens are each block's output class token
    x = _image(tiny_vit, 0)
    feats, cls = condensed_forward(tiny_vit.clip.visual, x, (), 0.1, 4, None, lambda n: 0)
    with torch.no_grad():
        assert_close(feats, tiny_vit.clip.encode_image(x), FEATURES, "feature")
        h = tiny_vit.clip.visual._embeds(x)
        for i, block in enumerate(tiny_vit.clip.visual.transformer.resblocks):
            h = block(h)
            assert_close(cls[:, i], h[:, 0], FEATURES, f"class token {i}")


def test_coreset_merge_against_a_direct_computation():
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randn(8, 5, generator=gen)
    merged = coreset_merge(tokens, 3, first=2)
    # greedy k-centre: 2, then the farthest from {2}, then the farthest from both
    d = torch.cdist(tokens, tokens)
    second = int(d[2].argmax())
    third = int(torch.minimum(d[2], d[second]).argmax())
    centres = [2, second, third]
    owner = d[:, centres].argmin(1)
    for k, c in enumerate(centres):
        members = (owner == k).nonzero().squeeze(1).tolist()
        w = torch.tensor([1.0 if m == c else 1 / float(d[m, c]) for m in members])
        want = (tokens[members] * (w / w.sum())[:, None]).sum(0)
        assert_close(merged[k], want, 1e-6, f"cluster {k}")


def test_reservoir_keeps_the_lowest_entropy_plus_similarity_sorted():
    gen = torch.Generator().manual_seed(1)
    entries = [Entry(torch.zeros(2), torch.tensor(h), torch.randn(3, 4, generator=gen)) for h in (0.5, 0.1, 0.9)]
    got = []
    for e in entries:
        got = add_to_reservoir(got, e, 2)
    # the third entry made 3: each one's score = entropy + mean cosine of its mean token to the other two
    means = F.normalize(torch.stack([e.tokens.mean(0) for e in entries]), dim=1)
    sim = means @ means.T
    score = [float(entries[i].entropy) + float((sim[i].sum() - 1) / 2) for i in range(3)]
    dropped = max(range(3), key=lambda i: score[i])
    want = sorted([e for i, e in enumerate(entries) if i != dropped], key=lambda e: float(e.entropy))
    assert [id(e) for e in got] == [id(e) for e in want]


def test_reservoir_logits_against_a_direct_computation():
    gen = torch.Generator().manual_seed(2)
    tokens, keys = torch.randn(4, 6, generator=gen), torch.randn(3, 4, 6, generator=gen)
    labels = torch.tensor([0, 2, 2])
    got = reservoir_logits(tokens, keys, labels, 3, layer_weights(4, 0.1), 3.0, 8.0)
    w = [torch.exp(torch.tensor(i / 3 / 0.1)) for i in range(4)]
    w = [float(x / sum(w)) for x in w]
    want = torch.zeros(3)
    for e in range(3):
        a = sum(w[layer] * float(F.cosine_similarity(tokens[layer], keys[e, layer], dim=0)) for layer in range(4))
        want[labels[e]] += 3.0 * torch.exp(torch.tensor(-8.0 * (1 - a)))
    assert_close(got, want, 1e-5, "reservoir logits")


def test_the_cache_engages_once_every_class_holds_two(golden_dir):
    # the golden model and stream (random images on the 4-block tiny ViT all land in one class)
    model = vit12_model()
    names = [json.loads((golden_dir / "golden.json").read_text())["classnames"][i] for i in (1, 3)]
    tca = shiftlab.create_method("tca", model, names, reservoir_size=2)
    for view in stream_views(golden_dir, 1)[:10]:
        tca.predict_context(SampleContext(model, tca.heads, model.normalize(view[:1])))
        full = all(len(entries) >= 2 for entries in tca.reservoir)
        assert (tca.cache is not None) == full   # and once full a class never drops below 2
    assert tca.cache is not None and tca.cache.shape == (2, 12, 64)
    assert_close(tca.cache[1], torch.stack([e.tokens for e in tca.reservoir[1]]).mean(0), 1e-6, "cache")


def test_stored_features_are_refused_in_one_line(tiny_vit):
    tca = shiftlab.create_method("tca", tiny_vit, ["a", "b"], condense_blocks=(1, 3))
    ctx = SampleContext(tiny_vit, tca.heads, torch.zeros(1, 3, 1, 1), image_features=torch.zeros(1, 32))
    ctx.views = None
    with pytest.raises(ValueError, match="needs view 0's pixels"):
        tca.predict_context(ctx)


# -- golden checks: the authors' code ------------------------------------------------------------------------

@pytest.mark.golden
def test_tca_is_their_code(golden_dir):
    from _golden import FIXTURES
    want = torch.load(FIXTURES / "tca" / "tca.pt", weights_only=True)
    info = json.loads((FIXTURES / "tca" / "tca.json").read_text())
    model = vit12_model()
    names = [json.loads((golden_dir / "golden.json").read_text())["classnames"][i] for i in info["classes"]]
    cfg = info["config"]
    tca = shiftlab.create_method("tca", model, names, heads=ClassHeads(model, names), precision="fp32",
                                 logit_scale=100.0, reservoir_size=cfg["reservoir_size"], scale=cfg["scale"],
                                 lambd=cfg["lambd"], beta=cfg["beta"])
    assert_close(text_head(tca), want["text"], FEATURES, "class head")
    centres = iter(want["centers"].tolist())
    tca.first_centers = lambda n: next(centres)
    views = [model.normalize(v[:1]) for v in stream_views(golden_dir, 1)]
    assert len(views) == info["n_samples"] == 24
    engaged = 0
    for i, view in enumerate(views):
        if f"{i}/cache" in want:
            engaged += 1
            assert tca.cache is not None, f"sample {i}: their cache is set, shiftlab's is not"
            assert_close(tca.cache, want[f"{i}/cache"], TCA_CACHE, f"sample {i}: class-token cache")
        else:
            assert tca.cache is None, f"sample {i}: shiftlab's cache is set, theirs is not"
        out = tca.predict_context(SampleContext(model, tca.heads, view))
        assert_close(out.logits, want[f"{i}/final"], LOGITS, f"sample {i}: final logits")
        assert_top1_margin(want[f"{i}/final"][None], LOGITS, f"sample {i}: prediction")
        assert int(out.logits.argmax()) == int(want[f"{i}/final"].argmax())
    assert engaged >= 12 and next(centres, None) is None   # the cache steered half the stream; every centre used


def test_cli_runs_tca_on_a_vit_and_refuses_a_resnet_in_one_line(tmp_path, capsys):
    from _runs import json_lines
    from _synthetic import make_imagenet_r
    from shiftlab.cli import main as cli_main
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 50), size=(48, 40))
    argv = ["run", "--dataset", "imagenet-r", "--data", str(data), "--workers", "0", "--no-progress",
            "--allow-partial", "--device", "cpu", "--methods", "tca"]
    assert cli_main([*argv, "--model", "shiftlab-tiny-vit", "--pretrained", "none", "--out", str(tmp_path / "r")]) == 0
    recs = [r for r in json_lines(tmp_path / "r" / "records.jsonl") if r.get("method") == "tca"]
    assert len(recs) == 4 and all("error" not in r for r in recs)
    capsys.readouterr()
    assert cli_main([*argv, "--model", "RN50-quickgelu", "--out", str(tmp_path / "x")]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == ["shiftlab run: error: tca: runs on a ViT image tower only, and RN50-quickgelu is a ResNet: it "
                   "condenses the ViT's patch tokens inside its blocks (their runner.py offers ViT-B/16 only)"]
    assert not (tmp_path / "x").exists()

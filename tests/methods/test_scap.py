"""SCAP: its pieces against straightforward computations, its state across a resume, the command line, and every
batch against its authors' main.py with scripts/R.sh's flags on the golden tiny ViT (tests/fixtures/golden/scap,
made by the driver beside the fixture)."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FIXTURES, LOGITS, PARAMS, assert_close, assert_top1_margin, fixture_tolerances, stream_views
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.methods.scap.method import cliques, negative_weight
from shiftlab.methods.scap.prompts import prompted_block, prompted_image_features
from shiftlab.methods.scap.spec import SCAPConfig

SCAP_PROMPTS = fixture_tolerances("scap")["prompts"]  # tests/fixtures/golden/scap/tolerances.json

pytestmark = pytest.mark.usefixtures("one_thread")
CLASSNAMES = ["cat", "dog", "car", "tree", "boat", "bird"]


@pytest.fixture(scope="module")
def vit():
    return shiftlab.load_model("shiftlab-tiny-vit", None, seed=0)


def _batches(model, heads, n_batches: int, size: int = 4, views: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    pixels = model.normalize(torch.rand(n_batches * size, views, 3, model.image_size, model.image_size, generator=g))
    return [[SampleContext(model, heads, pixels[i]) for i in range(b * size, (b + 1) * size)] for b in range(n_batches)]


def test_the_prompt_is_an_extra_key_and_value_after_the_class_token(vit):
    """One block by hand: softmax(q k^T / sqrt(d)) v with the prompt's key and value as a second position."""
    block = vit.clip.visual.transformer.resblocks[1]
    g = torch.Generator().manual_seed(1)
    x, prompt = torch.randn(2, 5, 64, generator=g), torch.randn(2, 64, generator=g)
    attn = block.attn
    wq, wk, wv = attn.in_proj_weight.chunk(3)
    bq, bk, bv = attn.in_proj_bias.chunk(3)
    h = block.ln_1(x)
    keys = torch.cat([h[:, :1], prompt[:1].expand(2, 1, 64), h[:, 1:]], dim=1)
    values = torch.cat([h[:, :1], prompt[1:].expand(2, 1, 64), h[:, 1:]], dim=1)
    weights = ((h @ wq.T + bq) @ (keys @ wk.T + bk).transpose(1, 2) / math.sqrt(64)).softmax(-1)
    y = x + attn.out_proj(weights @ (values @ wv.T + bv))
    want = y + block.mlp(block.ln_2(y))
    with torch.no_grad():
        assert_close(prompted_block(block, x, prompt), want, 1e-5, "prompted block")
        # no prompted block: the tower's own pooled feature
        pixels = vit.normalize(torch.rand(2, 3, 64, 64, generator=g))
        plain = prompted_image_features(vit.clip.visual, pixels, prompt[None], [])
        assert_close(plain, vit.clip.visual(pixels), 1e-5, "unprompted tower")


def test_cliques_follow_their_rule():
    # class 0: images 0, 1, 3 (0 and 1 alike, 3 apart); class 2: images 2, 4 (alike: the whole class, no clique)
    f = F.normalize(torch.tensor([[1.0, 0.0], [0.99, 0.1], [0.0, 1.0], [0.0, -1.0], [0.05, 1.0]]), dim=1)
    groups, classes = cliques(f, [0, 0, 2, 0, 2], 0.9)
    assert groups == [[0, 1, 3], [0, 1], [0, 1], [2, 4]] and classes == [0, 0, 0, 2]


def test_a_negative_weight_reads_the_logarithms_of_the_logits():
    logits = torch.tensor([[2.0, 3.0, 0.5]])
    want = float((logits * logits.log()).sum() - logits.sum() * math.log(3.0))
    assert float(negative_weight(logits, 1)) == pytest.approx(want)
    assert math.isnan(float(negative_weight(torch.tensor([[2.0, -1.0]]), 0)))   # then `w0 > 1` is False: skipped


@pytest.mark.slow
def test_a_resumed_state_continues_exactly_and_the_shared_model_is_untouched(vit):
    heads = ClassHeads(vit, CLASSNAMES)
    before = {k: v.clone() for k, v in vit.clip.state_dict().items()}
    config = dict(views=4, selection_p=0.25, clique_threshold=0.5, templates=("a photo of a CLS", "art of a CLS"))
    batches = _batches(vit, heads, 3)
    ref = shiftlab.create_method("scap", vit, CLASSNAMES, heads=heads, **config)
    fresh = ref.state_dict()
    ref.adapt_batch(batches[0])
    state = ref.state_dict()
    want = [[o.logits for o in ref.adapt_batch(b)] for b in batches[1:]]
    resumed = shiftlab.create_method("scap", vit, CLASSNAMES, heads=heads, **config)
    resumed.load_state_dict(state)
    got = [[o.logits for o in resumed.adapt_batch(b)] for b in batches[1:]]
    assert all(torch.equal(a, b) for x, y in zip(got, want) for a, b in zip(x, y))
    assert state["optimizer"] is not None and state["retention_classes"]     # AdamW's moments and retention carried
    assert not torch.equal(state["image_prompt"], fresh["image_prompt"])
    assert all(torch.equal(v, before[k]) for k, v in vit.clip.state_dict().items())
    ref.reset()
    assert torch.equal(ref.image_prompt.detach(), fresh["image_prompt"]) and not ref.retention


def test_bad_values_are_refused_in_one_line(vit, tiny_model):
    with pytest.raises(ValueError, match=r"^scap: shiftlab-tiny-vit: scap.prompt_layers \(7,\) must name distinct "
                                         r"blocks of its ViT, 0..3$"):
        shiftlab.create_method("scap", vit, CLASSNAMES, prompt_layers=(7,))
    with pytest.raises(ValueError, match="runs on a ViT image tower only"):
        shiftlab.create_method("scap", tiny_model, CLASSNAMES)
    with pytest.raises(ValueError, match="selection_p"):
        shiftlab.create_method("scap", vit, CLASSNAMES, selection_p=0)
    with pytest.raises(ValueError, match=r"^scap.templates: every template must hold the class name's place, CLS"):
        shiftlab.create_method("scap", vit, CLASSNAMES, templates=("a photo of a {}",))


@pytest.mark.slow
def test_cli_runs_it_on_batches_in_its_own_block(tmp_path):
    from _runs import json_lines
    from _synthetic import make_imagenet_r
    from shiftlab.cli import main as cli_main
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 50), size=(48, 40))
    argv = ["run", "--dataset", "imagenet-r", "--data", str(data), "--workers", "0", "--no-progress",
            "--allow-partial", "--device", "cpu", "--methods", "scap", "--batch-size", "2", "--views", "4",
            "--set", "scap.selection_p=0.25", "--model", "shiftlab-tiny-vit", "--pretrained", "none"]
    assert cli_main([*argv, "--out", str(tmp_path / "r")]) == 0
    recs = [r for r in json_lines(tmp_path / "r" / "records.jsonl") if r.get("method") == "scap"]
    assert len(recs) == 4 and all("error" not in r for r in recs)
    saved = json.loads((tmp_path / "r" / "run.json").read_text())
    assert saved["config"]["reads_ahead"] == {"scap": "batch"} and saved["shared"]["batch_size"] == 2


# -- against their code ----------------------------------------------------------------------------------------

def test_the_fixture_ran_r_sh_with_only_the_tiny_run_changed():
    info = json.loads((FIXTURES / "scap" / "scap.json").read_text())
    argv, cfg = info["argv"], SCAPConfig()

    def flag(name: str) -> str:
        return next(a.split("=", 1)[1] for a in argv if a.startswith(name + "=")) if f"{name}=" in " ".join(argv) \
            else argv[argv.index(name) + 1]
    assert tuple(t.replace("_", " ") for t in flag("--ctx_init").split(",")) == cfg.templates
    assert float(flag("--ensemble_rate")) == cfg.ensemble_rate and float(flag("--w_prompt")) == cfg.w_prompt
    assert float(flag("--text_prompt_ema_w")) == cfg.text_ema_w
    assert float(flag("--image_prompt_ema_w")) == cfg.image_ema_w
    assert float(flag("--text_prompt_ema_one_weight_h")) == cfg.text_ema_h == float(flag("--image_prompt_ema_h"))
    assert float(flag("--w_step")) == cfg.w_step and flag("--use_group") == "1" and flag("--reset_to_retention") == "1"
    # the tiny run's changes: 20 views, batches of 8, a clique threshold the tiny ViT's similar features can pass
    assert flag("-b") == "20" and flag("--batch_num") == "8" and flag("--image_feature_threshold") == "0.97"


def _golden_model(variant: str, golden_vit, golden_dir, tmp_path):
    """The golden tiny ViT, with the logit scale of CLIP (100) for the variant run so (the driver's --variant)."""
    model = golden_vit[0]
    if variant == "scap":
        return model
    from _golden import VIT_MODEL_FILE
    state = torch.load(golden_dir / VIT_MODEL_FILE, weights_only=True)
    state["logit_scale"] = torch.full_like(state["logit_scale"], math.log(100.0))
    torch.save(state, tmp_path / "scale100.pt")
    return shiftlab.load_model("shiftlab-tiny-vit", str(tmp_path / "scale100.pt"))


@pytest.mark.golden
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["scap", "scap_scale100"])
def test_every_batch_as_their_code(variant, golden_vit, golden_dir, tmp_path):
    model = _golden_model(variant, golden_vit, golden_dir, tmp_path)
    info = json.loads((FIXTURES / "scap" / f"{variant}.json").read_text())
    want = torch.load(FIXTURES / "scap" / f"{variant}.pt", map_location="cpu", weights_only=True)
    names, size = info["classes"], info["batch_size"]
    heads = ClassHeads(model, names)
    scap = shiftlab.create_method("scap", model, names, heads=heads, views=info["n_views"], clique_threshold=0.97)
    assert torch.equal(scap.image_prompt.detach(), want["init_prompt"][0])      # the same seeded draw
    seen = {}
    tune = scap.tune_cliques

    def record(base, groups, classes):
        seen["groups"], seen["classes0"] = [list(g) for g in groups], list(classes)
        seen["shadow_before"] = scap.text_shadow.clone()
        tune(base, groups, classes)
        seen["classes"], seen["shadow_after"] = classes, scap.text_shadow.clone()
    scap.tune_cliques = record
    views = [model.normalize(v) for v in stream_views(golden_dir, info["n_views"])]
    moved: list[bool] = []
    for b in range(info["n_images"] // size):
        outs = scap.adapt_batch([SampleContext(model, heads, v) for v in views[b * size:(b + 1) * size]])
        sizes = want[f"b{b}/subgroup_sizes"].tolist()
        flat = want[f"b{b}/subgroups"].tolist()
        groups = [flat[sum(sizes[:k]):sum(sizes[:k + 1])] for k in range(len(sizes))]
        assert seen["groups"] == groups and seen["classes0"] == want[f"b{b}/subgroup_preds0"].tolist(), f"batch {b}"
        assert seen["classes"] == want[f"b{b}/subgroup_preds"].tolist(), f"batch {b}: clique classes after tuning"
        # their update_dart_text_ema: the clique steps (and the negatives' pushes) added to the text EMA
        assert_close(seen["shadow_after"], want[f"b{b}/text_shadow_after_groups"], PARAMS, f"batch {b}: clique EMA")
        moved.append(not torch.equal(seen["shadow_after"], seen["shadow_before"]))
        assert sorted(scap.retention) == want[f"b{b}/retention_classes"].tolist()
        assert [scap.retention_t[c] for c in sorted(scap.retention)] == want[f"b{b}/retention_t"].tolist()
        assert_close(torch.stack([scap.retention[c] for c in sorted(scap.retention)]),
                     want[f"b{b}/retention_prompts"][:, 0], SCAP_PROMPTS, f"batch {b}: retention prompts")
        for i, out in enumerate(outs):
            s = b * size + i
            assert_close(out.logits, want[f"s{s}/logits"], LOGITS, f"image {s}: logits")
            assert_top1_margin(want[f"s{s}/logits"][None], LOGITS, f"image {s}: prediction")
            assert int(out.logits.argmax()) == int(want[f"s{s}/logits"].argmax())
        assert_close(scap.image_prompt.detach(), want[f"b{b}/image_prompt"][0], SCAP_PROMPTS,
                     f"batch {b}: image prompt")
        assert_close(scap.text_prompt.detach(), want[f"b{b}/text_prompt"], PARAMS, f"batch {b}: text prompt")
        assert_close(scap.text_shadow, want[f"b{b}/text_shadow"], PARAMS, f"batch {b}: text EMA")
        assert_close(scap.image_shadow, want[f"b{b}/image_shadow"][:, 0], SCAP_PROMPTS, f"batch {b}: image EMA")
    # the stream exercised what it must: sub-cliques, a second class, the retention's running mean; with CLIP's
    # logit scale, cliques of two classes, one the other's negative: the clique phase moved the text EMA
    assert max(len(want[f"b{b}/subgroup_sizes"]) for b in range(3)) > 2
    assert len({int(want[f"s{s}/logits"].argmax()) for s in range(info["n_images"])}) > 1
    assert max(scap.retention_t.values()) > 2
    if variant == "scap_scale100":
        assert all(moved) and all(len(set(want[f"b{b}/subgroup_preds"].tolist())) > 1 for b in range(2))

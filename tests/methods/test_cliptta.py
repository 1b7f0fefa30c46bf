"""CLIPTTA and its OOD-aware variant: the pieces against straightforward computations, the state (memory,
threshold, optimiser) resumed exactly, the shared model untouched, a run through the CLI, and the authors' own
code on the golden stream (tests/fixtures/golden/cliptta, made by the driver beside the fixtures from
github.com/MarcLafon/cliptta's `CLIPTTA` class, float32 on the CPU).

Golden: 3 continual batches of 8 through shiftlab's own tiny ViT encoder (the same weights): every step's loss
(CLIPTTA_LOSS), every batch's cosine logits and scores (FEATURES), the adapted norm parameters and the Otsu
threshold (NORM_PARAMS), the memory's labels exactly and its confidences (FEATURES).
"""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FEATURES, NORM_PARAMS, assert_close, fixture_tolerances, stream_views
from shiftlab.methods.cliptta.method import ConfidentMemory, contrastive_loss, otsu_loss
from shiftlab.methods.common.ood_scores import ood_scores
from shiftlab.methods.context import ClassHeads, SampleContext

CLIPTTA_LOSS = fixture_tolerances("cliptta")["loss"]  # tests/fixtures/golden/cliptta/tolerances.json

CLASSNAMES = ["cat", "dog", "car", "tree", "boat", "house"]
BATCH = 8

pytestmark = pytest.mark.usefixtures("one_thread")


def _unit(*shape: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


# -- the pieces ---------------------------------------------------------------------------------------

def test_soft_and_hard_contrastive_losses_are_the_straightforward_ones():
    features, head = _unit(5, 8, seed=0), _unit(4, 8, seed=1)
    pred = [int((f @ head.T).argmax()) for f in features]
    logits = [[30.0 * float(features[i] @ head[pred[j]]) for j in range(5)] for i in range(5)]
    soft = hard = 0.0
    for i, row in enumerate(logits):
        z = sum(math.exp(v) for v in row)
        probs = [math.exp(v) / z for v in row]
        soft += -sum(p * math.log(p) for p in probs) / 5
        hard += -math.log(probs[i]) / 5
    assert float(contrastive_loss(features, head, 30.0, "soft")) == pytest.approx(soft, abs=1e-5)
    assert float(contrastive_loss(features, head, 30.0, "hard")) == pytest.approx(hard, abs=1e-5)
    assert float(contrastive_loss(features[:0], head, 30.0, "soft")) == 0.0   # no image: no term


def test_scores_and_otsu_loss_are_the_straightforward_ones():
    cos = _unit(3, 6, seed=2)
    probs = (2.0 * cos).softmax(-1)
    assert torch.allclose(ood_scores(cos, "max_prob", 2.0), probs.max(-1).values)
    assert torch.allclose(ood_scores(cos, "max_log_prob", 2.0), probs.max(-1).values.log())
    assert torch.allclose(ood_scores(cos, "entropy", 2.0), (probs * probs.log()).sum(-1))
    scores, alpha = torch.tensor([0.1, 0.2, 0.9, 1.0]), torch.tensor([0.5])
    w = [1 / (1 + math.exp(-(s - 0.5) / 0.1)) for s in scores.tolist()]
    mu_in = sum(a * s for a, s in zip(w, scores.tolist())) / sum(w)
    mu_out = sum((1 - a) * s for a, s in zip(w, scores.tolist())) / sum(1 - a for a in w)
    p_in = sum(w) / 4
    assert float(otsu_loss(scores, alpha, 0.1, "avg_contrastive")) == pytest.approx(-(mu_in - mu_out) ** 2, abs=1e-6)
    assert float(otsu_loss(scores, alpha, 0.1, "max_inter_var")) == pytest.approx(
        -p_in * (1 - p_in) * (mu_in - mu_out) ** 2, abs=1e-6)


def test_memory_keeps_the_most_confident_per_class_and_draws_from_its_own_generator():
    memory = ConfidentMemory(n_classes=3, num_shots=2, sample_size=3, seed=5)
    images = torch.arange(6.0).view(6, 1, 1, 1).expand(6, 3, 2, 2)
    memory.update(images, torch.tensor([0, 0, 0, 1, 2, 2]), torch.tensor([0.1, 0.9, 0.5, 0.3, 0.2, 0.4]))
    assert memory.images[0][:, 0, 0, 0].tolist() == [1.0, 2.0]          # the two most confident of class 0
    assert len(memory) == 5 and memory.confidences[1].tolist() == [pytest.approx(0.3)]
    first = memory.sample()                          # one per class (3 // 3): a random one of class 0 and 2
    assert first.shape == (3, 3, 2, 2) and first[1, 0, 0, 0] == 3.0
    state = memory.state()
    again = ConfidentMemory(n_classes=3, num_shots=2, sample_size=3, seed=99)
    again.load(state)
    assert torch.equal(memory.sample(), again.sample())     # the generator resumes where it was


# -- the method ---------------------------------------------------------------------------------------

def _batches(model, heads, n_batches: int, size: int = 4, seed: int = 0) -> list[list[SampleContext]]:
    g = torch.Generator().manual_seed(seed)
    pixels = model.normalize(torch.rand(n_batches * size, 3, model.image_size, model.image_size, generator=g))
    return [[SampleContext(model, heads, pixels[i:i + 1]) for i in range(b * size, (b + 1) * size)]
            for b in range(n_batches)]


@pytest.mark.parametrize("name", ["cliptta", "cliptta_ood"])
def test_a_resumed_state_continues_exactly_and_the_shared_model_is_untouched(name, tiny_model):
    heads = ClassHeads(tiny_model, CLASSNAMES)
    before = {k: v.clone() for k, v in tiny_model.clip.state_dict().items()}
    config = dict(steps=2, lr=1e-2, num_shots=2, sample_size=6)
    batches = _batches(tiny_model, heads, 3)
    ref = shiftlab.create_method(name, tiny_model, CLASSNAMES, heads=heads, **config)
    ref.adapt_batch(batches[0])
    state = ref.state_dict()
    want = [[o.logits for o in ref.adapt_batch(b)] for b in batches[1:]]
    resumed = shiftlab.create_method(name, tiny_model, CLASSNAMES, heads=heads, **config)
    resumed.load_state_dict(state)
    got = [[o.logits for o in resumed.adapt_batch(b)] for b in batches[1:]]
    assert all(torch.equal(a, b) for x, y in zip(got, want) for a, b in zip(x, y))
    assert state["extra"]["memory"]["classes"].numel() > 0           # the memory is part of the state
    assert all(torch.equal(v, before[k]) for k, v in tiny_model.clip.state_dict().items())
    # the norm parameters moved; a reset brings back the initial ones, an empty optimiser state and memory
    initial = shiftlab.create_method(name, tiny_model, CLASSNAMES, heads=heads, **config).tower.norm_state()
    assert any(not torch.equal(initial[k], v) for k, v in ref.tower.norm_state().items())
    ref.reset()
    assert all(torch.equal(initial[k], v) for k, v in ref.tower.norm_state().items())
    assert len(ref.memory) == 0 and not ref.optimizer.state


def test_ood_aware_records_its_own_score_and_which_images_it_adapted_on(tiny_model):
    heads = ClassHeads(tiny_model, CLASSNAMES)
    method = shiftlab.create_method("cliptta_ood", tiny_model, CLASSNAMES, heads=heads, steps=1, num_shots=1)
    batch = _batches(tiny_model, heads, 1, size=6)[0]
    outs = method.adapt_batch(batch)
    cos = torch.stack([o.logits for o in outs]) / tiny_model.logit_scale
    want = (cos.softmax(-1).max(-1).values).log()                 # max_log_prob at ood_logit_scale 1
    assert [o.extras["ood_score"] for o in outs] == pytest.approx(want.tolist(), abs=1e-6)
    assert [o.ood_score for o in outs] == [o.extras["ood_score"] for o in outs]     # recorded as own_ood_score
    judged = [o.extras["judged_id"] for o in outs]
    assert judged == [s > float(method.alpha.detach()) for s in want.tolist()] and 0 < sum(judged) < len(judged)


def test_bad_values_are_refused_in_one_line(tiny_model):
    with pytest.raises(ValueError, match=r"cliptta\.num_shots"):
        shiftlab.create_method("cliptta", tiny_model, CLASSNAMES, num_shots=0)
    with pytest.raises(ValueError, match=r"cliptta\.targets"):
        shiftlab.create_method("cliptta", tiny_model, CLASSNAMES, targets="medium")


# -- golden: their CLIPTTA class on the tiny ViT ---------------------------------------------------------

# variant -> shiftlab's config for the flags their driver ran (tests/fixtures/golden/cliptta/driver.py)
GOLDEN = {"cliptta": ("cliptta", dict(steps=10, lr=1e-3, num_shots=2, sample_size=400)),
          "cliptta_ood": ("cliptta_ood", dict(steps=10, lr=1e-3, num_shots=1, sample_size=200)),
          "cliptta_hard": ("cliptta", dict(steps=3, lr=1e-3, targets="hard", mean_entropy_weight=0.1, memory=False))}



@pytest.mark.golden
def test_the_fixtures_ran_their_scripts_flags():
    from _golden import FIXTURES
    info = json.loads((FIXTURES / "cliptta" / "cliptta.json").read_text())
    assert info["reference"]["commit"] == "f4221f4f2b3bfbd220f8836411bbd3774758933d"
    for variant, (name, config) in GOLDEN.items():
        args = info["fixtures"][variant]["arguments"]
        assert args["adaptation"] == "cliptta" and not args["episodic"] and args["optimizer_type"] == "adam"
        assert args["steps"] == config["steps"] and args["lr"] == config["lr"] and args["logit_scale"] == 100.0
        assert args["use_memory"] == config.get("memory", True)
        assert args["use_softmax_entropy"] == (config.get("targets", "soft") == "soft")
        assert args["use_ood_loss"] == args["detect_ood"] == args["update_alpha"] == (name == "cliptta_ood")
        if name == "cliptta_ood":
            assert args["score_type"] == "max_log_prob" and args["loss_ood_type"] == "avg_contrastive"


@pytest.mark.golden
@pytest.mark.slow
@pytest.mark.parametrize("variant", list(GOLDEN))
def test_every_batch_as_their_code(variant, golden_vit, golden_dir):
    from _golden import FIXTURES
    model, names, heads = golden_vit
    want = torch.load(FIXTURES / "cliptta" / f"{variant}.pt", weights_only=True)
    assert_close(heads.zeroshot, want["prototypes"], FEATURES, "text head")
    name, config = GOLDEN[variant]
    method = shiftlab.create_method(name, model, names, heads=heads, precision="fp32", logit_scale=100.0, **config)
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    for b in range(len(views) // BATCH):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[b * BATCH:(b + 1) * BATCH]])
        theirs = want[f"{b}/losses"]
        finite = torch.isfinite(theirs)       # their loss is NaN when no image passes the threshold (README)
        assert_close(torch.tensor(method.losses)[finite], theirs[finite], CLIPTTA_LOSS, f"{b} losses")
        assert_close(torch.stack([o.logits for o in outs]) / 100.0, want[f"{b}/logits"], FEATURES, f"{b} logits")
        assert_close(torch.tensor([o.extras["ood_score"] for o in outs]), want[f"{b}/scores"], FEATURES, f"{b} scores")
        params = torch.cat([p.detach().reshape(-1) for p in method.tower.adapted_parameters()])
        assert_close(params, want[f"{b}/params"], NORM_PARAMS, f"{b} norm parameters")
        if name == "cliptta_ood":
            assert_close(method.alpha.detach(), want[f"{b}/alpha"], NORM_PARAMS, f"{b} threshold")
        if config.get("memory", True):
            labels = [k for k in sorted(method.memory.images) for _ in range(len(method.memory.images[k]))]
            assert labels == want[f"{b}/memory_labels"].tolist()
            conf = torch.cat([method.memory.confidences[k] for k in sorted(method.memory.images)])
            assert_close(conf, want[f"{b}/memory_confidences"], FEATURES, f"{b} memory confidences")
    if variant == "cliptta":   # the state moved the predictions: batch 2 is not predicted as batch 0 was
        assert len(set(want["2/logits"].argmax(-1).tolist())) > 1


# -- through the command line ---------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_runs_both_on_batches(tmp_path, tiny_checkpoint):
    from _runs import json_lines
    from _synthetic import make_imagenet_r
    from shiftlab.cli import main as cli_main
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 25), per_class=2, size=(80, 64))
    flags = ["--dataset", "imagenet-r", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained",
             str(tiny_checkpoint), "--workers", "0", "--no-progress", "--allow-partial", "--batch-size", "4",
             "--methods", "cliptta,cliptta_ood", "--set", "cliptta.steps=2", "--set", "cliptta.num_shots=2",
             "--set", "cliptta_ood.steps=2"]
    assert cli_main(["run", *flags, "--out", str(tmp_path / "run")]) == 0
    records = json_lines(tmp_path / "run" / "records.jsonl")
    assert len(records) == 32 and {r["method"] for r in records} == {"cliptta", "cliptta_ood"}
    assert max(r["extras"]["memory"] for r in records if r["method"] == "cliptta") >= 2
    saved = json.loads((tmp_path / "run" / "run.json").read_text())
    assert saved["shared"]["batch_size"] == 4 and saved["methods"]["cliptta"]["steps"] == 2
    assert saved["methods"]["cliptta_ood"]["ood_aware"] is True

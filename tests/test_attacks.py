"""Robust accuracy: PGD (checked against torchattacks), 8-bit quantisation in the eps-ball, determinism, end to end."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from shiftlab.attacks import (
    ZeroShotClassifier,
    attack_seed,
    build_attack,
    eps_255,
    list_attacks,
    pgd_linf,
    quantize,
    register_attack,
)
from shiftlab.cli import main as cli_main
from shiftlab.datasets import build_dataset
from shiftlab.engine.config import RunConfig
from shiftlab.engine.loop import run
from shiftlab.engine.step import Evaluator
from shiftlab.methods.base import list_methods
from shiftlab.rundir import record_files
from shiftlab.synthetic import make_imagenet_r, random_image, tiny_clip
from shiftlab.views.generator import ViewConfig, ViewGenerator

CLASSNAMES = ["cat", "dog", "car", "tree", "boat", "house"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def evaluator():
    return Evaluator(tiny_clip(0), CLASSNAMES, ["zeroshot"])


@pytest.fixture(scope="module")
def samples():
    """Five samples: (ids, clean uint8 views (8, 3, 64, 64), labels, view generator)."""
    gen = ViewGenerator(ViewConfig(n_views=8, size=64), seed=3)
    ids = [11, 12, 13, 14, 15]
    views = [gen(random_image((96, 72), seed=i), i) for i in ids]
    return ids, views, [i % len(CLASSNAMES) for i in ids], gen


def _build(spec, evaluator):
    """The attack as the engine builds it: from the model and its zero-shot class head."""
    return build_attack(spec, evaluator.model, evaluator.heads.zeroshot)


# -- registry and config -------------------------------------------------------------------

def test_registry_and_config_errors(evaluator):
    assert "pgd" in list_attacks()
    assert _build({"name": "none"}, evaluator) is None
    attack = _build({"name": "pgd", "eps": 4 / 255}, evaluator)
    cfg = attack.config
    assert (attack.name, cfg.eps, cfg.alpha, cfg.steps, cfg.random_start, cfg.quantize) == \
        ("pgd", 4 / 255, 1 / 255, 7, True, "round")
    with pytest.raises(ValueError, match="unknown attack 'fgsm'"):
        _build({"name": "fgsm"}, evaluator)
    with pytest.raises(ValueError, match="quantize"):
        _build({"name": "pgd", "quantize": "ceil"}, evaluator)
    with pytest.raises(ValueError, match="eps"):
        _build({"name": "pgd", "eps": -1.0}, evaluator)
    with pytest.raises(TypeError, match="pgd"):
        _build({"name": "pgd", "epsilon": 1.0}, evaluator)
    with pytest.raises(ValueError, match="already registered"):
        register_attack("pgd")(type("Other", (), {}))


# -- quantisation --------------------------------------------------------------------------

def test_quantize_round_vs_truncate():
    clean = torch.tensor([10, 10, 10, 10, 0, 255], dtype=torch.uint8)
    x = torch.tensor([10.6, 10.4, 9.6, 9.4, 0.0, 1.0 * 255], dtype=torch.float32) / 255
    assert quantize(x, clean, 1 / 255, "round").tolist() == [11, 10, 10, 9, 0, 255]
    assert quantize(x, clean, 1 / 255, "truncate").tolist() == [10, 10, 9, 9, 0, 255]
    # no perturbation: both modes give back the clean image exactly, for every grey level
    grey = torch.arange(256, dtype=torch.uint8)
    for mode in ("round", "truncate"):
        assert torch.equal(quantize(grey.float() / 255, grey, 0.0, mode), grey)


def test_quantize_clips_to_the_eps_ball_in_8bit_units():
    assert [eps_255(e) for e in (0.0, 1 / 255, 4 / 255, 0.01, 16 / 255)] == [0, 1, 4, 2, 16]
    clean = torch.full((4,), 100, dtype=torch.uint8)
    eps = 0.01  # 2.55 grey levels: a pixel moved by the full eps rounds to 3 levels, outside the ball
    x = (clean.double() + torch.tensor([2.55, -2.55, 2.4, -1.0])) / 255
    assert torch.round(x * 255).tolist() == [103, 97, 102, 99]   # plain rounding leaves the ball
    assert quantize(x, clean, eps, "round").tolist() == [102, 98, 102, 99]
    assert quantize(x, clean, eps, "truncate").tolist() == [102, 98, 102, 99]
    # float error at an integer radius: c/255 - 4/255 in float32 (as PGD computes it) lands just below
    # (c - 4)/255 for some grey levels c, and truncation alone would then step 5 levels
    grey = torch.arange(256, dtype=torch.uint8)
    x = grey.float() / 255
    lowest = torch.clamp(x + torch.clamp(torch.full_like(x, -0.5), -4 / 255, 4 / 255), 0, 1)
    assert ((torch.floor(lowest * 255) - grey.float()).abs() > 4).any()
    for mode in ("round", "truncate"):
        q = quantize(lowest, grey, 4 / 255, mode)
        assert (q.int() - grey.int()).abs().max() <= 4
        assert torch.equal(q.int(), (grey.int() - 4).clamp(min=0))  # the ball's lower face, exactly
    # and the range: values outside [0, 1] never wrap around
    ends = torch.tensor([0, 255], dtype=torch.uint8)
    assert quantize(torch.tensor([-0.01, 1.01]), ends, 4 / 255).tolist() == [0, 255]


# -- the PGD wrapper -----------------------------------------------------------------------

class LinearTwoClass(nn.Module):
    """logits = W x: the cross-entropy gradient's sign is -sign(w_y - w_other), so PGD's effect is exact."""

    def __init__(self, shape=(3, 8, 8)):
        super().__init__()
        self.linear = nn.Linear(int(torch.tensor(shape).prod()), 2, bias=False)
        with torch.no_grad():
            generator = torch.Generator().manual_seed(0)
            self.linear.weight.copy_(torch.randn(2, self.linear.in_features, generator=generator))

    def forward(self, x):
        return self.linear(x.flatten(1))


@pytest.mark.slow
def test_pgd_on_a_linear_model_lowers_the_margin_by_the_full_budget():
    model = LinearTwoClass()
    x = torch.full((1, 3, 8, 8), 0.5)
    y = torch.tensor([1])
    d = (model.linear.weight[1] - model.linear.weight[0]).detach()

    def margin(img):
        with torch.no_grad():
            out = model(img)[0]
        return float(out[1] - out[0])

    eps = 4 / 255
    # without random start, 4 steps of eps/4 reach the corner x - eps * sign(d): margin drops by eps * |d|_1
    adv = pgd_linf(model, x, y, eps=eps, alpha=eps / 4, steps=4, random_start=False)
    torch.testing.assert_close(adv, x - eps * d.sign().view_as(x))
    assert margin(adv) == pytest.approx(margin(x) - eps * float(d.abs().sum()), rel=1e-5)
    # with random start (uniform in the ball) and 7 steps of eps/4, every pixel ends >= 0.75 eps along -sign(d)
    torch.manual_seed(0)
    adv = pgd_linf(model, x, y, eps=eps, alpha=eps / 4, steps=7, random_start=True)
    assert (adv - x).abs().max() <= eps + 1e-7
    assert margin(adv) <= margin(x) - 0.75 * eps * float(d.abs().sum()) + 1e-4
    # eps = 0: the input comes back unchanged
    assert torch.equal(pgd_linf(model, x, y, eps=0.0, alpha=0.0, steps=7, random_start=True), x)


def test_pgd_on_tiny_clip_raises_the_true_class_loss(evaluator, samples):
    ids, views, labels, _ = samples
    model = evaluator.model
    clf = ZeroShotClassifier(model, evaluator.heads.zeroshot, model.logit_scale)
    x = torch.stack([v[0] for v in views]).float() / 255
    y = torch.tensor(labels)
    with torch.no_grad():
        logits = clf(x)
        ref = model.logit_scale * model.encode_pixels(x) @ evaluator.heads.zeroshot.T
    torch.testing.assert_close(logits, ref)  # the attacked model is zero-shot CLIP with the initial prompt
    eps = 4 / 255
    adv = pgd_linf(clf, x, y, eps=eps, alpha=eps / 4, steps=7, random_start=False)
    q = torch.stack([quantize(a, v[0], eps) for a, v in zip(adv, views)]).float() / 255
    with torch.no_grad():
        before = F.cross_entropy(clf(x), y, reduction="none")
        after = F.cross_entropy(clf(adv), y, reduction="none")
        after_q = F.cross_entropy(clf(q), y, reduction="none")
    assert (after > before).all() and (after_q > before).all()
    assert not model.training


@pytest.mark.parametrize("random_start", [False, True])
def test_pgd_is_torchattacks_pgd_bit_for_bit(evaluator, samples, random_start):
    # the authors' code (R-TPT) runs torchattacks.PGD; shiftlab's own PGD must give its images exactly,
    # on the same process and seed (both draw the random start from the global RNG the same way)
    torchattacks = pytest.importorskip("torchattacks")
    ids, views, labels, _ = samples
    model = evaluator.model
    clf = ZeroShotClassifier(model, evaluator.heads.zeroshot, model.logit_scale)
    x = torch.stack([v[0] for v in views]).float() / 255
    y = torch.tensor(labels)
    eps = 4 / 255
    torch.manual_seed(5)
    ours = pgd_linf(clf, x, y, eps=eps, alpha=eps / 4, steps=3, random_start=random_start)
    torch.manual_seed(5)
    ref = torchattacks.PGD(clf, eps=eps, alpha=eps / 4, steps=3, random_start=random_start)
    ref.set_device(x.device)
    with torch.enable_grad():
        theirs = ref(x, y).detach()
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, x) and not model.training


# -- perturb: bounds, views, determinism ----------------------------------------------------

@pytest.mark.parametrize("eps,mode", [(1 / 255, "round"), (0.01, "round"), (0.01, "truncate"), (4 / 255, "truncate")])
def test_perturb_stays_in_the_8bit_eps_ball(evaluator, samples, eps, mode):
    ids, views, labels, gen = samples
    attack = _build({"name": "pgd", "eps": eps, "steps": 3, "quantize": mode}, evaluator)
    adv_views, info = attack.perturb(ids, views, labels, gen)
    assert set(info) == set(ids)
    for sid, clean, adv in zip(ids, views, adv_views):
        assert adv.dtype == torch.uint8 and adv.shape == clean.shape
        linf = int((adv[0].int() - clean[0].int()).abs().max())
        assert linf <= eps_255(eps) and info[sid]["linf_255"] == linf
        assert linf == eps_255(eps)  # the budget is used (random start + sign steps)
        assert set(info[sid]) == {"name", "eps", "steps", "flipped", "linf_255"}
        assert (info[sid]["name"], info[sid]["eps"], info[sid]["steps"]) == ("pgd", eps, 3)
        assert isinstance(info[sid]["flipped"], bool)
        # all views come from the adversarial base view, with the clean run's per-sample seed
        from PIL import Image
        pil = Image.fromarray(adv[0].permute(1, 2, 0).numpy())
        assert torch.equal(gen(pil, sid), adv)
        assert not torch.equal(adv[1:], clean[1:])


def test_perturb_is_deterministic_per_sample(evaluator, samples):
    ids, views, labels, gen = samples
    attack = _build({"name": "pgd", "eps": 4 / 255, "steps": 2}, evaluator)
    state = torch.get_rng_state()
    full, info_full = attack.perturb(ids, views, labels, gen)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is forked, not consumed
    order = [3, 0, 4]
    part, info_part = attack.perturb([ids[i] for i in order], [views[i] for i in order],
                                     [labels[i] for i in order], gen)
    for j, i in enumerate(order):
        assert torch.equal(part[j], full[i]) and info_part[ids[i]] == info_full[ids[i]]
    # the random start depends on (run seed, sample id): another run seed gives another image
    other = _build({"name": "pgd", "eps": 4 / 255, "steps": 2, "seed": 99}, evaluator)
    assert not torch.equal(other.perturb(ids[:1], views[:1], labels[:1], gen)[0][0][0], full[0][0])
    assert attack_seed(3, 11) != attack_seed(3, 12) and attack_seed(3, 11) != attack_seed(4, 11)


def test_eps_zero_returns_the_clean_views(evaluator, samples):
    ids, views, labels, gen = samples
    # a clean image that already has the model's size, so that its base view is the image itself
    square = [gen(random_image((64, 64), seed=i), i) for i in ids]
    attack = _build({"name": "pgd", "eps": 0.0}, evaluator)
    adv, info = attack.perturb(ids, square, labels, gen)
    assert all(torch.equal(a, s) for a, s in zip(adv, square))
    assert all(i["linf_255"] == 0 and not i["flipped"] for i in info.values())


# -- end to end ------------------------------------------------------------------------------

def _by_key(recs):
    return {(r["id"], r["method"], r["setting"]): r for r in recs}


@pytest.mark.slow
def test_eps_zero_run_reproduces_the_clean_run_exactly(tmp_path):
    # 64x64 images (the tiny model's size): the base view is the image, so the views of the
    # adversarial base view are the clean views (see docs/ROBUSTNESS.md).
    data = make_imagenet_r(tmp_path / "data", classes=[0, 7, 42], per_class=2, size=(64, 64))
    cfg = RunConfig(data=str(data), methods=["zeroshot", "tpt", "mta", "view_ensemble"], views=8, seed=5,
                    out=str(tmp_path / "run"), device="cpu", workers=0, batch_size=4, progress=False,
                    attack={"name": "pgd", "eps": 0.0, "alpha": 0.0, "steps": 7, "random_start": True,
                            "quantize": "truncate"}, clean_and_robust=True)
    summary = run(cfg, model=tiny_clip(0), dataset=build_dataset("imagenet-r", data))
    recs = _by_key(record_files.load_records(Path(cfg.out)))
    assert len(recs) == 6 * 4 * 2
    keep = ("pred", "top5", "confidence", "true_prob", "correct", "extras")
    for (sid, method, setting), rec in recs.items():
        if setting == "pgd":
            clean = recs[(sid, method, "clean")]
            assert {k: rec[k] for k in keep} == {k: clean[k] for k in keep}
            assert rec["attack"] == {"name": "pgd", "eps": 0.0, "steps": 7, "flipped": False, "linf_255": 0}
    for m in summary["methods"].values():
        assert m["robust"]["top1"] == m["top1"] and m["robust"]["ece"] == m["ece"]
    assert summary["attack"]["success_rate"] == 0.0


@pytest.mark.slow
def test_cli_clean_and_robust_run(tmp_path, tiny_checkpoint):
    data = make_imagenet_r(tmp_path / "data", classes=[3, 50, 120], per_class=2, size=(90, 70))
    out = tmp_path / "run"
    argv = ["run", "--allow-partial", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained",
            str(tiny_checkpoint),
            "--methods", "zeroshot,tpt,mta", "--views", "8", "--workers", "0", "--batch-size", "4",
            "--device", "cpu", "--no-progress", "--out", str(out),
            "--attack", "pgd", "--eps", "4/255", "--steps", "2", "--clean-and-robust"]
    assert cli_main(argv) == 0
    recs = record_files.load_records(out)
    assert not [r for r in recs if "error" in r]
    assert {(r["method"], r["setting"]) for r in recs} == {(m, s) for m in ("zeroshot", "tpt", "mta")
                                                            for s in ("clean", "pgd")}
    assert len(recs) == 6 * 3 * 2
    for r in recs:
        if r["setting"] == "clean":
            assert "attack" not in r
        else:
            a = r["attack"]
            assert (a["name"], a["eps"], a["steps"]) == ("pgd", 4 / 255, 2) and 0 <= a["linf_255"] <= 4
    # `flipped` is the zero-shot prediction change between the clean and the adversarial base view
    by = _by_key(recs)
    for sid in {r["id"] for r in recs}:
        assert by[(sid, "zeroshot", "pgd")]["attack"]["flipped"] == \
            (by[(sid, "zeroshot", "pgd")]["pred"] != by[(sid, "zeroshot", "clean")]["pred"])
    # one attack per sample: every method's record of a sample carries the same attack info
    for sid in {r["id"] for r in recs}:
        assert len({json.dumps(r["attack"], sort_keys=True) for r in recs if r["id"] == sid and "attack" in r}) == 1
    summary = json.loads((out / "summary.json").read_text())
    flips = {r["id"]: r["attack"]["flipped"] for r in recs if "attack" in r}
    assert summary["attack"]["name"] == "pgd" and summary["attack"]["eps"] == pytest.approx(4 / 255)
    assert summary["attack"]["quantize"] == "round" and summary["attack"]["alpha"] == pytest.approx(1 / 255)
    assert summary["attack"]["success_rate"] == pytest.approx(100 * sum(flips.values()) / 6)
    assert summary["attack"]["n"] == 6
    for name in ("zeroshot", "tpt", "mta"):
        m = summary["methods"][name]
        want = [r["correct"] for r in recs if r["method"] == name and r["setting"] == "pgd"]
        assert m["robust"]["setting"] == "pgd" and m["robust"]["n"] == 6 and m["n"] == 6
        assert m["robust"]["top1"] == pytest.approx(100 * sum(want) / 6)
    md = (out / "summary.md").read_text()
    assert "robust top-1" in md and "success rate on zero-shot" in md and "clean images not scored" not in md
    # resume: nothing left to do, same records
    assert cli_main(argv + ["--resume"]) == 0
    assert len(record_files.load_records(out)) == len(recs)


EPISODIC = list_methods(kind="episodic")


@pytest.fixture(scope="module")
def clean_and_robust_runs(tmp_path_factory, one_thread_module) -> dict[str, tuple[dict, list[dict]]]:
    """{method: (the summary of its run, its records)}: every episodic method scores the clean and the attacked
    images of one run, all of them in the same run (one PGD attack per image, as `--methods all` does), each
    with its spec's small test config; a method bound to ViTs (its spec's `towers`) in a run of its own on the
    tiny ViT."""
    import shiftlab
    from _records import small_config
    from shiftlab.methods.catalogue.declarations import spec
    root = tmp_path_factory.mktemp("robust")
    data = make_imagenet_r(root / "data", classes=[3, 50, 120], per_class=1, size=(72, 64))
    vit_only = [n for n in EPISODIC if "resnet" not in spec(n).towers]
    groups = [(names, arch) for names, arch in (([n for n in EPISODIC if n not in vit_only], "shiftlab-tiny"),
                                                 (vit_only, "shiftlab-tiny-vit")) if names]
    out: dict[str, tuple[dict, list[dict]]] = {}
    for names, arch in groups:
        model = tiny_clip(0) if arch == "shiftlab-tiny" else shiftlab.load_model(arch, None, seed=0)
        cfg = RunConfig(data=str(data), model=arch, methods=names, views=8, workers=0, progress=False, seed=1,
                        device="cpu", out=str(root / arch),
                        method_config={n: small_config(n) for n in names},
                        attack={"name": "pgd", "eps": 1 / 255, "alpha": 1 / 1020, "steps": 1}, clean_and_robust=True)
        summary = run(cfg, model=model, dataset=build_dataset("imagenet-r", data))
        assert summary["attack"]["n"] == 3
        records = record_files.load_records(root / arch)
        assert [r for r in records if r["method"] not in names] == []   # no error outside a method's records
        out.update({n: (summary, [r for r in records if r["method"] == n]) for n in names})
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", EPISODIC)
def test_every_episodic_method_scores_clean_and_robust_accuracy_and_ece_in_one_pass(name, clean_and_robust_runs):
    """Each episodic method (the tuners too: TTL through its own LoRA tower, RLCF with its reward model)
    scores the clean and the attacked images of one run: top-1 and ECE for both settings, no error. One run
    holds every method (the engine's path is the same for each; what differs, the method, is in the run)."""
    summary, records = clean_and_robust_runs[name]
    entry = summary["methods"][name]
    assert entry["n"] == 3 and 0 <= entry["ece"] <= 100
    assert entry["robust"]["setting"] == "pgd" and entry["robust"]["n"] == 3 and 0 <= entry["robust"]["ece"] <= 100
    assert sorted(r["setting"] for r in records) == ["clean"] * 3 + ["pgd"] * 3
    assert [r for r in records if "error" in r] == []


def test_the_pgd_function_is_not_shadowed_by_the_attack_folder():
    # attacks/pgd/ is a subpackage: once spec discovery imports it, `shiftlab.attacks.pgd` is that module, so
    # the function has a name of its own (a suite importing the specs first got "'module' object is not callable")
    code = ("import shiftlab.attacks.pgd.spec; from shiftlab.attacks import pgd_linf; "
            "import shiftlab.attacks as a; print(callable(pgd_linf), callable(a.pgd_linf))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.split() == ["True", "True"]

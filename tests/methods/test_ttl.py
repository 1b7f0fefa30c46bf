"""TTL's own properties: episodic reset, the shared model left untouched, the LoRA attention's maths,
the towers it adapts and refuses (the golden checks below compares it with the authors' code).

Golden checks (marked `golden`): TTL against its authors' own code on the tiny ViT
(tests/fixtures/golden/online, ttl*.pt).

tools/golden/make_golden.py (driver tests/fixtures/golden/ttl/driver.py) ran
Razaimam45/TTL-Test-Time-Low-Rank-Adaptation's
`ttl.py` as a script with the arguments of scripts/test_ttl.sh, float32 on the CPU, on the tiny ViT CLIP
(`shiftlab-tiny-vit`, 4 blocks: `--layer_range 1,3`, the last 3 as 9,11 are ViT-B/16's), 64 views of
the stream's samples: `ttl` one step on 4 samples; `ttl_steps` `--tta_steps 2` on 2 samples (their DeYO
loop inside their step loop: 2 x 2 = 4 AdamW steps). The fixtures hold their Xavier-drawn LoRA A (every
block; B is 0), the first step's view logits and entropies, every step's loss, gradients and LoRA
weights after it, and the final logits of view 0. shiftlab starts from their A (`TTL.set_initial_lora`).

Each step is checked from their weights before it (loss, gradients), the optimizer by feeding it their
gradients (the weights after each step), and the whole run end to end (final logits; the weights after
a first step, within what the gradient tolerance allows: see `first_step_tolerance`). Comparing every
step end to end instead would compound the first step's few free entries (gradients that nearly
cancel) into the next steps' small A gradients.

Tolerances: tests/_golden.py (logits LOGITS, entropies and losses LOSS, LoRA weights PARAMS, gradients
GRAD_RTOL relative to their largest entry). Predictions exactly, after a margin check."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import shiftlab
from _golden import (
    GRAD_RTOL,
    LOGITS,
    LOSS,
    PARAMS,
    TUNED_LOGITS,
    assert_close,
    assert_top1_margin,
    online_fixture,
    stream_views,
)
from shiftlab.datasets.classes import classnames_for_wnids, imagenet_r_wnids
from shiftlab.methods.common.confidence import entropy
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.methods.ttl.method import weighted_entropy_loss
from shiftlab.models.lora_tower import LoRAAttention, LoRATower, attention_layers
from shiftlab.synthetic import tiny_vit

NAMES = classnames_for_wnids(imagenet_r_wnids()[:20])


@pytest.fixture(scope="module")
def vit():
    return tiny_vit(0)


def _views(model, seed: int, n: int = 8) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return model.normalize(torch.rand(n, 3, model.image_size, model.image_size, generator=gen))


def _snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.clip.state_dict().items()}


@pytest.mark.parametrize("which", ["vit", "resnet"])
def test_a_b_a_gives_a_twice_and_the_shared_model_is_untouched(which, vit, tiny_model):
    model = vit if which == "vit" else tiny_model
    before, features = _snapshot(model), model.encode_views(_views(model, 9))
    ttl = shiftlab.create_method("ttl", model, NAMES)
    initial = ttl.tower.lora_state()
    a, b = _views(model, 1), _views(model, 2)
    first = ttl.predict(a)
    second = ttl.predict(b)
    assert torch.equal(ttl.predict(a), first) and not torch.equal(first, second)
    after = ttl.tower.lora_state()                     # restored after every image
    assert all(torch.equal(after[k], v) for k, v in initial.items())
    assert all(torch.equal(v, before[k]) for k, v in _snapshot(model).items())
    assert torch.equal(model.encode_views(_views(model, 9)), features)
    assert not any(p.requires_grad or p.grad is not None for p in model.clip.parameters())


@pytest.mark.parametrize("which", ["vit", "resnet"])
def test_the_tower_is_the_shared_weights_and_adapts_what_it_says(which, vit, tiny_model):
    model = vit if which == "vit" else tiny_model
    ttl = shiftlab.create_method("ttl", model, NAMES)
    shared = {id(t) for t in list(model.clip.visual.parameters()) + list(model.clip.visual.buffers())}
    lora = {id(p) for p in ttl.tower.lora_parameters()}
    own = [n for n, p in ttl.tower.named_parameters() if id(p) not in shared | lora]
    assert not own                                     # no copied weight: only the LoRA matrices are its own
    want = ["transformer.resblocks.1.attn", "transformer.resblocks.2.attn", "transformer.resblocks.3.attn"] \
        if which == "vit" else ["attnpool"]            # the last 3 blocks; a ResNet's one attention layer
    assert ttl.tower.layer_names == want
    assert all(p.shape in ((16, 64), (64, 16)) for p in ttl.tower.lora_parameters()) or which == "resnet"
    assert len(ttl.tower.lora_parameters()) == 4 * len(want)


@pytest.mark.parametrize("which", ["vit", "resnet"])
def test_without_steps_it_is_the_frozen_models_zero_shot(which, vit, tiny_model):
    model = vit if which == "vit" else tiny_model
    heads = ClassHeads(model, NAMES)
    ttl = shiftlab.create_method("ttl", model, NAMES, heads=heads, steps=0)
    ctx = SampleContext(model, heads, _views(model, 3))
    torch.testing.assert_close(ttl.predict_context(ctx).logits, ctx.zeroshot_logits, rtol=0, atol=1e-4)
    tuned = shiftlab.create_method("ttl", model, NAMES, heads=heads).predict_context(ctx).logits
    assert float((tuned - ctx.zeroshot_logits).abs().max()) > 1e-3     # one step changes the prediction


@pytest.mark.parametrize("batch_first", [True, False])
def test_lora_attention_is_attention_with_the_updated_q_and_v(batch_first):
    torch.manual_seed(0)
    d, heads, rank, scaling = 32, 4, 3, 2.0
    base = nn.MultiheadAttention(d, heads, batch_first=batch_first).eval()
    adapted = LoRAAttention(base, rank, scaling)
    with torch.no_grad():
        for lr in (adapted.q, adapted.v):
            lr.A.normal_()
            lr.B.normal_(std=0.1)
    merged = copy.deepcopy(base)
    with torch.no_grad():
        merged.in_proj_weight[:d] += scaling * adapted.q.B @ adapted.q.A
        merged.in_proj_weight[2 * d:] += scaling * adapted.v.B @ adapted.v.A
    x = torch.randn((2, 5, d) if batch_first else (5, 2, d))
    mask = torch.zeros(5, 5).masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    for attn_mask in (None, mask):
        got, _ = adapted(x, x, x, need_weights=False, attn_mask=attn_mask)
        want, _ = merged(x, x, x, need_weights=False, attn_mask=attn_mask)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert not torch.allclose(adapted(x, x, x)[0], base(x, x, x, need_weights=False)[0], atol=1e-3)
    with pytest.raises(ValueError, match="self-attention only"):
        adapted(x, torch.randn_like(x), x)


def test_lora_layers_counts_from_the_last_block_and_stops_at_the_first(vit):
    assert LoRATower(vit.clip, 1, 4, 8.0).layer_names == ["transformer.resblocks.3.attn"]
    assert len(LoRATower(vit.clip, 12, 4, 8.0).layer_names) == 4


def test_a_tower_without_attention_is_refused_in_one_line():
    model = tiny_vit(0)                                # its own instance: its tower is replaced below
    model.clip.visual = nn.Sequential(nn.Flatten(), nn.LazyLinear(32))
    assert attention_layers(model.clip.visual) == []
    with pytest.raises(ValueError) as info:
        shiftlab.create_method("ttl", model, NAMES)
    message = str(info.value)
    assert message.startswith("ttl: shiftlab-tiny-vit: its image tower (Sequential) has no attention layer")
    assert "\n" not in message


def test_the_initial_lora_is_seeded_and_can_be_given(vit):
    a = shiftlab.create_method("ttl", vit, NAMES).tower.lora_state()
    b = shiftlab.create_method("ttl", vit, NAMES).tower.lora_state()
    c = shiftlab.create_method("ttl", vit, NAMES, init_seed=1).tower.lora_state()
    key = "transformer.resblocks.3.attn.q.A"
    assert torch.equal(a[key], b[key]) and not torch.equal(a[key], c[key])
    assert not any(v.any() for k, v in a.items() if k.endswith(".B"))
    std = float(a[key].std())
    assert abs(std - (2 / (64 + 16)) ** 0.5) < 0.03          # Xavier normal of a (16, 64) matrix
    ttl = shiftlab.create_method("ttl", vit, NAMES)
    ttl.set_initial_lora(c)
    assert torch.equal(ttl.tower.lora_state()[key], c[key])
    with pytest.raises(ValueError, match="initial LoRA state must have the keys"):
        ttl.set_initial_lora({key: c[key]})


def test_no_view_below_the_entropy_bound_means_no_step(vit):
    heads = ClassHeads(vit, NAMES)
    ctx = SampleContext(vit, heads, _views(vit, 4))
    ttl = shiftlab.create_method("ttl", vit, NAMES, heads=heads, max_entropy=1e-9)
    out = ttl.predict_context(ctx)
    assert out.extras == {"kept_views": 0}
    torch.testing.assert_close(out.logits, ctx.zeroshot_logits, rtol=0, atol=1e-4)


@pytest.mark.slow
def test_a_run_with_a_feature_store_decodes_ttls_samples(tmp_path, vit):
    from shiftlab.datasets import build_dataset
    from shiftlab.engine.config import RunConfig
    from shiftlab.engine.loop import run
    from shiftlab.rundir import record_files
    from shiftlab.synthetic import make_imagenet_r
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 100), per_class=1, size=(80, 64))

    def go(out: str, **kw):
        run(RunConfig(methods=["zeroshot", "ttl"], views=8, out=str(tmp_path / out), workers=0, progress=False,
                      **kw), model=vit, dataset=build_dataset("imagenet-r", data))
        return {(r["id"], r["method"]): {k: v for k, v in r.items() if k != "seconds"}
                for r in record_files.iter_records(tmp_path / out / "records.jsonl")}

    plain = go("plain")
    assert go("stored", features=str(tmp_path / "fs"), features_dtype="fp32") == plain
    assert len(plain) == 4 and all("error" not in r for r in plain.values())


def test_a_ttl_only_step_encodes_nothing_and_keeps_its_records(tmp_path, vit):
    """TTL encodes its views through its own tower: a step of TTL alone skips the frozen encoding (no
    `encode` phase, no features computed), and its records are those of a step that encodes them for
    zero-shot beside it."""
    from shiftlab.datasets import build_dataset
    from shiftlab.engine.phases import PhaseTimer
    from shiftlab.engine.step import Evaluator, Runner, StepContext, view_generators
    from shiftlab.synthetic import make_imagenet_r
    dataset = build_dataset("imagenet-r", make_imagenet_r(tmp_path, classes=[0, 100], per_class=1, size=(80, 64)))

    def step(methods: list[str]) -> tuple[dict, dict, list]:
        timer = PhaseTimer()
        ev = Evaluator(vit, dataset.classnames, methods, run_views={"n_views": 8})
        seen = []
        original = ev.methods["ttl"].predict_context
        ev.methods["ttl"].predict_context = lambda ctx: seen.append("image_features" in ctx.__dict__) or original(ctx)
        runner = Runner(StepContext(ev, dataset, view_generators(ev.methods, vit.preprocess, 0), timer=timer))
        records = {r.to_dict()["id"]: r.to_dict() for r in runner.step(runner.load([0, 1])) if r.method == "ttl"}
        return {k: {f: v for f, v in r.items() if f != "seconds"} for k, r in records.items()}, timer.seconds, seen

    alone, phases, seen = step(["ttl"])
    together, phases_together, seen_together = step(["zeroshot", "ttl"])
    assert "encode" not in phases and "encode" in phases_together
    assert seen == [False, False] and seen_together == [True, True]
    assert alone == together and len(alone) == 2 and all("error" not in r for r in alone.values())


def test_a_method_that_reads_no_features_reads_pixels():
    from shiftlab.methods import get_method_class, list_methods
    for name in list_methods():
        cls = get_method_class(name).spec
        assert cls.reads_features or cls.needs_pixels, name
    assert not get_method_class("ttl").spec.reads_features


# -- golden checks: the authors' code --------------------------------------------------------------------------

TUNED = (1, 2, 3)       # --layer_range 1,3: shiftlab's lora_layers=3 of the tiny ViT's 4 blocks
CASES = [("ttl", s, 1) for s in range(4)] + [("ttl_steps", s, 4) for s in range(2)]
# End to end (`predict_context`): AdamW's first step is lr * g / (|g| + eps), so the few entries whose
# gradient nearly cancels (|g| ~ 1e-7, float32 error ~1e-8) land anywhere in +-lr (first_step_tolerance)
# and every later step starts from them: measured 8.8e-5 on the final logits after one step, 1.0e-4 after
# four. Each step on its own is held to LOGITS / LOSS / GRAD_RTOL / PARAMS from their weights
# (test_every_step_from_their_weights); end to end TUNED_LOGITS, and the prediction exactly (margins >= 3.7).
END_TO_END_LOGITS = TUNED_LOGITS



def _ours(key: str) -> str:
    """'layers.3.q.A' (their block 3's q_proj.lora_A) -> shiftlab's LoRATower key."""
    _, block, proj, mat = key.split(".")
    return f"transformer.resblocks.{block}.attn.{proj}.{mat}"


def _theirs(want: dict, prefix: str) -> dict[str, torch.Tensor]:
    """Their LoRA weights of the tuned blocks under `prefix` ('init/', '0/step0/after/'), in shiftlab's keys."""
    return {_ours(k[len(prefix):]): v for k, v in want.items()
            if k.startswith(prefix) and int(k[len(prefix):].split(".")[1]) in TUNED}


def _ttl(golden_vit, want: dict, **config):
    model, names, heads = golden_vit
    ttl = shiftlab.create_method("ttl", model, names, heads=heads, precision="fp32", **config)
    ttl.set_initial_lora(_theirs(want, "init/"))
    return ttl


def _grads(ttl) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in zip(ttl.tower.lora_state(), ttl.tower.lora_parameters())}


def assert_grads(got: dict[str, torch.Tensor], want: dict, key: str) -> None:
    ref = _theirs(want, f"{key}/grad/")
    assert len(ref) == 12                          # A and B of q and v in each of the 3 tuned blocks
    for name, g in ref.items():
        err = float((got[name] - g).abs().max())
        assert err <= GRAD_RTOL * max(float(g.abs().max()), 1e-12), f"{key} {name} gradient: {err:.3g}"


def first_step_tolerance(grad: torch.Tensor, lr: float = 5e-3, eps: float = 1e-8) -> torch.Tensor:
    """Per entry, how far AdamW's first step, -lr * g / (|g| + eps), can move when g moves by the
    gradient tolerance d = GRAD_RTOL * max|g|: lr * eps * d / (|g| - d + eps)^2 (the largest slope on
    [|g| - d, |g| + d]; at most 2 lr), plus PARAMS. The step is lr * sign(g) only where |g| >> eps: an
    entry whose gradient nearly cancels (|g| ~ 1e-7, float32 error ~1e-8) is free up to 2 lr."""
    d = GRAD_RTOL * float(grad.abs().max())
    near = (grad.abs() - d).clamp_min(0) + eps
    return PARAMS + (lr * eps * d / near ** 2).clamp_max(2 * lr)


@pytest.mark.golden
@pytest.mark.usefixtures("one_thread")
def test_the_fixture_ran_their_recipe(golden_dir):
    want, info = online_fixture(golden_dir, "ttl")
    argv = dict(zip(info["argv"][1::2], info["argv"][2::2]))
    assert argv["--lr"] == "5e-3" and argv["--rank"] == "16" and argv["--tta_steps"] == "1"
    assert argv["--init_method"] == "xavier" and argv["--lora_encoder"] == "image" and argv["--layer_range"] == "1,3"
    assert info["hf_model_asked"] == ["openai/clip-vit-base-patch16"]
    assert info["check_hf_vs_vendored_clip_image_features_max_abs"] < 1e-5     # their HF tower is the file's ViT
    # their untuned block 0 has LoRA too, but B = 0 there: it changes nothing
    assert not any(want[f"init/layers.0.{p}.B"].any() for p in "qv")


@pytest.mark.golden
@pytest.mark.usefixtures("one_thread")
def test_text_head_is_theirs(golden_vit, golden_dir):
    want, _ = online_fixture(golden_dir, "ttl")
    assert_close(golden_vit[2].zeroshot, want["text_features"], 1e-5, "'a photo of a {}.' head")


@pytest.mark.golden
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("fixture, sample, steps", CASES)
def test_every_step_from_their_weights(golden_vit, golden_dir, fixture, sample, steps):
    want, info = online_fixture(golden_dir, fixture)
    assert int(want[f"{sample}/steps"]) == steps          # --tta_steps 2: DeYO's 2 steps in each of 2
    views = golden_vit[0].normalize(stream_views(golden_dir, info["n_views"])[sample])
    ttl = _ttl(golden_vit, want, steps=steps)
    cfg = ttl.config
    for step in range(steps):
        key = f"{sample}/step{step}"
        ttl.tower.load_lora_state(_theirs(want, "init/" if step == 0 else f"{sample}/step{step - 1}/after/"))
        params = ttl.tower.lora_parameters()
        for p in params:
            p.grad = None
        with torch.enable_grad():
            view_logits = ttl._logits(views)
            loss, kept = weighted_entropy_loss(view_logits, cfg.margin, cfg.max_entropy)
            loss.backward()
        if step == 0:
            assert_close(view_logits, want[f"{key}/view_logits"], LOGITS, f"{key} view logits")
            assert_close(entropy(view_logits.detach()), want[f"{key}/entropy"], LOSS, f"{key} view entropies")
        assert float(loss.detach()) == pytest.approx(float(want[f"{key}/loss"]), abs=LOSS), key
        assert kept == int(want[f"{key}/kept"]) == info["n_views"]
        assert_grads(_grads(ttl), want, key)
    # the optimizer: fed their gradients, AdamW as configured gives their weights after every step
    ttl.tower.load_lora_state(_theirs(want, "init/"))
    optimizer = ttl.make_optimizer(params)
    for step in range(steps):
        key = f"{sample}/step{step}"
        by_name = dict(zip(ttl.tower.lora_state(), params))
        for name, g in _theirs(want, f"{key}/grad/").items():
            by_name[name].grad = g.clone()
        optimizer.step()
        for name, value in _theirs(want, f"{key}/after/").items():
            assert_close(ttl.tower.lora_state()[name], value, PARAMS, f"{key} {name} after the step")
    with torch.no_grad():       # the readout: view 0 through their adapted weights
        final = ttl._logits(views[:1])[0]
    assert_close(final, want[f"{sample}/logits"], LOGITS, "view 0 through their adapted weights")
    if steps > 1:   # from the second step on A trains too (its first gradient is 0 while B is 0)
        first_a = want[f"{sample}/step1/grad/layers.3.q.A"]
        assert not want[f"{sample}/step0/grad/layers.3.q.A"].any() and float(first_a.abs().max()) > 0


@pytest.mark.golden
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("fixture, sample, steps", CASES)
def test_end_to_end(golden_vit, golden_dir, fixture, sample, steps):
    want, info = online_fixture(golden_dir, fixture)
    model, _, heads = golden_vit
    views = model.normalize(stream_views(golden_dir, info["n_views"])[sample])
    ttl = _ttl(golden_vit, want, steps=steps)
    out = ttl.predict_context(SampleContext(model, heads, views))
    tol = END_TO_END_LOGITS
    assert_close(out.logits, want[f"{sample}/logits"], tol, f"view 0 after {steps} step(s), end to end")
    assert_top1_margin(want[f"{sample}/logits"], tol, "their prediction")
    assert int(out.logits.argmax()) == int(want["predictions"][sample])
    assert out.extras["kept_views"] == info["n_views"]
    assert out.extras["loss"] == pytest.approx(float(want[f"{sample}/step0/loss"]), abs=LOSS)
    assert len(ttl.last_losses) == steps
    # the adaptation moved the prediction: not merely the zero-shot logits passing
    assert float((want[f"{sample}/logits"] - want[f"{sample}/step0/view_logits"][0]).abs().max()) > 100 * LOGITS
    if steps == 1:
        ttl.adapt(views)
        after = ttl.tower.lora_state()
        for name, value in _theirs(want, f"{sample}/step0/after/").items():
            tol = first_step_tolerance(_theirs(want, f"{sample}/step0/grad/")[name])
            diff = (after[name] - value).abs()
            assert bool((diff <= tol).all()), f"{name}: {float((diff - tol).max()):.3g} over its bound"
            # only the nearly cancelling gradients are free: most entries are held to ~PARAMS
            assert float((tol > 2 * PARAMS).float().mean()) < 0.1, name

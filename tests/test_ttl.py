"""TTL's own properties: episodic reset, the shared model left untouched, the LoRA attention's maths,
the towers it adapts and refuses (tests/test_golden_ttl.py compares it with the authors' code)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import shiftlab
from shiftlab.datasets.classes import classnames_for_wnids, imagenet_r_wnids
from shiftlab.methods.context import ClassHeads, SampleContext
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
        cls = get_method_class(name)
        assert cls.reads_features or cls.needs_pixels, name
    assert not get_method_class("ttl").reads_features

"""CALIP: the image tower's tokens and the attention against straightforward computations, its refusals, a run
through the CLI, and its authors' own code on both tiny towers (tests/fixtures/golden/calip, made by the driver
beside the fixtures from github.com/ZiyuGuo99/CALIP's `run_imagenet.main`, float32 on the CPU).

Golden tolerances (tests/_golden.py): tokens and the class head FEATURES (unit-norm float32); the zero-shot and
the two attention logits LOGITS (x 100 scale); the final logits, a sum of the three with weights 1, 2 and 0.1,
LOGITS x (1 + 2 + 0.1); the prediction exactly after a margin check.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FEATURES, LOGITS, VIT_MODEL_FILE, assert_close, assert_top1_margin, stream_views
from shiftlab.methods.calip.method import calip_attention_logits
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.methods.head_kinds import text_head
from shiftlab.models.tower_tokens import image_tokens, tower_kind

CLASSNAMES = ["cat", "dog", "car", "tree", "boat"]
TOWERS = {"calip_rn": ("shiftlab-tiny", "tiny_clip_openai.pt"), "calip_vit": ("shiftlab-tiny-vit", VIT_MODEL_FILE)}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_vit():
    return shiftlab.load_model("shiftlab-tiny-vit", None)


def _images(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, 64, 64, generator=torch.Generator().manual_seed(seed))


# -- the tokens ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["resnet", "vit"])
def test_token_zero_is_the_towers_own_feature(which, tiny_model, tiny_vit):
    model = tiny_model if which == "resnet" else tiny_vit
    assert tower_kind(model.clip.visual) == which
    x = _images(3)
    with torch.no_grad():
        tokens = image_tokens(model.clip.visual, x)
    # 2 x 2 positions of the tiny ResNet's last map; 4 x 4 patches of the tiny ViT
    assert tokens.shape == (3, 5 if which == "resnet" else 17, 32)
    assert_close(F.normalize(tokens[:, 0], dim=-1), model.encode_views(x), 1e-6, "token 0 vs encode_views")


def test_vit_spatial_tokens_are_open_clips_tokens_projected(tiny_vit):
    visual, x = tiny_vit.clip.visual, _images(2, seed=1)
    with torch.no_grad():
        visual.output_tokens = True
        try:
            pooled, tokens = visual(x)
        finally:
            visual.output_tokens = False
        ours = image_tokens(visual, x)
    assert_close(ours[:, 1:], tokens @ visual.proj, 1e-6, "spatial tokens")
    assert_close(ours[:, 0], pooled, 1e-6, "class token")


def test_resnet_tokens_are_each_position_attending_over_the_map(tiny_model):
    """The attention pool with every position as a query, written out head by head."""
    visual, x = tiny_model.clip.visual, _images(2, seed=2)
    pool = visual.attnpool
    with torch.no_grad():
        fmap = visual.layer4(visual.layer3(visual.layer2(visual.layer1(visual.stem(x)))))
        seq = fmap.flatten(2).transpose(1, 2)                                   # (N, HW, C)
        seq = torch.cat([seq.mean(1, keepdim=True), seq], 1) + pool.positional_embedding
        q, k, v = pool.q_proj(seq), pool.k_proj(seq), pool.v_proj(seq)
        heads, width = pool.num_heads, seq.shape[-1] // pool.num_heads
        out = []
        for h in range(heads):
            part = slice(h * width, (h + 1) * width)
            weights = (q[..., part] @ k[..., part].transpose(1, 2) / width ** 0.5).softmax(-1)
            out.append(weights @ v[..., part])
        want = pool.c_proj(torch.cat(out, -1))
        got = image_tokens(visual, x)
    assert_close(got, want, 1e-5, "attention-pool tokens")


def test_a_tower_without_spatial_tokens_is_refused_in_one_line(tiny_model):
    with pytest.raises(ValueError) as info:
        tower_kind(torch.nn.Linear(3, 3))
    assert "Linear" in str(info.value) and "\n" not in str(info.value)


# -- the attention -------------------------------------------------------------------------------------------

def test_attention_logits_against_their_loop():
    """calip_attention_logits on a batch against the per-image loop of their get_logits, written out."""
    g = torch.Generator().manual_seed(3)
    spatial = F.normalize(torch.randn(3, 7, 16, generator=g), dim=-1)
    global_feats = F.normalize(torch.randn(3, 16, generator=g), dim=-1)
    text = F.normalize(torch.randn(5, 16, generator=g), dim=-1)
    l1, l2 = calip_attention_logits(global_feats, spatial, text, 2.0, 100.0)
    for i in range(3):
        a = torch.zeros(7, 5)
        for p in range(7):
            for c in range(5):
                a[p, c] = 2.0 * float(spatial[i, p] @ text[c])
        over_p, over_c = a.softmax(0), a.softmax(1)
        for c in range(5):
            attended_text = sum(over_p[p, c] * spatial[i, p] for p in range(7))
            assert abs(float(l1[i, c]) - 100 * float(attended_text @ global_feats[i])) < 1e-4
        attended = torch.stack([sum(over_c[p, c] * text[c] for c in range(5)) for p in range(7)])
        pooled = attended.mean(0) + attended.max(0).values
        assert_close(l2[i], 100 * text @ pooled, 1e-4, f"l2 of image {i}")


def test_without_the_betas_it_is_zero_shot_on_view_0(tiny_model):
    calip = shiftlab.create_method("calip", tiny_model, CLASSNAMES, beta_text=0.0, beta_visual=0.0)
    zeroshot = shiftlab.create_method("zeroshot", tiny_model, CLASSNAMES)
    x = _images(4, seed=4)
    assert_close(calip.predict(x), zeroshot.predict(x), 1e-4, "calip with no attention vs zero-shot")


def test_the_betas_weigh_the_attention_logits(tiny_model):
    x = _images(1, seed=5)
    calip = shiftlab.create_method("calip", tiny_model, CLASSNAMES, beta_text=0.7, beta_visual=3.0)
    logits, l1, l2 = calip.scores(calip.tokens(x))
    base = shiftlab.create_method("calip", tiny_model, CLASSNAMES, beta_text=0.0, beta_visual=0.0).predict(x)
    assert_close(calip.predict(x), base + 0.7 * l1[0] + 3.0 * l2[0], 1e-4, "weighted sum")
    assert not torch.allclose(l1, l2)


def test_a_batch_is_its_images_one_by_one(tiny_model):
    calip = shiftlab.create_method("calip", tiny_model, CLASSNAMES)
    heads = calip.heads
    views = [_images(1, seed=s) for s in range(3)]
    ctxs = [SampleContext(tiny_model, heads, v) for v in views]
    together = calip.predict_batch(ctxs)
    for v, out in zip(views, together):
        assert_close(out.logits, calip.predict(v), 1e-5, "batched vs alone")


def test_stored_features_are_refused_in_one_line(tiny_model):
    calip = shiftlab.create_method("calip", tiny_model, CLASSNAMES)
    ctx = SampleContext(tiny_model, calip.heads, None, image_features=torch.zeros(1, 32))
    with pytest.raises(ValueError, match="pixels"):
        calip.predict_context(ctx)


def test_cli_runs_calip_and_refuses_a_bad_value(tmp_path, tiny_checkpoint, capsys):
    from _runs import json_lines
    from _synthetic import make_imagenet_r
    from shiftlab.cli import main as cli_main
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 50), per_class=1, size=(80, 64))
    flags = ["--dataset", "imagenet-r", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained",
             str(tiny_checkpoint), "--workers", "0", "--no-progress", "--allow-partial"]
    assert cli_main(["run", *flags, "--methods", "calip,zeroshot", "--set", "calip.beta_text=0",
                     "--set", "calip.beta_visual=0", "--out", str(tmp_path / "run")]) == 0
    records = json_lines(tmp_path / "run" / "records.jsonl")
    by = {(r["id"], r["method"]): r for r in records}
    assert len(records) == 8
    for sid in range(4):      # no attention weight: CALIP is zero-shot CLIP on view 0
        assert by[sid, "calip"]["pred"] == by[sid, "zeroshot"]["pred"]
        assert abs(by[sid, "calip"]["confidence"] - by[sid, "zeroshot"]["confidence"]) < 1e-4
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["run", *flags, "--methods", "calip", "--set", "calip.attention_scale=0",
                  "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2 and "attention_scale" in err and "Traceback" not in err
    # its own view-0 pass (README, "Why its pass is not shared"): its records are the same whatever runs beside it
    assert cli_main(["run", *flags, "--methods", "calip", "--set", "calip.beta_text=0", "--set", "calip.beta_visual=0",
                     "--out", str(tmp_path / "alone")]) == 0
    alone = {r["id"]: r for r in json_lines(tmp_path / "alone" / "records.jsonl")}
    for sid in range(4):
        assert {k: v for k, v in alone[sid].items() if k != "seconds"} == \
            {k: v for k, v in by[sid, "calip"].items() if k != "seconds"}


@pytest.mark.slow
def test_cli_resume_after_sigkill_gives_the_uninterrupted_records(tmp_path, tiny_checkpoint, capsys):
    """Killed after its 2nd step of 4 (a gate, tests/_gate.py) and resumed: the records of one whole run."""
    import signal

    from _gate import GatedRun
    from _runs import comparable, json_lines
    from _synthetic import make_imagenet_r
    from shiftlab.cli import main as cli_main
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 50), per_class=2, size=(80, 64))
    argv = ["run", "--dataset", "imagenet-r", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained",
            str(tiny_checkpoint), "--workers", "0", "--no-progress", "--allow-partial", "--methods", "calip",
            "--batch-size", "2", "--seed", "3", "--device", "cpu"]
    assert cli_main([*argv, "--out", str(tmp_path / "whole")]) == 0
    out = tmp_path / "killed"
    with GatedRun(tmp_path / "gate", [*argv, "--out", str(out)], at="after_step:2") as child:
        child.wait_reached()
        assert child.kill() == -signal.SIGKILL
    assert len(json_lines(out / "records.jsonl")) == 4
    assert cli_main([*argv, "--out", str(out), "--resume"]) == 0
    whole = json_lines(tmp_path / "whole" / "records.jsonl")
    assert len(whole) == 8 and comparable(json_lines(out / "records.jsonl")) == comparable(whole)


# -- golden checks: the authors' code ------------------------------------------------------------------------

def _fixture(golden_dir, name: str) -> tuple[dict, dict]:
    info = json.loads((golden_dir / "calip" / "calip.json").read_text())["fixtures"][name]
    return torch.load(golden_dir / "calip" / f"{name}.pt", weights_only=True), info


@pytest.mark.golden
@pytest.mark.parametrize("name", sorted(TOWERS))
def test_calip_is_their_code(golden_dir, name):
    want, info = _fixture(golden_dir, name)
    arch, weights = TOWERS[name]
    model = shiftlab.load_model(arch, str(golden_dir / weights))
    names = json.loads((golden_dir / "golden.json").read_text())["classnames"]
    assert info["templates"] == list(shiftlab.methods.calip.spec.CALIP_TEMPLATES) and info["n_samples"] == 24
    calip = shiftlab.create_method("calip", model, names, heads=ClassHeads(model, names), precision="fp32",
                                   text_head="ensemble", logit_scale=100.0)
    assert_close(text_head(calip), want["text"].T, FEATURES, f"{name}: class head")
    views = torch.cat([model.normalize(v[:1]) for v in stream_views(golden_dir, 1)])
    tokens = calip.tokens(views)
    assert_close(tokens, want["tokens"], FEATURES, f"{name}: tokens")
    logits, l1, l2 = calip.scores(tokens)
    assert_close(l1, want["logits1"], LOGITS, f"{name}: logits1")
    assert_close(l2, want["logits2"], LOGITS, f"{name}: logits2")
    # their final logits with CLIPTTA's fixed betas (2.0, 0.1), as their search loop forms them
    theirs = want["zs_logits"] + 2.0 * want["logits1"] + 0.1 * want["logits2"]
    assert_close(logits, theirs, LOGITS * 3.1, f"{name}: logits")
    assert_top1_margin(theirs, LOGITS * 3.1, f"{name}: prediction")
    assert torch.equal(logits.argmax(-1), theirs.argmax(-1))
    # and through the engine's way in: one view per image, the predictions of the batch
    outs = calip.predict_batch([SampleContext(model, calip.heads, v[None]) for v in views])
    assert_close(torch.stack([o.logits for o in outs]), theirs, LOGITS * 3.1, f"{name}: predict_batch")

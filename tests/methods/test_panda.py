"""Panda (negative augmentation on zero-shot CLIP): its mosaics and logits against a straightforward computation, a
batch of one and images smaller than a patch, its seeding, its adaptive prediction, and the method as its authors'
code runs it (ruxideng/Panda `CLIP` with style Panda, tests/fixtures/golden/panda, made by the driver beside the
fixture, float32 on the CPU).

Golden: the 24 stream images in batches (8 at their defaults, 24 with 16 px patches, 12 with 24 px patches that leave
a border, and the tiny ViT in batches of 8): per batch the seed, every mosaic's draws (exact), the images' and the
mosaics' features (FEATURES), the class head (FEATURES) and the logits (LOGITS).
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FEATURES, LOGITS, assert_close, stream_views
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.methods.panda.method import batch_seed, mosaic_draws, negative_views, panda_logits

pytestmark = pytest.mark.usefixtures("one_thread")

CLASSES = ["cat", "dog", "car", "bus"]
# the fixture's variants: shiftlab's config for each of their cfgs (their literal 100 is the default logit scale)
VARIANTS = {"panda": {}, "panda_p16": {"beta": 0.3, "patch_size": 16}, "panda_p24": {"beta": 1.0, "patch_size": 24},
            "panda_vit": {"patch_size": 16}}


def contexts(model, method, pixels, first_id=0):
    return [SampleContext(model, method.heads, pixels[i:i + 1], sample_id=first_id + i)
            for i in range(pixels.shape[0])]


def straightforward_mosaics(images, p, bases, sources):
    """Mosaic m: image bases[m] with the patch at row-major position j of its top-left grid taken from image
    sources[m, j], one patch at a time."""
    out = []
    cols = images.shape[-1] // p
    for base, source in zip(bases.tolist(), sources.tolist()):
        image = images[base].clone()
        for j, src in enumerate(source):
            r, c = divmod(j, cols)
            image[:, r * p:(r + 1) * p, c * p:(c + 1) * p] = images[src, :, r * p:(r + 1) * p, c * p:(c + 1) * p]
        out.append(image)
    return torch.stack(out)


def test_mosaics_are_patches_of_other_images_at_the_same_positions():
    images = torch.rand(13, 3, 20, 22, generator=torch.Generator().manual_seed(0))
    bases, sources = mosaic_draws(13, 9, torch.Generator().manual_seed(5))
    assert bases.shape == (2,) and sources.shape == (2, 9)      # ceil(13 / 10) mosaics of (20 // 6) x (22 // 6)
    assert all((s != b).all() for b, s in zip(bases, sources))
    got = negative_views(images, 6, torch.Generator().manual_seed(5))
    want = straightforward_mosaics(images, 6, bases, sources)
    assert torch.equal(got, want)
    # the border outside the 18 x 18 grid is the base image's own
    assert torch.equal(got[:, :, 18:], images[bases][:, :, 18:]) and torch.equal(got[:, :, :, 18:],
                                                                                  images[bases][:, :, :, 18:])
    # an image smaller than one patch: the batch itself (theirs returns it); one image: no mosaic
    assert torch.equal(negative_views(images, 32, torch.Generator()), images)
    assert negative_views(images[:1], 6, torch.Generator()).shape == (0, 3, 20, 22)
    with pytest.raises(ValueError, match="a batch of 1 has none"):
        mosaic_draws(1, 4, torch.Generator())


def test_logits_are_zero_shot_minus_beta_times_the_mean_mosaic_feature(tiny_model):
    model = tiny_model
    pixels = model.normalize(torch.rand(5, 3, 64, 64, generator=torch.Generator().manual_seed(1)))
    method = shiftlab.create_method("panda", model, CLASSES, beta=0.7, patch_size=16, seed=3)
    outs = method.adapt_batch(contexts(model, method, pixels, first_id=40))
    head = method.heads.zeroshot.float()
    negatives = straightforward_mosaics(pixels, 16, *mosaic_draws(5, 16, torch.Generator().manual_seed(
        batch_seed(3, range(40, 45)))))
    offset = model.encode_views(negatives).mean(0)
    want = 100.0 * model.encode_views(pixels) @ head.T - 0.7 * 100.0 * offset @ head.T
    assert_close(torch.stack([o.logits for o in outs]), want, LOGITS, "logits")
    assert outs[0].extras == {"batch": 5, "negatives": 1, "zero_shot_pred": int((model.encode_views(pixels[:1])
                                                                                  @ head.T).argmax())}
    # the same batch draws the same mosaics; other sample ids or another seed draw others
    again = method.adapt_batch(contexts(model, method, pixels, first_id=40))
    assert all(torch.equal(a.logits, o.logits) for a, o in zip(again, outs))
    moved = method.adapt_batch(contexts(model, method, pixels, first_id=41))
    assert not torch.equal(moved[0].logits, outs[0].logits)
    # one image alone: nothing to make a mosaic of, its zero-shot logits (theirs never returns)
    alone = method.adapt_batch(contexts(model, method, pixels[:1]))[0]
    assert alone.extras["negatives"] == 0
    assert_close(alone.logits, 100.0 * model.encode_views(pixels[:1])[0] @ head.T, LOGITS, "one image")


def test_stored_features_are_refused_in_one_line(tiny_model):
    method = shiftlab.create_method("panda", tiny_model, CLASSES)
    feats = F.normalize(torch.randn(2, 1, 32), dim=-1)
    ctxs = [SampleContext(tiny_model, method.heads, None, image_features=f, sample_id=i) for i, f in enumerate(feats)]
    with pytest.raises(ValueError, match="^panda cuts the batch's images into patch mosaics and needs their pixels"):
        method.adapt_batch(ctxs)


def test_the_adaptive_prediction_is_the_scored_one_and_differentiates_through_the_mosaics(tiny_model):
    model = tiny_model
    x01 = torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    method = shiftlab.create_method("panda", model, CLASSES, beta=1.0, patch_size=32)
    scored = torch.stack([o.logits for o in method.adapt_batch(contexts(model, method, model.normalize(x01), 7))])
    x = x01.clone().requires_grad_(True)
    logits = panda_logits(method, x[:, None], sample_ids=[7, 8, 9, 10])
    assert_close(logits, scored, LOGITS, "adaptive logits")
    # an image's gradient through its own logits alone vs. through the mosaics too: the offset's term is there
    bases, sources = mosaic_draws(4, 4, method.generator([7, 8, 9, 10]))
    donor = int(sources[0, 0])
    (grad,) = torch.autograd.grad(logits[:, 0].sum(), x)
    with torch.enable_grad():
        own = 100.0 * model.encode_normalized(model.normalize(x)).float() @ method.heads.zeroshot.float().T
    (own_grad,) = torch.autograd.grad(own[:, 0].sum(), x)
    assert (grad[donor, :, :32, :32] - own_grad[donor, :, :32, :32]).abs().max() > 1e-6


# -- their code (tests/fixtures/golden/panda) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def golden_panda(golden_dir):
    want = torch.load(golden_dir / "panda" / "panda.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "panda" / "panda.json").read_text())
    return want, info


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_panda_matches_their_code_batch_by_batch(golden_panda, golden_model, golden_vit, golden_dir, variant):
    want, info = golden_panda
    meta = info["fixtures"][variant]
    if meta["model"] == "tiny_vit_openai.pt":
        model, names, heads = golden_vit
    else:
        model, names = golden_model
        heads = ClassHeads(model, names)
    method = shiftlab.create_method("panda", model, names, heads=heads, **VARIANTS[variant])
    assert meta["cfg"].get("beta", 0.6) == method.config.beta and meta["cfg"].get("patch_size", 32) == \
        method.config.patch_size
    head = method.heads.zeroshot
    assert_close(head, want[f"{variant}/clip_weights"], FEATURES, "class head")
    pixels = torch.cat([model.normalize(v) for v in stream_views(golden_dir, 1)])
    batch = meta["batch_size"]
    cells = (64 // method.config.patch_size) ** 2
    for b in range(meta["n_batches"]):
        ids = list(range(b * batch, (b + 1) * batch))
        key = f"{variant}/{b}"
        # the seed their global stream was given is the one this batch's mosaics are drawn with, and the draws agree
        assert batch_seed(0, ids) == int(want[f"{key}/seed"])
        bases, sources = mosaic_draws(batch, cells, method.generator(ids))
        assert torch.equal(bases, want[f"{key}/bases"]) and torch.equal(sources, want[f"{key}/sources"]), key
        negatives = negative_views(pixels[ids], method.config.patch_size, method.generator(ids))
        assert_close(model.encode_views(negatives), F.normalize(want[f"{key}/negative_features"], dim=-1), FEATURES,
                     f"{key} mosaic features")
        outs = method.adapt_batch(contexts(model, method, pixels[ids], first_id=ids[0]))
        assert_close(torch.stack([c.base_feature for c in contexts(model, method, pixels[ids])]),
                     F.normalize(want[f"{key}/features"], dim=-1), FEATURES, f"{key} features")
        logits = torch.stack([o.logits for o in outs])
        assert_close(logits, want[f"{key}/logits"], LOGITS, f"{key} logits")
        zero_shot = 100.0 * F.normalize(want[f"{key}/features"], dim=-1) @ want[f"{variant}/clip_weights"].T
        assert (want[f"{key}/logits"] - zero_shot).abs().max() > 100 * LOGITS, "the offset moves the logits"

"""Deterministic views: view 0 = resize + center crop; views 1.. = torchvision's RandomResizedCrop + flip."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from _imports import lazy_module
from shiftlab.views.generator import (
    AUGMIX_OPS,
    AugMixPlan,
    ViewConfig,
    ViewGenerator,
    apply_augmix,
    augmix,
    draw_augmix,
    random_resized_crop_params,
    sample_seed,
    to_uint8_tensor,
)
from shiftlab.views.recipe import ViewRecipe

T = lazy_module("torchvision.transforms", optional=False)   # imported by the first test that reads it

pytestmark = pytest.mark.usefixtures("one_thread")



def _image(width: int = 97, height: int = 61, seed: int = 0) -> Image.Image:
    """A smooth-ish random RGB image (noise on a gradient), so crops and flips differ visibly."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([xx * 255 / width, yy * 255 / height, (xx + yy) * 127 / (width + height)], -1)
    arr = np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(arr)


def _pil_to_uint8(img: Image.Image) -> torch.Tensor:
    return T.PILToTensor()(img)


@pytest.mark.parametrize("size", [32, 48])
@pytest.mark.parametrize("wh", [(97, 61), (40, 90), (32, 32)])
def test_view0_is_bicubic_resize_and_center_crop(size, wh):
    img = _image(*wh)
    want = _pil_to_uint8(T.Compose([T.Resize(size, interpolation=T.InterpolationMode.BICUBIC),
                                    T.CenterCrop(size)])(img))
    views = ViewGenerator(ViewConfig(n_views=3, size=size), seed=0)(img, sample_id=0)
    assert views.dtype == torch.uint8 and views.shape == (3, 3, size, size)
    assert torch.equal(views[0], want)
    # view 0 does not depend on the seed or the sample id
    other = ViewGenerator(ViewConfig(n_views=1, size=size), seed=9)(img, sample_id=123)
    assert other.shape == (1, 3, size, size) and torch.equal(other[0], want)


def test_views_are_torchvisions_pipeline_seeded_per_sample():
    """Views 1..N-1 equal torchvision's RandomResizedCrop + RandomHorizontalFlip run on the global
    RNG seeded with the sample's seed: same draws, same order, same interpolation."""
    img = _image(120, 80, seed=1)
    cfg = ViewConfig(n_views=12, size=40)
    run_seed, sample_id = 7, 42
    views = ViewGenerator(cfg, seed=run_seed)(img, sample_id)
    pipeline = T.Compose([T.RandomResizedCrop(40, interpolation=T.InterpolationMode.BILINEAR),
                          T.RandomHorizontalFlip()])
    state = torch.get_rng_state()
    try:
        torch.manual_seed(sample_seed(run_seed, sample_id))
        want = [_pil_to_uint8(pipeline(img)) for _ in range(cfg.n_views - 1)]
    finally:
        torch.set_rng_state(state)
    for i, w in enumerate(want, start=1):
        assert torch.equal(views[i], w), f"view {i} differs from torchvision"


@pytest.mark.slow
def test_random_resized_crop_params_match_torchvision():
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    state = torch.get_rng_state()
    try:
        n = 0
        # (12, 400) and (400, 12) exercise the fallback (no crop fits in 10 tries)
        for width, height in [(64, 64), (300, 200), (97, 250), (12, 400), (400, 12)]:
            img = Image.new("RGB", (width, height))
            for s in range(60):
                torch.manual_seed(s)
                want = T.RandomResizedCrop.get_params(img, list(scale), list(ratio))
                gen = torch.Generator().manual_seed(s)
                got = random_resized_crop_params(width, height, scale, ratio, gen)
                assert tuple(got) == tuple(want), (width, height, s)
                i, j, h, w = got
                assert 0 <= i and 0 <= j and 0 < h <= height - i and 0 < w <= width - j
                n += 1
        # other scale/ratio ranges too
        img = Image.new("RGB", (200, 150))
        for s in range(40):
            torch.manual_seed(s)
            want = T.RandomResizedCrop.get_params(img, [0.5, 0.9], [0.5, 2.0])
            got = random_resized_crop_params(200, 150, (0.5, 0.9), (0.5, 2.0), torch.Generator().manual_seed(s))
            assert tuple(got) == tuple(want)
    finally:
        torch.set_rng_state(state)


def test_same_seed_and_id_give_identical_views():
    img = _image()
    cfg = ViewConfig(n_views=8, size=32)
    a = ViewGenerator(cfg, seed=3)(img, 5)
    b = ViewGenerator(cfg, seed=3)(img.copy(), 5)
    assert torch.equal(a, b)
    # different sample ids and different run seeds give different augmented views
    c = ViewGenerator(cfg, seed=3)(img, 6)
    d = ViewGenerator(cfg, seed=4)(img, 5)
    assert torch.equal(a[0], c[0]) and not torch.equal(a[1:], c[1:])
    assert not torch.equal(a[1:], d[1:])
    # the global RNG plays no part
    torch.manual_seed(0)
    e = ViewGenerator(cfg, seed=3)(img, 5)
    torch.manual_seed(1)
    f = ViewGenerator(cfg, seed=3)(img, 5)
    assert torch.equal(a, e) and torch.equal(a, f)


def test_sample_seed():
    assert sample_seed(0, 1) == sample_seed(0, 1)
    seeds = {sample_seed(r, i) for r in range(3) for i in range(50)}
    assert len(seeds) == 150
    assert all(0 <= s < 2 ** 63 for s in seeds)
    assert sample_seed(1, 0) != sample_seed(0, 1)


class _Dataset(torch.utils.data.Dataset):
    def __init__(self, images, generator):
        self.images, self.generator = images, generator

    def __len__(self):
        return len(self.images)

    def __getitem__(self, idx):
        return self.generator(self.images[idx], idx)


def test_views_do_not_depend_on_order_or_workers():
    images = [_image(60 + 7 * i, 50 + 3 * i, seed=i) for i in range(6)]
    gen = ViewGenerator(ViewConfig(n_views=4, size=24), seed=11)
    forward = [gen(images[i], i) for i in range(6)]
    backward = {i: gen(images[i], i) for i in reversed(range(6))}
    for i in range(6):
        assert torch.equal(forward[i], backward[i])
    assert not torch.equal(forward[0][1:], forward[1][1:])
    ds = _Dataset(images, gen)
    for workers, batch in [(0, 1), (0, 4), (2, 2)]:
        loader = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers, shuffle=False)
        got = torch.cat(list(loader))
        assert torch.equal(got, torch.stack(forward)), (workers, batch)


def test_augmix_views():
    img = _image(80, 64, seed=2)
    plain_cfg = ViewConfig(n_views=6, size=32)
    mix_cfg = ViewConfig(n_views=6, size=32, augmix=True)
    plain = ViewGenerator(plain_cfg, seed=0)(img, 3)
    mixed = ViewGenerator(mix_cfg, seed=0)(img, 3)
    assert mixed.dtype == torch.uint8 and mixed.shape == plain.shape == (6, 3, 32, 32)
    assert torch.equal(mixed[0], plain[0])          # the original view is never augmented
    for i in range(1, 6):
        assert not torch.equal(mixed[i], plain[i])
    # deterministic per sample
    assert torch.equal(mixed, ViewGenerator(mix_cfg, seed=0)(img, 3))
    assert not torch.equal(mixed[1:], ViewGenerator(mix_cfg, seed=0)(img, 4)[1:])


def test_augmix_function_is_a_convex_mix():
    img = _image(32, 32, seed=5)
    rng = np.random.default_rng(0)
    out = augmix(img, rng, severity=1)
    assert out.size == img.size and out.mode == "RGB"
    t = to_uint8_tensor(out)
    assert t.dtype == torch.uint8 and t.shape == (3, 32, 32)
    # same generator state -> same output
    assert np.array_equal(np.asarray(augmix(img, np.random.default_rng(0))), np.asarray(out))


def test_grayscale_input_becomes_rgb():
    img = _image().convert("L")
    views = ViewGenerator(ViewConfig(n_views=2, size=16), seed=0)(img, 0)
    assert views.shape == (2, 3, 16, 16)
    assert torch.equal(views[0, 0], views[0, 1]) and torch.equal(views[0, 1], views[0, 2])


# -- AugMix against a transcription of TPT's `augmix_ops.py` / `datautils.augmix` --------------------

_DRAWS = 20000


def _authors_parameter(name: str, severity: float, size: int):
    """The authors' draw for one op, written out: level ~ uniform(0.1, severity), scaled by
    int(level * maxval / 10) or level * maxval / 10, a random sign where the op has a direction."""
    if name in ("autocontrast", "equalize"):
        return None
    level = np.random.uniform(low=0.1, high=severity)
    if name == "posterize":
        return 4 - int(level * 4 / 10)
    if name == "solarize":
        return 256 - int(level * 256 / 10)
    if name == "rotate":
        degrees = int(level * 30 / 10)
        return -degrees if np.random.uniform() > 0.5 else degrees
    if name in ("shear_x", "shear_y"):
        shear = float(level) * 0.3 / 10.0
        return -shear if np.random.uniform() > 0.5 else shear
    shift = int(level * (size / 3) / 10)            # translate_x / translate_y
    return -shift if np.random.random() > 0.5 else shift


def _ks_distance(a, b) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    a, b = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    grid = np.concatenate([a, b])
    return float(np.abs(np.searchsorted(a, grid, "right") / a.size - np.searchsorted(b, grid, "right") / b.size).max())


def _assert_same_distribution(ours, theirs, what):
    ours, theirs = np.asarray(ours, float), np.asarray(theirs, float)
    values = np.unique(np.concatenate([ours, theirs]))
    if values.size <= 64:      # discrete: the same support and per-value frequencies within 2 points
        assert set(np.unique(ours)) == set(np.unique(theirs)), what
        for v in values:
            assert abs((ours == v).mean() - (theirs == v).mean()) < 0.02, (what, v)
    else:                      # continuous: KS distance far below what a wrong range or scale gives
        assert _ks_distance(ours, theirs) < 0.03, what


@pytest.mark.parametrize("severity, size", [(1, 224), (3, 224), (1, 64)])
@pytest.mark.parametrize("name", [op.name for op in AUGMIX_OPS])
def test_augmix_op_parameters_follow_the_authors_draws(name, severity, size):
    op = next(op for op in AUGMIX_OPS if op.name == name)
    rng = np.random.default_rng(12)
    ours = [op.draw(severity, size, rng) for _ in range(_DRAWS)]
    np.random.seed(12)
    theirs = [_authors_parameter(name, severity, size) for _ in range(_DRAWS)]
    if name in ("autocontrast", "equalize"):
        assert ours == theirs == [None] * _DRAWS
        return
    _assert_same_distribution(ours, theirs, name)


def test_augmix_severity_one_ranges():
    """At severity 1 the strengths vary over the authors' ranges (a draw that ignores the sampled level
    would give rotation always 3 degrees, solarize always 231, translation always 7 px at 224)."""
    rng = np.random.default_rng(0)
    ops = {op.name: op for op in AUGMIX_OPS}
    rotate = {ops["rotate"].draw(1, 224, rng) for _ in range(2000)}
    solarize = {ops["solarize"].draw(1, 224, rng) for _ in range(2000)}
    shift = {ops["translate_x"].draw(1, 224, rng) for _ in range(2000)}
    posterize = {ops["posterize"].draw(1, 224, rng) for _ in range(2000)}
    assert rotate == {-2, -1, 0, 1, 2}
    assert solarize == set(range(231, 255))      # 256 - int(level * 25.6), level in [0.1, 1)
    assert shift == set(range(-7, 8))
    assert posterize == {4}


@pytest.mark.slow
def test_augmix_chains_and_mixing_weights_follow_the_authors():
    """Per view: Dirichlet([1]*3) chain weights, Beta(1, 1) skip weight, 3 chains of
    randint(1, 4) ops each chosen uniformly."""
    rng = np.random.default_rng(5)
    plans = [draw_augmix(rng, 224) for _ in range(4000)]
    np.random.seed(5)
    names = [op.name for op in AUGMIX_OPS]
    theirs_w, theirs_m, theirs_depth, theirs_ops = [], [], [], []
    for _ in range(4000):
        theirs_w.append(np.float32(np.random.dirichlet([1.0, 1.0, 1.0])))
        theirs_m.append(np.float32(np.random.beta(1.0, 1.0)))
        for _ in range(3):
            depth = np.random.randint(1, 4)
            theirs_depth.append(depth)
            for _ in range(depth):
                name = names[np.random.choice(len(names))]
                theirs_ops.append(names.index(name))
                _authors_parameter(name, 1, 224)
    assert all(len(p.weights) == 3 and abs(sum(p.weights) - 1) < 1e-6 and len(p.chains) == 3 for p in plans)
    for i in range(3):
        _assert_same_distribution([p.weights[i] for p in plans], [w[i] for w in theirs_w], f"weight {i}")
    _assert_same_distribution([p.skip for p in plans], theirs_m, "skip")
    _assert_same_distribution([len(c) for p in plans for c in p.chains], theirs_depth, "depth")
    _assert_same_distribution([names.index(n) for p in plans for c in p.chains for n, _ in c], theirs_ops, "op")


def test_augmix_ops_apply_their_parameters_as_pil_does():
    img = _image(224, 224, seed=4)
    ops = {op.name: op for op in AUGMIX_OPS}
    want = {
        "autocontrast": ImageOps.autocontrast(img), "equalize": ImageOps.equalize(img),
        "posterize": ImageOps.posterize(img, 3), "solarize": ImageOps.solarize(img, 240),
        "rotate": img.rotate(-2, resample=Image.BILINEAR),
        "shear_x": img.transform((224, 224), Image.AFFINE, (1, 0.02, 0, 0, 1, 0), resample=Image.BILINEAR),
        "shear_y": img.transform((224, 224), Image.AFFINE, (1, 0, 0, -0.02, 1, 0), resample=Image.BILINEAR),
        "translate_x": img.transform((224, 224), Image.AFFINE, (1, 0, 5, 0, 1, 0), resample=Image.BILINEAR),
        "translate_y": img.transform((224, 224), Image.AFFINE, (1, 0, 0, 0, 1, -6), resample=Image.BILINEAR),
    }
    params = {"posterize": 3, "solarize": 240, "rotate": -2, "shear_x": 0.02, "shear_y": -0.02,
              "translate_x": 5, "translate_y": -6}
    for name, expected in want.items():
        got = ops[name].apply(img, params.get(name))
        assert np.array_equal(np.asarray(got), np.asarray(expected)), name


def test_augmix_mixes_the_chains_as_drawn():
    img = _image(48, 48, seed=6)
    plan = AugMixPlan(weights=(0.5, 0.3, 0.2), skip=0.25,
                      chains=((("rotate", 2),), (("solarize", 240), ("posterize", 4)), (("equalize", None),)))
    x = np.asarray(img, np.float64)
    chains = [np.asarray(img.rotate(2, resample=Image.BILINEAR), np.float64),
              np.asarray(ImageOps.posterize(ImageOps.solarize(img, 240), 4), np.float64),
              np.asarray(ImageOps.equalize(img), np.float64)]
    want = 0.25 * x + 0.75 * (0.5 * chains[0] + 0.3 * chains[1] + 0.2 * chains[2])
    got = np.asarray(apply_augmix(img, plan), np.float64)
    assert np.abs(got - want).max() <= 0.5 + 1e-3


# -- view recipes -------------------------------------------------------------------------------------

def test_recipe_scale_and_flip_are_torchvisions():
    """DMN-ZS's recipe: RandomResizedCrop(scale=(0.5, 1)) + flip; and a recipe without the flip."""
    img = _image(120, 80, seed=3)
    for recipe, pipeline in [
        (ViewRecipe(n_views=9, scale=(0.5, 1)),
         T.Compose([T.RandomResizedCrop(40, scale=(0.5, 1), interpolation=T.InterpolationMode.BILINEAR),
                    T.RandomHorizontalFlip()])),
        (ViewRecipe(n_views=9, flip=False), T.RandomResizedCrop(40, interpolation=T.InterpolationMode.BILINEAR)),
    ]:
        views = ViewGenerator(ViewConfig.from_recipe(recipe, 40), seed=2)(img, 8)
        state = torch.get_rng_state()
        try:
            torch.manual_seed(sample_seed(2, 8))
            want = [_pil_to_uint8(pipeline(img)) for _ in range(8)]
        finally:
            torch.set_rng_state(state)
        assert views.shape == (9, 3, 40, 40)
        for i, w in enumerate(want, start=1):
            assert torch.equal(views[i], w), (recipe, i)


def test_bicubic_crops_are_torchvisions_and_streams_draw_other_views():
    """TIPPLE's weak views: RandomResizedCrop(scale 0.5-1, bicubic) + flip, as torchvision draws it from the
    (run seed, sample id) seed; another stream of the same seed draws other crops, its own seed's."""
    img = _image(120, 80, seed=3)
    recipe = ViewRecipe(n_views=9, scale=(0.5, 1), interpolation="bicubic")
    pipeline = T.Compose([T.RandomResizedCrop(40, scale=(0.5, 1), interpolation=T.InterpolationMode.BICUBIC),
                          T.RandomHorizontalFlip()])
    for stream in (0, 2):
        views = ViewGenerator(ViewConfig.from_recipe(recipe, 40), seed=2, stream=stream)(img, 8)
        state = torch.get_rng_state()
        try:
            torch.manual_seed(sample_seed(2, 8, stream))
            want = [_pil_to_uint8(pipeline(img)) for _ in range(8)]
        finally:
            torch.set_rng_state(state)
        assert all(torch.equal(views[i], w) for i, w in enumerate(want, start=1)), stream
    assert sample_seed(2, 8, 0) == sample_seed(2, 8) != sample_seed(2, 8, 2) != sample_seed(2, 8, 1)
    bilinear = ViewGenerator(ViewConfig.from_recipe(ViewRecipe(n_views=9, scale=(0.5, 1)), 40), seed=2)(img, 8)
    assert not torch.equal(bilinear, ViewGenerator(ViewConfig.from_recipe(recipe, 40), seed=2)(img, 8))


def _authors_cutout(pixels: np.ndarray, y: int, x: int, length: int) -> np.ndarray:
    """Cutout(1, length) of TIPPLE's data/datautils.py:181-218 at the drawn centre, on (H, W, 3) pixels:
    rows clip(y - length // 2, 0, h):clip(y + length // 2, 0, h), the same for columns, set to zero."""
    h, w = pixels.shape[:2]
    mask = np.ones((h, w), np.float32)
    mask[int(np.clip(y - length // 2, 0, h)):int(np.clip(y + length // 2, 0, h)),
         int(np.clip(x - length // 2, 0, w)):int(np.clip(x + length // 2, 0, w))] = 0.0
    return (pixels * mask[..., None]).astype(np.uint8)


def test_cutout_blacks_out_the_authors_square_and_replaces_augmix_with_its_probability():
    from shiftlab.views.generator import cutout
    img = Image.fromarray(np.full((40, 40, 3), 200, np.uint8))
    for seed in range(20):
        rng, twin = np.random.default_rng(seed), np.random.default_rng(seed)
        got = np.asarray(cutout(img, 10, rng))
        y, x = int(twin.integers(40)), int(twin.integers(40))
        assert np.array_equal(got, _authors_cutout(np.asarray(img), y, x, 10)), seed
        inside = 5 <= y <= 35 and 5 <= x <= 35
        assert (got == 0).all(-1).sum() == 100 if inside else (got == 0).all(-1).sum() < 100
    # p 0.5 of 56/224 of the side: about half of the views hold the 10 x 10 square (no black pixel otherwise:
    # AugMix of a bright image without it), the other half are AugMix'd; p 1: all; no Cutout: never a draw more
    bright = _image(120, 80, seed=5).point(lambda v: 60 + v // 2)
    recipe = ViewRecipe(n_views=201, scale=(0.5, 1), augmix=True, augmix_severity=4, cutout=0.25, cutout_p=0.5)
    views = ViewGenerator(ViewConfig.from_recipe(recipe, 40), seed=0)(bright, 1)[1:]
    cut = (views == 0).all(1).flatten(1).any(1)
    assert 80 <= int(cut.sum()) <= 120
    always = ViewGenerator(ViewConfig.from_recipe(ViewRecipe(n_views=21, cutout=0.25), 40), seed=0)(bright, 1)
    assert bool((always[1:] == 0).all(1).flatten(1).any(1).all()) and not bool((always[0] == 0).all(0).any())
    assert "Cutout(0.25 of the side) with p 0.5 instead of AugMix" in recipe.describe()
    assert "bicubic" in ViewRecipe(n_views=2, interpolation="bicubic").describe()
    # the fields added later stay out of a recipe's dict at their defaults (run.json, feature-store keys)
    assert set(ViewRecipe().to_dict()) == {"n_views", "scale", "ratio", "flip", "augmix", "augmix_severity",
                                           "augmix_width"}
    assert ViewRecipe.coerce(recipe.to_dict()) == recipe


def test_shorter_recipe_is_a_prefix_of_a_longer_one():
    img = _image(90, 70, seed=4)
    for recipe in [ViewRecipe(), ViewRecipe(scale=(0.5, 1)), ViewRecipe(augmix=True),
                   ViewRecipe(augmix=True, cutout=0.25, cutout_p=0.5, interpolation="bicubic")]:
        long = ViewGenerator(ViewConfig.from_recipe(recipe.with_views(10), 32), seed=1)(img, 3)
        short = ViewGenerator(ViewConfig.from_recipe(recipe.with_views(4), 32), seed=1)(img, 3)
        assert torch.equal(long[:4], short)
        assert recipe.with_views(10).family == recipe.with_views(4).family


def test_recipe_from_a_count_a_dict_or_json():
    base = ViewRecipe(n_views=32, scale=(0.5, 1.0))
    assert ViewRecipe.coerce(16, base) == ViewRecipe(n_views=16, scale=(0.5, 1.0))
    assert ViewRecipe.coerce({"augmix": True}, base) == ViewRecipe(n_views=32, scale=(0.5, 1.0), augmix=True)
    # a recorded recipe (JSON lists) reads back equal and hashable
    import json
    back = ViewRecipe.coerce(json.loads(json.dumps(base.to_dict())))
    assert back == base and hash(back) == hash(base)
    assert ViewConfig.from_recipe(base, 64).recipe == base


@pytest.mark.parametrize("value, message", [
    ({"n_view": 3}, r"views: unknown recipe field\(s\) \['n_view'\]"),
    (0, "n_views must be an integer >= 1"),
    ({"scale": (0.5, 1.5)}, "scale must be"),
    ("many", "views must be a view count or a dict"),
    (True, "views must be a view count or a dict"),
    ({"n_views": True}, r"n_views must be an integer >= 1, got True"),     # not one view
    ({"n_views": 4.5}, r"n_views must be an integer >= 1, got 4.5"),
    ({"ratio": (0.75, float("inf"))}, "ratio must be"),
    ({"augmix": True, "augmix_severity": float("inf")}, "augmix_severity must be"),
    ({"interpolation": "nearest"}, "interpolation must be one of bilinear, bicubic, got 'nearest'"),
    ({"cutout": 1.5}, r"cutout and cutout_p must be in \[0, 1\], got 1.5 and 1.0"),
    ({"cutout": 0.25, "cutout_p": -0.1}, r"cutout and cutout_p must be in \[0, 1\], got 0.25 and -0.1"),
])
def test_bad_recipe_is_one_clear_error(value, message):
    with pytest.raises(ValueError, match=message):
        ViewRecipe.coerce(value)


# -- views follow the model's preprocessing (a fixed 224 px would mis-size every other model's views) --------

def test_view_size_defaults_to_the_models_input_size():
    from shiftlab.views.preprocess import Preprocess
    img = _image()
    for size in (64, 336):
        views = ViewGenerator(ViewConfig(n_views=2), seed=0, preprocess=Preprocess(size))(img, 0)
        assert views.shape == (2, 3, size, size)
    # an explicit size still wins
    assert ViewGenerator(ViewConfig(n_views=1, size=32), preprocess=Preprocess(64))(img, 0).shape[-1] == 32
    with pytest.raises(ValueError, match="preprocess=model.preprocess"):
        ViewGenerator(ViewConfig(n_views=2), seed=0)


def test_view0_follows_the_models_resize_mode_and_interpolation():
    from open_clip.transform import image_transform

    from shiftlab.views.preprocess import Preprocess
    img = _image(97, 61, seed=3)
    squash = Preprocess(48, (0.5,) * 3, (0.5,) * 3, interpolation="bilinear", resize_mode="squash")
    got = ViewGenerator(ViewConfig(n_views=1), preprocess=squash)(img, 0)[0]
    want = _pil_to_uint8(T.Resize((48, 48), interpolation=T.InterpolationMode.BILINEAR)(img))
    assert torch.equal(got, want)
    # open_clip's own eval transform agrees (after its tensor conversion)
    ref = image_transform(48, is_train=False, mean=(0.0,) * 3, std=(1.0,) * 3, resize_mode="squash",
                          interpolation="bilinear")(img)
    torch.testing.assert_close(got.float() / 255, ref, rtol=0, atol=1 / 255 + 1e-6)
    longest = Preprocess(48, resize_mode="longest", fill_color=0)
    padded = ViewGenerator(ViewConfig(n_views=1), preprocess=longest)(img, 0)[0]
    assert padded.shape == (3, 48, 48) and padded[:, 0].sum() == 0 and padded[:, 24].sum() > 0
    # OpenAI's (the default) is the bicubic shortest-side resize + centre crop of the tests above
    openai = ViewGenerator(ViewConfig(n_views=1), preprocess=Preprocess(48))(img, 0)[0]
    assert torch.equal(openai, _pil_to_uint8(T.Compose([T.Resize(48, interpolation=T.InterpolationMode.BICUBIC),
                                                         T.CenterCrop(48)])(img)))
    assert not torch.equal(openai, got)

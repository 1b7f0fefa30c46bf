"""Deterministic views: view 0 = resize + center crop; views 1.. = torchvision's RandomResizedCrop + flip."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import InterpolationMode

from shiftlab.views import ViewConfig, ViewGenerator, augmix, random_resized_crop_params, sample_seed, to_uint8_tensor


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny ops: one thread is fastest and immune to oversubscribed CPUs (conftest restores the count).
    torch.set_num_threads(1)



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
    want = _pil_to_uint8(T.Compose([T.Resize(size, interpolation=InterpolationMode.BICUBIC),
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
    pipeline = T.Compose([T.RandomResizedCrop(40, interpolation=InterpolationMode.BILINEAR),
                          T.RandomHorizontalFlip()])
    state = torch.get_rng_state()
    try:
        torch.manual_seed(sample_seed(run_seed, sample_id))
        want = [_pil_to_uint8(pipeline(img)) for _ in range(cfg.n_views - 1)]
    finally:
        torch.set_rng_state(state)
    for i, w in enumerate(want, start=1):
        assert torch.equal(views[i], w), f"view {i} differs from torchvision"


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

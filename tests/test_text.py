"""Text heads: the truncated text tower and the learnable context prompt against open_clip's encode_text."""
from __future__ import annotations

import csv
import itertools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _imports import lazy_module
from conftest import make_tiny_model
from shiftlab.models.prefix_tower import length_buckets, supports_prefix_sharing
from shiftlab.models.text import ContextPrompt, class_head, encode_texts, tokenize

open_clip = lazy_module("open_clip", optional=False)   # imported by the first test that reads it

TABLE = Path(__file__).resolve().parents[1] / "src" / "shiftlab" / "data" / "imagenet_classes.tsv"

# one-token, multi-token, punctuation, digits, underscores (replaced by spaces in prompts)
NAMES = ["goldfish", "great white shark", "jack-o'-lantern", "yellow lady's slipper", "Granny Smith apple",
         "hot_dog", "sea_lion", "T-shirt", "3D printer", "cat", "Rottweiler", "black-and-white colobus",
         "velvet", "St. Bernard"]


pytestmark = pytest.mark.usefixtures("one_thread")


def _imagenet_r_names() -> list[str]:
    with open(TABLE, newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    names = [r["name"] for r in sorted(rows, key=lambda r: r["wnid"]) if r["in_imagenet_r"] == "1"]
    assert len(names) == 200
    return names


def _full_encode(model: shiftlab.ClipModel, texts: list[str]) -> torch.Tensor:
    """open_clip's own 77-token encode_text."""
    with torch.no_grad():
        return model.clip.encode_text(open_clip.tokenize(texts), normalize=True).float()


def _full_encode_with_ctx(model: shiftlab.ClipModel, texts: list[str], ctx: torch.Tensor) -> torch.Tensor:
    """77-token forward written out with torch ops, the token embeddings at 1..n_ctx replaced by ctx."""
    clip = model.clip
    tokens = open_clip.tokenize(texts)
    emb = clip.token_embedding(tokens).clone()
    emb[:, 1:1 + ctx.shape[0]] = ctx
    x = emb + clip.positional_embedding
    x = clip.transformer(x, attn_mask=clip.attn_mask)
    x = clip.ln_final(x)
    x = x[torch.arange(len(texts)), tokens.argmax(-1)] @ clip.text_projection
    return F.normalize(x, dim=-1)


@pytest.fixture(scope="module")
def model():
    return make_tiny_model(seed=1)


def test_initial_context_reproduces_encode_text(model):
    names = _imagenet_r_names() + NAMES
    prompt = ContextPrompt(model, names)
    assert prompt.n_ctx == 4 and prompt.ctx.shape == (4, 64)
    want = _full_encode(model, [f"a photo of a {n.replace('_', ' ')}." for n in names])
    with torch.no_grad():
        got = prompt.features()
    assert got.shape == want.shape == (len(names), 32)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # tokens are the standard prompts, padded to 77
    assert torch.equal(prompt.tokens, open_clip.tokenize([f"a photo of a {n.replace('_', ' ')}." for n in names]))
    # the tower really is truncated
    assert prompt.length == int(prompt.tokens.argmax(-1).max()) + 1 < 77


def test_encode_texts_and_class_head_match_encode_text(model):
    texts = [f"a photo of a {n}." for n in NAMES] + ["a much longer sentence with many words in it about a " + n
                                                       for n in NAMES[:3]]
    torch.testing.assert_close(encode_texts(model, texts, batch_size=5), _full_encode(model, texts),
                               rtol=0, atol=1e-5)
    # class names read "_" as a space, as the learnable prompt does, so both heads agree
    spaced = [n.replace("_", " ") for n in NAMES]
    torch.testing.assert_close(class_head(model, NAMES), _full_encode(model, [f"a photo of a {n}." for n in spaced]),
                               rtol=0, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(class_head(model, NAMES), ContextPrompt(model, NAMES).features(), rtol=0, atol=1e-5)


def test_class_head_averages_normalised_template_features(model):
    t1 = "a photo of a {}."
    t2 = lambda c: f"a blurry sketch of the {c}, drawn badly."  # noqa: E731 (callables are allowed)
    spaced = [n.replace("_", " ") for n in NAMES]
    f1 = _full_encode(model, [t1.format(n) for n in spaced])
    f2 = _full_encode(model, [t2(n) for n in spaced])
    want = F.normalize((f1 + f2) / 2, dim=-1)
    got = class_head(model, NAMES, [t1, t2])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert (got - f1).abs().max() > 1e-3 and (got - f2).abs().max() > 1e-3


def test_batched_contexts_equal_one_at_a_time(model):
    prompt = ContextPrompt(model, NAMES)
    gen = torch.Generator().manual_seed(0)
    ctxs = prompt.init_ctx + 0.05 * torch.randn(3, *prompt.init_ctx.shape, generator=gen)
    with torch.no_grad():
        batched = prompt.features(ctxs)
        singles = torch.stack([prompt.features(c) for c in ctxs])
    assert batched.shape == (3, len(NAMES), 32)
    torch.testing.assert_close(batched, singles, rtol=0, atol=1e-6)
    # different contexts give different features, each equal to the written-out 77-token forward
    assert (batched[0] - batched[1]).abs().max() > 1e-3
    with torch.no_grad():
        for i in range(3):
            want = _full_encode_with_ctx(model, [f"a photo of a {n.replace('_', ' ')}." for n in NAMES], ctxs[i])
            torch.testing.assert_close(batched[i], want, rtol=0, atol=1e-5)


def test_gradient_reaches_only_the_context(model):
    prompt = ContextPrompt(model, NAMES)
    feats = prompt.features()
    loss = (feats[:, :5] ** 3).sum()
    loss.backward()
    assert prompt.ctx.grad is not None and prompt.ctx.grad.abs().sum() > 0
    assert [n for n, p in prompt.named_parameters() if p.requires_grad] == ["ctx"]
    assert all(p.grad is None for p in model.parameters())
    assert not prompt.prefix.requires_grad and not prompt.suffix.requires_grad
    # a batch of contexts that requires grad gets a gradient for every row
    ctx = prompt.init_ctx.unsqueeze(0).repeat(2, 1, 1).requires_grad_(True)
    prompt.features(ctx)[1].sum().backward()
    assert ctx.grad[0].abs().max() == 0 and ctx.grad[1].abs().max() > 0


def test_reset_restores_the_initial_context(model):
    prompt = ContextPrompt(model, NAMES)
    with torch.no_grad():
        prompt.ctx.add_(1.0)
    assert not torch.equal(prompt.ctx, prompt.init_ctx)
    prompt.reset()
    assert torch.equal(prompt.ctx.detach(), prompt.init_ctx)


def test_init_from_string_is_the_token_embeddings(model):
    prompt = ContextPrompt(model, NAMES, ctx_init="a_photo_of_a")  # TPT's underscore spelling
    ids = open_clip.tokenize(["a photo of a"])[0, 1:5]
    torch.testing.assert_close(prompt.init_ctx, model.clip.token_embedding.weight[ids], rtol=0, atol=0)
    longer = ContextPrompt(model, NAMES, ctx_init="itap of a blurry")
    assert longer.n_ctx == len(open_clip.tokenize(["itap of a blurry"])[0].nonzero()) - 2


def test_random_init(model):
    a = ContextPrompt(model, NAMES, n_ctx=8, ctx_init=None, seed=0)
    b = ContextPrompt(model, NAMES, n_ctx=8, ctx_init=None, seed=0)
    c = ContextPrompt(model, NAMES, n_ctx=8, ctx_init=None, seed=1)
    assert a.n_ctx == 8 and a.ctx.shape == (8, 64)
    assert torch.equal(a.init_ctx, b.init_ctx) and not torch.equal(a.init_ctx, c.init_ctx)
    assert 0.015 < float(a.init_ctx.std()) < 0.025 and abs(float(a.init_ctx.mean())) < 0.005
    # [SOS] ctx_1..ctx_8 name . [EOT]: the context sits right after SOS
    with torch.no_grad():
        got = a.features()
        want = _full_encode_with_ctx(model, [f"{' '.join(['X'] * 8)} {n.replace('_', ' ')}." for n in NAMES],
                                     a.init_ctx)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_tensor_init(model):
    ref = ContextPrompt(model, NAMES)
    tensor_init = ContextPrompt(model, NAMES, ctx_init=ref.init_ctx.clone())
    assert torch.equal(tensor_init.init_ctx, ref.init_ctx)
    with torch.no_grad():
        torch.testing.assert_close(tensor_init.features(), ref.features(), rtol=0, atol=1e-6)
    # the number of context tokens comes from the tensor (e.g. a 16-token CoOp context)
    gen = torch.Generator().manual_seed(3)
    coop = 0.02 * torch.randn(16, 64, generator=gen)
    p16 = ContextPrompt(model, NAMES, ctx_init=coop)
    assert p16.n_ctx == 16 and torch.equal(p16.init_ctx, coop)
    with torch.no_grad():
        want = _full_encode_with_ctx(model, [f"{' '.join(['X'] * 16)} {n.replace('_', ' ')}." for n in NAMES], coop)
        torch.testing.assert_close(p16.features(), want, rtol=0, atol=1e-5)


def test_tokenize_is_open_clip(model):
    texts = ["a photo of a cat.", "hello"]
    assert torch.equal(tokenize(texts), open_clip.tokenize(texts))


@pytest.mark.slow
def test_truncation_is_exact_on_rn50_architecture():
    torch.manual_seed(0)
    model = shiftlab.load_model("RN50-quickgelu", None)
    names = _imagenet_r_names()
    prompts = [f"a photo of a {n}." for n in names]
    eot = open_clip.tokenize(prompts).argmax(-1)
    # The truncated length is set by the longest of the 200 prompts; the check needs that prompt,
    # the shortest (most positions dropped) and a few in between. (The full 77-token tower of RN50
    # costs ~0.3 s per prompt on one CPU core, so not all 200 are compared.)
    order = torch.argsort(eot, stable=True).tolist()
    rows = [order[-1], order[-2], order[0], order[60], order[120], order[180]]
    subset = [names[i] for i in rows]
    texts = [prompts[i] for i in rows]
    assert int(eot[rows].max()) == int(eot.max())
    want = _full_encode(model, texts)
    assert want.shape == (6, 1024)

    got = encode_texts(model, texts)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)

    prompt = ContextPrompt(model, subset)
    assert prompt.length == int(eot.max()) + 1 < 40
    with torch.no_grad():
        feats = prompt.features()
    torch.testing.assert_close(feats, want, rtol=0, atol=1e-5)
    # QuickGELU architecture
    assert isinstance(model.clip.transformer.resblocks[0].mlp.gelu, open_clip.transformer.QuickGELU)


# -- the shared-prefix tower (prefix_tower.py) --------------------------------------------------------

def _padded_cost(buckets: list[list[int]], lengths: list[int]) -> int:
    return sum(len(b) * max(lengths[i] for i in b) for b in buckets)


def _partitions(values: list[int], k: int):
    """Every split of the sorted distinct values into at most k contiguous runs."""
    n = len(values)
    for parts in range(1, min(k, n) + 1):
        for cuts in itertools.combinations(range(1, n), parts - 1):
            bounds = (0, *cuts, n)
            yield [values[bounds[i]:bounds[i + 1]] for i in range(parts)]


@pytest.mark.parametrize("seed", range(6))
def test_length_buckets_minimise_padding(seed):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 12, (int(torch.randint(1, 30, (1,), generator=gen)),), generator=gen).tolist()
    for k in (1, 2, 3, 4):
        buckets = length_buckets(lengths, k)
        assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))   # each class once
        assert len(buckets) <= k
        brute = min(sum(sum(lengths.count(v) for v in run) * run[-1] for run in split)
                    for split in _partitions(sorted(set(lengths)), k))
        assert _padded_cost(buckets, lengths) == brute
    assert length_buckets([5, 3, 5, 3, 9], 1) == [[0, 1, 2, 3, 4]]
    assert length_buckets([5, 3, 5, 3, 9], 3) == [[1, 3], [0, 2], [4]]


def _c_fc_rows(model: shiftlab.ClipModel, fn, block: int = 0) -> int:
    """Token rows through a block's MLP while fn() runs."""
    rows = []
    hook = model.clip.transformer.resblocks[block].mlp.c_fc.register_forward_hook(
        lambda mod, inp, out: rows.append(inp[0].shape[:-1].numel()))
    try:
        fn()
    finally:
        hook.remove()
    return sum(rows)


def test_shared_prefix_equals_whole_prompts_with_gradients(model):
    shared, whole = ContextPrompt(model, NAMES), ContextPrompt(model, NAMES, share_prefix=False)
    assert shared.share_prefix and not whole.share_prefix
    gen = torch.Generator().manual_seed(3)
    ctx = (shared.init_ctx + 0.05 * torch.randn(2, *shared.init_ctx.shape, generator=gen)).requires_grad_(True)
    weights = torch.randn(2, len(NAMES), 32, generator=gen)
    got = shared.features(ctx)
    (got_grad,) = torch.autograd.grad((got * weights).sum(), ctx)
    want = whole.features(ctx)
    (want_grad,) = torch.autograd.grad((want * weights).sum(), ctx)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert (got_grad - want_grad).abs().max() <= 1e-5 * want_grad.abs().max()
    # the saving: the prefix (SOT + 4 context tokens) runs once per context, tails padded per bucket
    tails = (shared.eot - 5 + 1).tolist()
    expected_rows = 2 * 5 + 2 * _padded_cost(length_buckets(tails, 4), tails)
    with torch.no_grad():
        assert _c_fc_rows(model, lambda: shared.features(ctx)) == expected_rows
        assert _c_fc_rows(model, lambda: whole.features(ctx)) == 2 * len(NAMES) * whole.length
        # the last block's MLP runs on the prefix and on each class's EOT row only
        assert _c_fc_rows(model, lambda: shared.features(ctx), block=-1) == 2 * 5 + 2 * len(NAMES)
    assert expected_rows < 0.7 * 2 * len(NAMES) * whole.length


def test_towers_without_a_causal_mask_use_whole_prompts():
    tiny = make_tiny_model(seed=2)
    tiny.clip.attn_mask = None       # e.g. a text tower built with no_causal_mask
    assert not supports_prefix_sharing(tiny.clip)
    prompt = ContextPrompt(tiny, NAMES)
    assert not prompt.share_prefix
    with torch.no_grad():
        feats = prompt.features()
    tokens = open_clip.tokenize([f"a photo of a {n.replace('_', ' ')}." for n in NAMES])
    with torch.no_grad():
        want = F.normalize(tiny.clip.encode_text(tokens), dim=-1)
    torch.testing.assert_close(feats, want, rtol=0, atol=1e-5)


def test_fast_tokenize_gives_open_clips_tokens():
    # the shortcut (no ftfy on plain ASCII, per-word BPE ids kept) must not change a single token
    from shiftlab.datasets.classes import imagenet_classnames, load_templates
    from shiftlab.models.text import tokenize
    names = imagenet_classnames()
    prompts = [t.format(n) for n in names[::7] for t in load_templates()[::3]]
    prompts += [f"a photo of a {n}." for n in names]
    prompts += ["Crème brûlée &amp; co", "café’s ﬁsh", "  two   spaces\n and\ttabs ", "x " * 100, "", "A&B"]
    assert torch.equal(tokenize(prompts), open_clip.tokenize(prompts))
    assert torch.equal(tokenize(prompts, context_length=8), open_clip.tokenize(prompts, context_length=8))

"""DynaPrompt's pieces (shiftlab.methods.dynaprompt.method): the selection rule, the buffer's bookkeeping, the shared
gradient of bit-equal prompts, refusals and the online state; the whole method against its authors' code is
tests/test_golden_dynaprompt.py."""
from __future__ import annotations

import io
import types

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from shiftlab.methods.base import effective_config
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.methods.dynaprompt.method import DynaPrompt, ranking, select_prompts

CLASSNAMES = ["cat", "dog", "car", "tree", "boat", "house"]


@pytest.fixture(scope="module")
def heads(tiny_model):
    return ClassHeads(tiny_model, CLASSNAMES)


def _ctx(tiny_model, heads, seed: int, views: int = 8) -> SampleContext:
    gen = torch.Generator().manual_seed(seed)
    centre = heads.zeroshot[seed % len(CLASSNAMES)]
    feats = F.normalize(centre + 0.5 * torch.randn(views, centre.shape[0], generator=gen), dim=-1)
    return SampleContext(tiny_model, heads, torch.zeros(views, 3, 1, 1), image_features=feats)


def _method(tiny_model, heads, **kw) -> DynaPrompt:
    return shiftlab.create_method("dynaprompt", tiny_model, CLASSNAMES, heads=heads, **kw)


# -- the selection rule -----------------------------------------------------------------------------

def test_equal_statistics_rank_by_index_or_as_topk_orders_them():
    values = torch.tensor([1.0, 3.0, 1.0, 2.0, 1.0])
    assert ranking(values, "stable") == [1, 3, 0, 2, 4]
    assert ranking(values, "topk") == values.topk(5).indices.tolist()


def test_all_prompts_equal_selects_the_initial_prompt_alone():
    same = torch.ones(4)
    assert select_prompts(same, same, initial=2) == [2]       # stable: it ranks after every equal prompt before it
    assert select_prompts(same, same, initial=0) == [0]


def test_the_intersection_is_read_as_positions_in_the_entropy_order():
    # entropy order (highest first): 3, 0, 2, 1 -> the initial prompt 0 ranks 1; lower entropy: {2, 1}
    ent = torch.tensor([0.8, 0.1, 0.5, 0.9])
    # plpd order: 1, 3, 0, 2 -> the top 1 by plpd: {1}; intersection {1}
    plpd = torch.tensor([0.3, 0.9, 0.1, 0.5])
    assert select_prompts(ent, plpd, initial=0) == [0, 0]              # ent_order[1] is prompt 0 itself
    assert select_prompts(ent, plpd, initial=0, intersection="prompts") == [1, 0]
    # initial prompt 3 ranks first: nothing has a higher entropy, so nothing is in the top 0 by plpd
    assert select_prompts(ent, plpd, initial=3) == [3]
    # initial 1 ranks last: their clamp keeps it as its own "lower" prompt, and it is in plpd's top 3
    assert select_prompts(ent, plpd, initial=1) == [0, 1]             # position 1 of the entropy order: prompt 0
    assert select_prompts(ent, plpd, initial=1, intersection="prompts") == [1, 1]


# -- the buffer along a stream ----------------------------------------------------------------------

def test_each_sample_uses_the_oldest_prompt_and_refreshes_it_once_all_are_used(tiny_model, heads):
    method = _method(tiny_model, heads, n_prompts=3)
    for seed in range(8):
        order, uses = list(method.order), list(method.uses)
        before = method.residuals.clone()
        out = method.predict_context(_ctx(tiny_model, heads, seed))
        chosen = out.extras["prompts"]
        assert chosen[-1] == order[0]                     # the least recently used prompt, last
        expect = order[0] if min(uses) > 0 else -1
        assert out.extras["refreshed"] == expect
        if expect >= 0:
            uses[expect] = 0
            before[expect] = 0
        for p in chosen:                                  # moved to the end, counted (twice if chosen twice)
            order.remove(p)
            order.append(p)
            uses[p] += 1
        assert method.order == order and method.uses == uses
        # the prompts not chosen only decay (AdamW's weight decay reaches the whole buffer)
        for p in set(range(3)) - set(chosen):
            torch.testing.assert_close(method.residuals[p], before[p] * (1 - 5e-3 * 0.01), rtol=0, atol=1e-12)
        assert all(method.residuals[p].abs().max() > 1e-3 for p in set(chosen))
    assert method.seen == 8


def test_without_refresh_prompts_keep_their_residuals(tiny_model, heads):
    method = _method(tiny_model, heads, n_prompts=2, refresh=False)
    outs = [method.predict_context(_ctx(tiny_model, heads, s)) for s in range(5)]
    assert all(o.extras["refreshed"] == -1 for o in outs) and min(method.uses) > 0
    assert sum(method.uses) == sum(len(o.extras["prompts"]) for o in outs)


def test_several_steps_select_and_count_at_every_step(tiny_model, heads):
    method = _method(tiny_model, heads, n_prompts=4, steps=3)
    method.predict_context(_ctx(tiny_model, heads, 0))
    steps = method.last["steps"]
    assert len(steps) == 3 and sum(method.uses) == sum(len(s["chosen"]) for s in steps)


def test_an_overflowing_scaled_gradient_skips_the_whole_step(tiny_model, heads, monkeypatch):
    """Under fp16 (CUDA) the loss is scaled; as GradScaler, a non-finite gradient skips the optimiser step,
    weight decay included, and the bookkeeping stands."""
    method = _method(tiny_model, heads, n_prompts=3)
    method.predict_context(_ctx(tiny_model, heads, 0))
    before = method.residuals.clone()
    scaled = types.SimpleNamespace(loss_scaling=True, autocast=method.precision.autocast)
    monkeypatch.setattr(method, "precision", scaled)
    real = method.loss_and_grad

    def overflowing(features, residuals, chosen, scale):
        assert scale == 1000.0
        grad, info = real(features, residuals, chosen, scale)
        grad[chosen[0], 0, 0] = float("inf")
        return grad, info
    monkeypatch.setattr(method, "loss_and_grad", overflowing)
    out = method.predict_context(_ctx(tiny_model, heads, 1))
    assert torch.equal(method.residuals, before) and sum(method.uses) == 1 + len(out.extras["prompts"])


def test_the_output_is_view_zeros_logits_averaged_over_the_chosen_prompts(tiny_model, heads):
    method = _method(tiny_model, heads, n_prompts=3)
    ctx = _ctx(tiny_model, heads, 4)
    out = method.predict_context(ctx)
    chosen = out.extras["prompts"]
    with torch.no_grad():
        text = method.prompt.features(method.prompt.init_ctx + method.residuals[chosen])      # (k, C, D)
    want = (tiny_model.logit_scale * text @ ctx.image_features[0]).mean(0)
    torch.testing.assert_close(out.logits, want, rtol=0, atol=1e-5)


def test_bit_equal_prompts_get_their_own_gradients_from_one_forward(tiny_model, heads):
    method = _method(tiny_model, heads, n_prompts=4)
    gen = torch.Generator().manual_seed(3)
    residuals = torch.zeros_like(method.residuals)
    residuals[2] = 1e-2 * torch.randn(residuals.shape[1:], generator=gen)
    features = _ctx(tiny_model, heads, 5).image_features
    chosen = [0, 2, 1, 0]                                 # 0 and 1 are equal (fresh); 0 twice
    grad, info = method.loss_and_grad(features, residuals, chosen, 1.0)
    # the reference: every prompt id its own forward (no sharing), the loss of the same columns
    ids = sorted(set(chosen))
    leaf = residuals[ids].clone().requires_grad_(True)
    with torch.enable_grad():
        logits = method._view_logits(features, leaf)[:, [ids.index(p) for p in chosen]]
        views = info["views"]
        logp = logits[views] - logits[views].logsumexp(-1, keepdim=True)
        avg = logp.logsumexp(0) - torch.log(torch.tensor(float(len(views))))
        loss = -(avg * avg.exp()).sum(-1).mean()
        (ref,) = torch.autograd.grad(loss, leaf)
    torch.testing.assert_close(info["loss"], loss.detach(), rtol=0, atol=1e-6)
    scale = float(ref.abs().max())
    for p in ids:      # float32 sums in another order: relative to the largest entry, as GRAD_RTOL
        torch.testing.assert_close(grad[p], ref[ids.index(p)], rtol=0, atol=1e-5 * scale)
    assert not grad[3].any()                              # not chosen: no gradient
    torch.testing.assert_close(grad[0], 2 * grad[1], rtol=0, atol=0)   # equal prompts, multiplicities 2 and 1


def test_prompts_tuned_together_from_equal_states_stay_bit_equal(tiny_model, heads):
    method = _method(tiny_model, heads, n_prompts=4, intersection="prompts")
    features = _ctx(tiny_model, heads, 1).image_features
    grad, _ = method.loss_and_grad(features, torch.zeros_like(method.residuals), [1, 0], 1.0)
    assert torch.equal(grad[0], grad[1]) and grad[0].any()
    assert method.groups(torch.zeros(4, 2, 3)).tolist() == [0, 0, 0, 0]
    assert method.groups(torch.tensor([[1.0], [-0.0], [0.0], [1.0]])).tolist() == [0, 1, 1, 0]


# -- configuration, refusals, protocols ---------------------------------------------------------------

@pytest.mark.parametrize("kw, message", [
    ({"n_prompts": 1}, "n_prompts"), ({"ties": "random"}, "ties"), ({"intersection": "ids"}, "intersection"),
    ({"lr": -1.0}, "lr"), ({"selection_ratio": 0.0}, "selection_ratio"), ({"ctx_init": "  "}, "ctx_init"),
    ({"views": 1}, "at least 2 views"),
])
def test_bad_values_are_refused_with_one_line(tiny_model, heads, kw, message):
    with pytest.raises(ValueError, match=message) as err:
        _method(tiny_model, heads, **kw)
    assert "\n" not in str(err.value)


def test_predict_refuses_one_view(tiny_model, heads):
    method = _method(tiny_model, heads)
    views = tiny_model.normalize(torch.rand(1, 3, tiny_model.image_size, tiny_model.image_size))
    with pytest.raises(ValueError, match="at least 2 views"):
        method.predict(views)


def test_paper_protocol_is_the_authors_precision_ties_and_views():
    cfg = effective_config("dynaprompt", "paper", dataset="imagenet-r")
    assert (cfg.precision, cfg.ties, cfg.n_prompts, cfg.lr, cfg.views.n_views, cfg.views.augmix) == (
        "fp16", "topk", 12, 5e-3, 64, False)
    assert effective_config("dynaprompt", "paper", dataset="flowers102").views.augmix is True
    assert effective_config("dynaprompt", "leaderboard", dataset="flowers102").views.augmix is False
    assert DynaPrompt.protocols["paper"] == {"precision": "fp16", "ties": "topk"}
    for dataset, values in DynaPrompt.dataset_settings.items():
        assert effective_config("dynaprompt", "paper", dataset=dataset).views.augmix == values["views"]["augmix"]


# -- online state -------------------------------------------------------------------------------------

def test_state_round_trip_restores_buffer_order_and_counts(tiny_model, heads):
    whole = _method(tiny_model, heads, n_prompts=3)
    ctxs = [_ctx(tiny_model, heads, s) for s in range(10)]
    want = [whole.predict_context(c) for c in ctxs]
    first = _method(tiny_model, heads, n_prompts=3)
    for c in ctxs[:6]:
        first.predict_context(c)
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    second = _method(tiny_model, heads, n_prompts=3)
    second.load_state_dict(state)
    assert (second.order, second.uses, second.seen) == (first.order, first.uses, 6)
    for c, w in zip(ctxs[6:], want[6:]):
        got = second.predict_context(c)
        assert torch.equal(got.logits, w.logits) and got.extras == w.extras
    assert torch.equal(second.residuals, whole.residuals)


def test_a_state_of_another_buffer_is_refused(tiny_model, heads):
    state = _method(tiny_model, heads, n_prompts=3).state_dict()
    with pytest.raises(ValueError, match="shape"):
        _method(tiny_model, heads, n_prompts=4).load_state_dict(state)
    with pytest.raises(ValueError, match="permutation"):
        _method(tiny_model, heads, n_prompts=3).load_state_dict({**state, "order": [0, 0, 1]})
    with pytest.raises(ValueError, match="version"):
        _method(tiny_model, heads, n_prompts=3).load_state_dict({**state, "version": 99})

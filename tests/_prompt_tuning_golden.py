"""The golden comparison the TPT-family variants share (O-TPT, A-TPT, N-TPT): each variant run on the golden views of
a few samples, every value their authors' code saved (the confident views, the losses, each AdamW step's context
gradient and context, the tuned logits, the class text features) read back under its key and compared."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

import shiftlab
from _golden import (
    FEATURES,
    GRAD_RTOL,
    LOGITS,
    PARAMS,
    OptimizerStepRecorder,
    assert_close,
    assert_selection_margin,
    entropy_tolerance,
)
from shiftlab import ClassHeads, SampleContext
from shiftlab.methods.common.confidence import entropy


def run_variants(name: str, model: shiftlab.ClipModel, classnames: Sequence[str], views: torch.Tensor,
                 variants: Mapping[str, dict[str, Any]], samples: Iterable[int],
                 scalars: Sequence[str]) -> dict[str, torch.Tensor]:
    """Method `name` under each variant's config on `views[i]` (N, 3, S, S) in [0, 1] for i in `samples`: the
    fixture's keys `<variant>/<i>/<value>` (`scalars` read from the output's extras) and `<variant>/text_features`."""
    heads = ClassHeads(model, classnames)
    got: dict[str, torch.Tensor] = {}
    for variant, config in variants.items():
        method = shiftlab.create_method(name, model, classnames, heads=heads, **config)
        for i in samples:
            ctx = SampleContext(model, heads, model.normalize(views[i]))
            with OptimizerStepRecorder() as rec:
                out = method.predict_context(ctx)
            p = f"{variant}/{i}/"
            got[p + "selected"] = torch.tensor(out.extras["selected"])
            for scalar in scalars:
                got[p + scalar] = torch.tensor(out.extras[scalar])
            got[p + "logits"] = out.logits
            got[p + "view_logits"] = ctx.zeroshot_view_logits
            for s, (g, c) in enumerate(zip(rec.grad, rec.param)):
                got[p + f"s{s}/ctx_grad"], got[p + f"s{s}/ctx"] = g[0], c[0]
        got[f"{variant}/text_features"] = heads.zeroshot
    return got


def key_failures(expected: Mapping[str, torch.Tensor], got: Mapping[str, torch.Tensor], variant: str, *,
                 n_samples: int, steps: int, scalars: Sequence[str], scalar_tol: Callable[[torch.Tensor], float],
                 logits_tol: float) -> list[str]:
    """One line per key of `variant` that differs from the fixture beyond its tolerance (empty: all agree); a missing
    or extra key fails too. The confident views must match as sets wherever the fixture's entropy margin allows."""
    keys = sorted(k for k in expected if k.startswith(variant + "/"))
    wanted = 1 + n_samples * (len(scalars) + 2 + 2 * steps)
    if len(keys) != wanted:
        return [f"{variant}: {len(keys)} keys in the fixture, {wanted} expected: {keys}"]
    failures = []
    for key in keys:
        name = key.rsplit("/", 1)[-1]
        want = expected[key]
        try:
            assert key in got, f"{key}: not computed"
            have = got[key].detach().float()
            assert have.shape == want.shape, f"{key}: shape {tuple(have.shape)} != {tuple(want.shape)}"
            if name == "selected":
                view_logits = got[key.rsplit("/", 1)[0] + "/view_logits"]
                assert_selection_margin(entropy(view_logits), len(want), entropy_tolerance(view_logits, LOGITS), key)
                assert sorted(have.tolist()) == sorted(want.tolist()), f"{key}: {have.tolist()} != {want.tolist()}"
            elif name == "ctx_grad":
                err, scale = float((have - want).abs().max()), float(want.abs().max())
                assert err <= GRAD_RTOL * scale, f"{key}: max error {err:.3g} vs max|want| {scale:.3g}"
            elif name == "ctx":
                assert_close(have, want, PARAMS, key)
            elif name in scalars:
                assert_close(have, want, scalar_tol(want), key)
            elif name == "text_features":
                assert_close(have, want, FEATURES, key)
            else:
                assert name == "logits", key
                assert_close(have, want, logits_tol, key)
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0] if str(exc) else key)
    return failures

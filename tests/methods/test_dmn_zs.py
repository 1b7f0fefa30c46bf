"""DMN-ZS against its authors' own code on a 24-sample stream (tests/fixtures/golden/online, dmn*.pt).

The fixtures hold, after every sample, the authors' output and their memory contents
(tools/golden/make_golden.py made them from YBZh/DMN, float32 on the CPU). shiftlab runs the same
stream, sample by sample, and its state_dict() must hold the same entries in the same order.

Tolerances (tests/_golden.py; the authors' OpenAI attention pool runs one query, open_clip's
all of them, which moves features by ~1e-6, see golden/README.md): features FEATURES, entropies
and probabilities LOSS; labels, counts and orders exactly, the pseudo-labels that choose a memory
slot after a top-1 margin check.
"""
from __future__ import annotations

import json

import pytest
import torch

import shiftlab
from _golden import (
    FEATURES,
    LOSS,
    assert_close,
    assert_selection_margin,
    assert_top1_margin,
    entropy_tolerance,
    online_fixture,
    previous_entries,
    slot_gap,
    stream_views,
)
from shiftlab.methods.common.confidence import n_selected
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.methods.head_kinds import text_head

pytestmark = pytest.mark.usefixtures("one_thread")


# -- DMN-ZS -------------------------------------------------------------------------------------

@pytest.mark.golden
@pytest.mark.slow
@pytest.mark.parametrize("name,memory_size", [("dmn", 50), ("dmn_small", 2)])
def test_dmn_zs_matches_the_authors_code_sample_by_sample(golden_model, golden_dir, tmp_path, name, memory_size):
    model, classnames = golden_model
    want, info = online_fixture(golden_dir, name)
    assert info["memory_size"] == memory_size and info["text_prompt"] == "tip_cupl"
    cupl_file = tmp_path / "cupl.json"          # the stand-in descriptions, as a user would supply CuPL's file
    cupl_file.write_text(json.dumps(info["descriptions"]))
    heads = ClassHeads(model, classnames)
    dmn = shiftlab.create_method("dmn_zs", model, classnames, heads=heads, memory_size=memory_size,
                                 text_head="tip_cupl", cupl_file=str(cupl_file))
    assert_close(text_head(dmn), want["text_features"], FEATURES, "tip_cupl text features")
    assert (dmn.config.beta, dmn.config.view_ratio) == (info["beta"], info["selection_p"])
    assert dmn.config.views.n_views == info["n_views"]
    w = dmn.config.dynamic_weight
    worst: dict[str, float] = {}
    close_calls: list[tuple[int, float]] = []
    replaced = 0
    for i, views in enumerate(stream_views(golden_dir, info["n_views"])):
        ctx = SampleContext(model, heads, model.normalize(views))
        view_probs, init = want[f"{i}/view_probs"], want[f"{i}/init_pred"]
        view_entropy = -(view_probs * (view_probs + 1e-6).log()).sum(-1)
        assert_selection_margin(view_entropy, n_selected(len(views), dmn.config.view_ratio),
                                entropy_tolerance(view_probs.log()), f"sample {i}: selected views")
        # the pseudo-label is the argmax of the selected views' mean probability, held to LOSS here
        mine = (model.logit_scale * ctx.image_features[:len(views)].float() @ text_head(dmn).T).softmax(-1)
        kept = torch.argsort(view_entropy, stable=True)[:n_selected(len(views), dmn.config.view_ratio)]
        assert_close(mine[kept].mean(0), init, LOSS, f"sample {i}: mean probability")
        assert_top1_margin(init, LOSS, f"sample {i}: pseudo-label")
        # a replacement decided by less than 2 LOSS could go the other way on another machine: that
        # sample's memory contents and output are not compared, and the authors' memory is loaded
        gap = slot_gap(previous_entries(want, i, "memory", "labels"), previous_entries(want, i, "memory", "entropies"),
                        int(init.argmax()), float(-(init * (init + 1e-8).log()).sum()), memory_size)
        out = dmn.predict_context(ctx)
        assert out.extras["pseudo_label"] == int(want[f"{i}/init_pred"].argmax()), f"sample {i}: pseudo-label"
        memory = dmn.state_dict()["memory"]
        assert memory["labels"] == want[f"{i}/memory/labels"].tolist(), f"sample {i}: memory labels"
        if not gap > 2 * LOSS:
            close_calls.append((i, gap))
            dmn.load_state_dict({**dmn.state_dict(), "memory": {
                "capacity": memory_size, "labels": memory["labels"], "features": want[f"{i}/memory/features"],
                "entropies": want[f"{i}/memory/entropies"]}})
            continue
        worst["memory features"] = max(worst.get("memory features", 0), assert_close(
            memory["features"], want[f"{i}/memory/features"], FEATURES, f"{i} memory features"))
        assert_close(memory["entropies"], want[f"{i}/memory/entropies"], LOSS, f"{i} memory entropies")
        # the authors' output is p_zs + beta2 * p_dyn with beta2 searched on the test labels;
        # shiftlab's is the same mixture with a fixed w, normalised: (p_zs + w p_dyn) / (1 + w)
        p_zs, p_dyn = want[f"{i}/view_probs"][0], want[f"{i}/p_dyn"]
        worst["probs"] = max(worst.get("probs", 0), assert_close(out.probs, (p_zs + w * p_dyn) / (1 + w), LOSS,
                                                           f"{i} probs"))
        replaced += int(len(memory["labels"]) < i + 1)
    if name == "dmn_small":
        assert replaced > 0                                     # the stream exercises the replacement rule
    assert len(close_calls) <= 2, f"too many decisions within 2 LOSS to compare: {close_calls}"
    print(name, "largest differences:", worst, "decisions too close to compare:", close_calls)

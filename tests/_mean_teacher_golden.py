"""The golden checks CoTTA's and RMT's tests share (tests/methods/test_cotta.py, test_rmt.py): after a batch, a
mean-teacher method's student and teacher weights and SGD's momentum against the rows their drivers record with
tools/golden/mariodoebler.weight_rows."""
from __future__ import annotations

import torch

from _golden import GRAD_RTOL, NORM_PARAMS, assert_close

MOVED_RTOL = 1e-3
"""A weight's summed distance from the source, sum |w - w_source| over its entries, relative (+1e-6): measured 5e-5."""
AT_SOURCE = 0.02
"""The entries of a weight at their source value: restored ones (the same draws) and those whose steps are below an
ulp, as the entries of a gradient that is float noise (a ResNet attention pool's key bias, which the softmax
ignores): allowed 1 + 2% of their count off (measured 0 on the ViT's augmented and plain CoTTA variants, 1 in 800 on
the episodic one, 7 of 480 on the ResNet's key bias)."""


def check_weights(method, want: dict, b: int, head: int, moved_rtol: float = MOVED_RTOL, restores: bool = True) -> None:
    """`method` (CoTTA, RMT: a student `tower`, a `teacher.tower`, an SGD optimiser) after batch `b` against the
    fixture `want`: the first `head` entries of every student and teacher weight (NORM_PARAMS) and momentum buffer
    (GRAD_RTOL of its largest), each weight's distance from the source (`moved_rtol`) and, for a method that
    `restores` entries to the source (CoTTA), its entries at the source (AT_SOURCE; without a restore the count is
    of the entries whose steps stayed below an ulp, float noise)."""
    momentum = method.optimizer.state_dict()["state"]
    student = method.tower.adapted_parameters()
    teacher = method.teacher.tower.adapted_parameters()
    source = [method._initial_norm[n] for n in method.tower.parameter_names]
    for i, name in enumerate(method.tower.parameter_names):
        n = min(head, student[i].numel())
        assert_close(student[i].flatten()[:n], want[f"{b}/student"][i, :n], NORM_PARAMS, f"batch {b} {name}")
        assert_close(teacher[i].flatten()[:n], want[f"{b}/teacher"][i, :n], NORM_PARAMS, f"batch {b} teacher {name}")
        theirs_m = want[f"{b}/momentum"][i, :n]
        scale = max(float(theirs_m.abs().max()), 1e-3)
        assert_close(momentum[i]["momentum_buffer"].flatten()[:n], theirs_m, GRAD_RTOL * scale,
                     f"batch {b} momentum {name}")
        for key, tower in (("student_moved", student), ("teacher_moved", teacher)):
            moved = float((tower[i].detach().double() - source[i].double()).abs().sum())
            theirs = float(want[f"{b}/{key}"][i])
            assert abs(moved - theirs) <= moved_rtol * theirs + 1e-6, f"batch {b} {key} {name}: {moved} vs {theirs}"
        at_source, theirs_at = int((student[i] == source[i]).sum()), int(want[f"{b}/at_source"][i])
        assert not restores or abs(at_source - theirs_at) <= 1 + AT_SOURCE * theirs_at, f"batch {b} at source {name}"
    assert float(want[f"{b}/student_moved"].sum()) > 0 and float(want[f"{b}/teacher_moved"].sum()) > 0
    assert torch.isfinite(want[f"{b}/logits"]).all()

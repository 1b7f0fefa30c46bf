"""OGA: its pieces against straightforward computations, its config checks, a run through the CLI, and its
authors' own code on the golden stream (tests/fixtures/golden/oga, made by the driver beside the fixtures
from github.com/cfuchs2023/OGA's `runner.run`, float32 on the CPU).

Golden checks, two ways. Fed the authors' own prototypes and features, shiftlab's update must agree to
float32 rounding (`replay`: memory, means and slot entropies exactly where no float16 rounding could go
either way; probabilities LOSS; the inverse covariance INVERSE relative to its largest entry: the authors
form a pseudo-inverse, shiftlab solves with a Cholesky factor, and the pseudo-inverse of a rank-deficient
covariance moves by 3.3e-5 relative, measured). Through shiftlab's own encoders the features are within
FEATURES of theirs, but the authors round the prototypes and the memory to float16 (utils.py:377,
OGA_core.py:23): a value within 1e-6 of a float16 rounding boundary rounds to the neighbouring step, one
float16 step (HALF_STEP relative) apart, which moves the zero-shot logits by up to 100 x 2.4e-4 x |x_j|:
probabilities then ENCODED (5e-5; measured 2.8e-5), likelihoods ENCODED_REL relative (5e-4; measured 2.0e-4);
slots, pseudo-labels and predictions exactly, each after a margin check.
"""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FEATURES, LOSS, assert_close, assert_top1_margin, check_margin, stream_views
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.methods.oga.method import class_means, gaussian_log_likelihoods, map_posterior, zero_shot

CLASSNAMES = ["cat", "dog", "car", "tree", "boat", "house"]
HALF_STEP = 2.0 ** -10          # float16's spacing relative to a value (10 fraction bits)
INVERSE = 1e-4                  # the inverse covariance, relative to its largest entry (replay)
ENCODED, ENCODED_REL = 5e-5, 5e-4
ESTIMATOR = {"RidgeMoorePenrose": "ridge-moore-penrose", "Ridge": "ridge", "MoorePenrose": "moore-penrose"}

pytestmark = pytest.mark.usefixtures("one_thread")


def _unit(*shape: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


# -- the pieces ---------------------------------------------------------------------------------------

def test_class_means_divide_by_every_slot_not_by_the_filled_ones():
    memory = torch.tensor([[[1.0, 2.0], [3.0, 6.0], [5.0, 5.0], [7.0, 7.0]]]).half()
    filled = torch.tensor([[True, True, False, False]])
    # the authors' mean over all 4 slots of filled * memory: (1 + 3) / 4, (2 + 6) / 4 (OGA_core.py:89)
    assert class_means(memory, filled).tolist() == [[1.0, 2.0]]


def test_log_likelihoods_are_the_gaussian_quadratic_form():
    x, means = _unit(5, seed=0), _unit(3, 5, seed=1)
    a = torch.randn(5, 5, generator=torch.Generator().manual_seed(2))
    precision = a @ a.T + torch.eye(5)
    w = precision @ means.T
    b = -0.5 * (means.T * w).sum(0)
    got = gaussian_log_likelihoods(x, w, b, precision @ x)
    want = torch.tensor([-0.5 * float((x - m) @ precision @ (x - m)) for m in means])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_map_posterior_is_prior_times_tempered_likelihood_renormalised():
    prior = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    ll = torch.tensor([-10.0, -2.0, -4.0])
    evidence = [math.exp(0.5 * v) for v in ll.tolist()]
    raw = [p * e / sum(evidence) for p, e in zip(prior.tolist(), evidence)]
    want = torch.tensor([r / sum(raw) for r in raw], dtype=torch.float64)
    torch.testing.assert_close(map_posterior(prior, ll, 0.5), want)


def test_zero_shot_prior_and_entropy_follow_the_authors_formula():
    x, protos = _unit(4, seed=3), _unit(3, 4, seed=4)
    logits = [100 * float(x @ p) for p in protos]
    exps = [math.exp(v - max(logits)) for v in logits]
    probs = [e / sum(exps) for e in exps]
    prior, entropy = zero_shot(x, protos, 100.0)
    torch.testing.assert_close(prior, torch.tensor(probs, dtype=torch.float64), rtol=0, atol=1e-6)
    assert float(entropy) == pytest.approx(-sum(p * math.log(p + 1e-9) for p in probs), abs=1e-6)


def _stream(model, heads, n: int, seed: int = 5) -> list[SampleContext]:
    gen = torch.Generator().manual_seed(seed)
    centres = heads.zeroshot
    ctxs = []
    for i in range(n):
        feat = F.normalize(centres[i % 3] + 0.4 * torch.randn(centres.shape[1], generator=gen), dim=-1)
        ctxs.append(SampleContext(model, heads, torch.zeros(1, 3, 1, 1), image_features=feat[None]))
    return ctxs


@pytest.mark.parametrize("estimator", ["ridge-moore-penrose", "moore-penrose"])
def test_incremental_covariance_equals_the_authors_recomputation(tiny_model, estimator):
    """shiftlab keeps the scatter of the stored offsets up to date per class; the authors recompute it from
    the whole memory (OGA_core.py:106-121). After 40 samples with 2 slots per class (evictions) both agree."""
    heads = ClassHeads(tiny_model, CLASSNAMES)
    oga = shiftlab.create_method("oga", tiny_model, CLASSNAMES, heads=heads, shot_capacity=2, estimator=estimator)
    stored = sum(oga.predict_context(c).extras["stored"] for c in _stream(tiny_model, heads, 40))
    assert stored > int(oga.filled.sum())                     # some slots were overwritten
    assert oga.estimated is False                             # 2 slots: no class ever holds 3 (theirs: > 2)
    big = shiftlab.create_method("oga", tiny_model, CLASSNAMES, heads=heads, shot_capacity=4, estimator=estimator)
    for c in _stream(tiny_model, heads, 40):
        big.predict_context(c)
    assert big.estimated
    offsets = torch.cat([big.memory[k][big.filled[k]].float() - big.means[k] for k in range(len(CLASSNAMES))])
    want_cov = offsets.T.cov()
    torch.testing.assert_close(big.covariance(), want_cov, rtol=0, atol=1e-6)
    n, d = offsets.shape
    if estimator == "ridge-moore-penrose":     # n <= 4d: the ridge estimator
        want_p = d * torch.linalg.pinv((n - 1) * want_cov + torch.trace(want_cov) * torch.eye(d))
    else:
        want_p = torch.linalg.pinv(want_cov)
    scale = float(want_p.abs().max())
    torch.testing.assert_close(big.precision_matrix() / scale, want_p / scale, rtol=0, atol=1e-4)
    # a mean over all slots of the filled ones, float16 as theirs
    k = int(big.filled.sum(1).argmax())
    torch.testing.assert_close(big.means[k], (big.memory[k] * big.filled[k, :, None]).mean(0).float())


def test_a_sample_enters_only_below_the_classes_worst_entropy(tiny_model):
    heads = ClassHeads(tiny_model, CLASSNAMES)
    oga = shiftlab.create_method("oga", tiny_model, CLASSNAMES, heads=heads, shot_capacity=1)
    x = heads.zeroshot[2].float()
    first = oga.step(x)
    assert first["stored"] and first["pseudo_label"] == 2
    assert not oga.step(x)["stored"]              # an equal entropy (float16-stored) does not replace it
    assert int(oga.filled.sum()) == 1 and float(oga.entropies[2, 0]) == pytest.approx(float(first["entropy"]),
                                                                                       rel=HALF_STEP)


def test_config_ranges_are_refused_in_one_line(tiny_model):
    for bad, match in (({"shot_capacity": 0}, "shot_capacity"), ({"tau": 0.0}, "tau"),
                       ({"estimator": "cholesky"}, "estimator")):
        with pytest.raises(ValueError, match=match) as err:
            shiftlab.create_method("oga", tiny_model, CLASSNAMES, **bad)
        assert "\n" not in str(err.value)


def test_a_state_of_another_capacity_is_refused(tiny_model):
    heads = ClassHeads(tiny_model, CLASSNAMES)
    a = shiftlab.create_method("oga", tiny_model, CLASSNAMES, heads=heads, shot_capacity=2)
    b = shiftlab.create_method("oga", tiny_model, CLASSNAMES, heads=heads, shot_capacity=3)
    with pytest.raises(ValueError, match="shot_capacity 2, this run has 3"):
        b.load_state_dict(a.state_dict())


# -- the authors' code (tests/fixtures/golden/oga) --------------------------------------------------------

def _fixture(golden_dir, variant):
    info = json.loads((golden_dir / "oga" / "oga.json").read_text())["fixtures"][variant]
    return torch.load(golden_dir / "oga" / f"{variant}.pt", map_location="cpu", weights_only=True), info


def _oga(model, classnames, heads, info):
    a = info["arguments"]
    return shiftlab.create_method("oga", model, classnames, heads=heads, logit_scale=100.0,   # runner.py's literal
                                  shot_capacity=a["shot_capacity"], tau=a["tau"], estimator=ESTIMATOR[a["sig_type"]],
                                  normalize_mu=a["normalize_mu"])


def _assert_half_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Equal within one float16 step of each value (a float within tolerance of a rounding boundary)."""
    got, want = got.double(), want.double()
    assert got.shape == want.shape, what
    excess = (got - want).abs() - (HALF_STEP * want.abs() + FEATURES)
    assert excess.numel() == 0 or float(excess.max()) <= 0, f"{what}: off by more than one float16 step"


def _check_state(oga, want, i: int, exact: bool) -> None:
    assert torch.equal(oga.filled.nonzero(), want[f"{i}/slots"]), f"{i} filled slots"
    moved = oga.filled.sum(1) >= 2
    assert torch.equal(moved.nonzero()[:, 0], want[f"{i}/mu_rows"]), f"{i} classes with a mean"
    assert torch.equal(oga.entropies[~oga.filled], want[f"{i}/free_entropy"]), f"{i} empty slots' entropy"
    pairs = ((oga.memory[oga.filled], want[f"{i}/slot_features"], "memory"),
             (oga.soft_labels[oga.filled], want[f"{i}/slot_soft_labels"], "soft labels"),
             (oga.entropies[oga.filled], want[f"{i}/slot_entropy"], "slot entropies"),
             (oga.means[moved], want[f"{i}/mu_values"], "means"))
    for got, ref, what in pairs:
        if exact and what != "slot entropies":     # entropies: float64 within LOSS, then float16
            assert torch.equal(got, ref), f"{i} {what}"
        else:
            _assert_half_close(got, ref, f"{i} {what}")
    p, ref = oga.precision_matrix(), want[f"{i}/inv_sig"]
    scale = float(ref.abs().max())
    assert_close(p / scale, ref / scale, INVERSE if exact else ENCODED_REL, f"{i} inverse covariance")


def _check_decisions(oga, s: dict, want, i: int, tol: float) -> None:
    """The stored / not stored decision and the prediction are portable: margin checks, then exact."""
    k = s["pseudo_label"]
    assert k == int(want[f"{i}/zs_label"]), f"{i} pseudo-label"
    assert s["stored"] == bool(want[f"{i}/updated"]), f"{i} stored"
    prev = want[f"{i - 1}/slots"] if i else torch.zeros(0, 2, dtype=torch.int64)
    if int((prev[:, 0] == k).sum()) >= oga.config.shot_capacity:    # a full class: the entropy decides
        worst = float(want[f"{i - 1}/slot_entropy"][prev[:, 0] == k].max())
        check_margin(abs(float(want[f"{i}/zs_entropy"]) - worst), tol, f"{i} replace or keep")
    assert_top1_margin(want[f"{i}/z"][None], tol, f"{i} posterior")
    assert int(s["posterior"].argmax()) == int(want[f"{i}/z"].argmax()), f"{i} prediction"


@pytest.mark.golden
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["oga", "oga_small", "oga_strong"])
def test_oga_replays_the_authors_state_from_their_inputs(golden_model, golden_dir, variant):
    model, classnames = golden_model
    want, info = _fixture(golden_dir, variant)
    oga = _oga(model, classnames, ClassHeads(model, classnames), info)
    oga.prototypes = lambda: want["prototypes"]           # their prototypes and features as inputs
    oga.reset()
    for i in range(info["n_samples"]):
        s = oga.step(want[f"{i}/feature"])
        assert_close(s["prior"], want[f"{i}/zs_probs"], LOSS, f"{i} prior")
        assert_close(s["entropy"], want[f"{i}/zs_entropy"], LOSS, f"{i} entropy")
        _check_decisions(oga, s, want, i, LOSS)
        _check_state(oga, want, i, exact=True)
        scale = float(want[f"{i}/log_probs"].abs().max())
        assert_close(s["log_likelihoods"] / scale, want[f"{i}/log_probs"] / scale, INVERSE, f"{i} log-likelihoods")
        assert_close(s["posterior"], want[f"{i}/z"], LOSS, f"{i} posterior")


@pytest.mark.golden
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["oga", "oga_small", "oga_strong"])
def test_oga_matches_the_authors_code_sample_by_sample(golden_model, golden_dir, variant):
    model, classnames = golden_model
    want, info = _fixture(golden_dir, variant)
    heads = ClassHeads(model, classnames)
    oga = _oga(model, classnames, heads, info)
    assert info["templates"] == ["a photo of a {}."]          # their ImageNet 'standard' prompt: the zeroshot head
    _assert_half_close(oga.prototypes(), want["prototypes"], "prototypes")
    changed = 0
    for i, views in enumerate(stream_views(golden_dir, 1)):
        ctx = SampleContext(model, heads, model.normalize(views))
        assert_close(ctx.base_feature, want[f"{i}/feature"], FEATURES, f"{i} feature")
        before = oga.state_dict()
        out = oga.predict_context(ctx)
        oga.load_state_dict(before)                             # the same step again, to read its pieces
        s = oga.step(ctx.base_feature.float())
        assert torch.equal(out.probs, s["posterior"].float())
        assert_close(s["prior"], want[f"{i}/zs_probs"], ENCODED, f"{i} prior")
        _check_decisions(oga, s, want, i, ENCODED)
        _check_state(oga, want, i, exact=False)
        scale = float(want[f"{i}/log_probs"].abs().max())
        assert_close(s["log_likelihoods"] / scale, want[f"{i}/log_probs"] / scale, ENCODED_REL,
                     f"{i} log-likelihoods")
        assert_close(out.probs, want[f"{i}/z"], ENCODED, f"{i} posterior")
        changed += int(want[f"{i}/z"].argmax()) != int(want[f"{i}/zs_label"])
    if variant == "oga_strong":
        assert changed > 0          # the Gaussian part decides some predictions


# -- through the command line -------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_runs_oga_from_stored_features_as_from_pixels(tmp_path, tiny_checkpoint, capsys):
    from _runs import comparable, json_lines
    from _synthetic import make_imagenet_r
    from shiftlab.cli import main as cli_main
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 25), per_class=2, size=(80, 64))
    flags = ["--dataset", "imagenet-r", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained",
             str(tiny_checkpoint), "--workers", "0", "--no-progress", "--allow-partial", "--methods", "oga",
             "--set", "oga.shot_capacity=2"]
    store = ["--features", str(tmp_path / "fs"), "--features-dtype", "fp32"]
    assert cli_main(["run", *flags, "--out", str(tmp_path / "plain")]) == 0
    assert cli_main(["encode", *flags, *store]) == 0
    assert cli_main(["run", *flags, *store, "--out", str(tmp_path / "stored")]) == 0
    assert "16 sample(s) read from the store" in capsys.readouterr().err
    plain = json_lines(tmp_path / "plain" / "records.jsonl")
    assert len(plain) == 16 and comparable(plain) == comparable(json_lines(tmp_path / "stored" / "records.jsonl"))
    # the memory filled up to the capacity along the stream, then refused samples
    assert max(r["extras"]["memory"] for r in plain) >= 2 and not all(r["extras"]["stored"] for r in plain)
    saved = json.loads((tmp_path / "plain" / "run.json").read_text())["methods"]["oga"]
    assert saved["shot_capacity"] == 2 and saved["estimator"] == "ridge-moore-penrose"


def test_cli_refuses_a_bad_value_in_one_line(tmp_path, capsys):
    from shiftlab.cli import main as cli_main
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["run", "--dataset", "imagenet-r", "--data", str(tmp_path), "--out", str(tmp_path / "run"),
                  "--methods", "oga", "--set", "oga.tau=-1"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "tau" in err and "-1" in err
    assert "Traceback" not in err and len(err.splitlines()) == 1


# -- oga_batch: their default batched loop ----------------------------------------------------------------

def _contexts(model, heads, features: torch.Tensor) -> list[SampleContext]:
    return [SampleContext(model, heads, torch.zeros(1, 3, 1, 1), image_features=f[None]) for f in features]


def test_oga_batch_of_one_is_the_online_method(tiny_model):
    heads = ClassHeads(tiny_model, CLASSNAMES)
    online = shiftlab.create_method("oga", tiny_model, CLASSNAMES, heads=heads, shot_capacity=3)
    batched = shiftlab.create_method("oga_batch", tiny_model, CLASSNAMES, heads=heads, shot_capacity=3)
    for c in _stream(tiny_model, heads, 20):
        a, b = online.predict_context(c), batched.adapt_batch([c])[0]
        assert torch.equal(a.probs, b.probs) and a.extras == b.extras
    assert online.estimated and batched.estimated


def test_oga_batch_offers_the_batch_to_the_memory_then_predicts_it(tiny_model):
    heads = ClassHeads(tiny_model, CLASSNAMES)
    ctxs = _stream(tiny_model, heads, 12)
    batched = shiftlab.create_method("oga_batch", tiny_model, CLASSNAMES, heads=heads, shot_capacity=3)
    outs = batched.adapt_batch(ctxs[:6]) + batched.adapt_batch(ctxs[6:])
    # by hand: the memory takes the first six, then all six are predicted with the model after them
    ref = shiftlab.create_method("oga", tiny_model, CLASSNAMES, heads=heads, shot_capacity=3)
    for start in (0, 6):
        half = ctxs[start:start + 6]
        steps = [ref.step(c.base_feature.float()) for c in half]
        for s, c, out in zip(steps, half, outs[start:start + 6]):
            want = map_posterior(s["prior"], ref.log_likelihoods(c.base_feature.float()), ref.config.tau)
            torch.testing.assert_close(out.probs, want.float())
    assert batched.state_dict()["seen"] == 12


@pytest.mark.golden
@pytest.mark.slow
def test_oga_batch_matches_the_authors_batched_loop(golden_model, golden_dir):
    model, classnames = golden_model
    want, info = _fixture(golden_dir, "oga_batch")
    a = info["arguments"]
    heads = ClassHeads(model, classnames)
    kw = dict(heads=heads, logit_scale=100.0, shot_capacity=a["shot_capacity"], tau=a["tau"],
              estimator=ESTIMATOR[a["sig_type"]])
    replay = shiftlab.create_method("oga_batch", model, classnames, **kw)
    replay.prototypes = lambda: want["prototypes"]            # their prototypes and features as inputs
    replay.reset()
    encoded = shiftlab.create_method("oga_batch", model, classnames, **kw)
    views = stream_views(golden_dir, 1)
    size, changed = a["batch_size"], 0
    for b in range(info["n_calls"]):
        z_replay = torch.stack([o.probs for o in replay.adapt_batch(_contexts(model, heads, want[f"{b}/feature"]))])
        assert_close(z_replay, want[f"{b}/z"], LOSS, f"{b} posterior (replay)")
        assert torch.equal(replay.filled.nonzero(), want[f"{b}/slots"]), f"{b} filled slots"
        assert torch.equal(replay.memory[replay.filled], want[f"{b}/slot_features"]), f"{b} memory"
        batch = [SampleContext(model, heads, model.normalize(v)) for v in views[b * size:(b + 1) * size]]
        assert_close(torch.stack([c.base_feature for c in batch]), want[f"{b}/feature"], FEATURES, f"{b} features")
        outs = encoded.adapt_batch(batch)
        z = torch.stack([o.probs for o in outs])
        assert_close(z, want[f"{b}/z"], ENCODED, f"{b} posterior")
        _check_state(encoded, want, b, exact=False)
        assert_top1_margin(want[f"{b}/z"], ENCODED, f"{b} posterior")
        assert z.argmax(1).tolist() == want[f"{b}/z"].argmax(1).tolist(), f"{b} predictions"
        changed += int((want[f"{b}/z"].argmax(1) != want[f"{b}/zs_label"]).sum())
    assert changed > 0 and encoded.estimated        # the Gaussian part decides some predictions

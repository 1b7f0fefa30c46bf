"""The golden fixtures as tracked (compact, lossless for what the tests compute) and as the tests read them.

tests/fixtures/golden/ stores three files in a compact form (see its README, "Provenance"):
  * ``tiny_clip_compact.pt``: the tiny CLIP's OpenAI-format state dict without the 49408x64 token
    embedding, plus the rows of the tokens that the fixtures' prompts use and their indices;
  * ``tiny_vit_compact.pt``: the same for the tiny ViT CLIP (`shiftlab-tiny-vit`, TTL's fixtures);
  * ``inputs_uint8.pt``: the views as uint8 (every value was k/255).
``materialize(dst)`` writes the files the golden tests load (tiny_clip_openai.pt, tiny_vit_openai.pt,
inputs.pt and the rest copied as they are) into ``dst``: the token embeddings are rebuilt with zero rows
for the tokens no fixture uses, the views as float32 k/255.
"""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import torch

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "golden"
TOKEN_KEY = "token_embedding.weight"
ROWS_KEY = "compact/token_embedding.rows"
INDEX_KEY = "compact/token_embedding.index"
SHAPE_KEY = "compact/token_embedding.shape"
MODEL_FILE, COMPACT_MODEL_FILE = "tiny_clip_openai.pt", "tiny_clip_compact.pt"
# the tiny ViT (shiftlab-tiny-vit) of the fixtures of methods that tune the image tower's attention (TTL)
VIT_MODEL_FILE, COMPACT_VIT_FILE = "tiny_vit_openai.pt", "tiny_vit_compact.pt"
INPUTS_FILE, COMPACT_INPUTS_FILE = "inputs.pt", "inputs_uint8.pt"


def compact_state_dict(state: dict[str, torch.Tensor], tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """``state`` with the token embedding reduced to the rows of ``tokens`` (any shape of token ids)."""
    index = torch.unique(tokens.flatten()).to(torch.int64)
    table = state[TOKEN_KEY]
    out = {k: v for k, v in state.items() if k != TOKEN_KEY}
    out[ROWS_KEY] = table[index].clone()
    out[INDEX_KEY] = index
    out[SHAPE_KEY] = torch.tensor(table.shape, dtype=torch.int64)
    return out


def full_state_dict(compact: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of ``compact_state_dict``: zero rows for the tokens that were dropped."""
    rows, index = compact[ROWS_KEY], compact[INDEX_KEY]
    table = torch.zeros(tuple(compact[SHAPE_KEY].tolist()), dtype=rows.dtype)
    table[index] = rows
    state = {k: v for k, v in compact.items() if not k.startswith("compact/")}
    state[TOKEN_KEY] = table
    return state


def compact_inputs(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    unit = inputs["views_unit"]
    as_uint8 = torch.round(unit * 255).to(torch.uint8)
    if not torch.equal(as_uint8.float() / 255, unit):
        raise ValueError("views_unit holds values that are not k/255; uint8 storage would lose them")
    return {"views_uint8": as_uint8, **{k: v for k, v in inputs.items() if k != "views_unit"}}


def full_inputs(compact: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # float32 division by 255 is what ToTensor() does, so this is bit-identical to the original
    return {"views_unit": compact["views_uint8"].float() / 255,
            **{k: v for k, v in compact.items() if k != "views_uint8"}}


def materialize(dst: Path, src: Path = FIXTURES) -> Path:
    """Write the golden folder the tests read (the format of the original fixtures) into ``dst``."""
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_dir():
            shutil.copytree(item, dst / item.name, dirs_exist_ok=True)
        elif item.name not in (COMPACT_MODEL_FILE, COMPACT_INPUTS_FILE, COMPACT_VIT_FILE):
            shutil.copyfile(item, dst / item.name)
    compact = torch.load(src / COMPACT_MODEL_FILE, map_location="cpu", weights_only=True)
    torch.save(full_state_dict(compact), dst / MODEL_FILE)
    if (src / COMPACT_VIT_FILE).is_file():
        compact = torch.load(src / COMPACT_VIT_FILE, map_location="cpu", weights_only=True)
        torch.save(full_state_dict(compact), dst / VIT_MODEL_FILE)
    compact_in = torch.load(src / COMPACT_INPUTS_FILE, map_location="cpu", weights_only=True)
    torch.save(full_inputs(compact_in), dst / INPUTS_FILE)
    return dst


def tensor_sha256(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's raw bytes (dtype and shape are checked separately)."""
    import hashlib
    return hashlib.sha256(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


# -- the online fixtures' inputs: integer crops of small base images (exact, no resampling) -------

VIEW_SIZE = 64
# Tip-Adapter's 7 ImageNet templates: the template half of DMN's `tip_cupl` text head
TIP_TEMPLATES = ["a bad photo of the {}.", "a {} in a video game.", "a origami {}.", "a photo of the small {}.",
                 "art of the {}.", "a photo of the large {}.", "itap of a {}."]


def crop_views(base_u8: torch.Tensor, n_views: int, size: int = VIEW_SIZE) -> torch.Tensor:
    """(3, H, W) uint8 -> (n_views, 3, size, size) uint8: view 0 the centre crop; view v >= 1 the
    crop at offset (p // (m + 1), p mod (m + 1)) with p = 5 v mod (m + 1)^2, m = H - size,
    mirrored for odd v. No two views are equal (for n_views <= (m + 1)^2), so no two have
    exactly equal entropies, where the authors' unstable argsort could order either way."""
    margin = base_u8.shape[-1] - size
    side = margin + 1
    views = []
    for v in range(n_views):
        p = (5 * v) % (side * side)
        y, x = (margin // 2, margin // 2) if v == 0 else (p // side, p % side)
        crop = base_u8[:, y:y + size, x:x + size]
        views.append(crop.flip(-1) if v % 2 else crop)
    return torch.stack(views)


def online_fixture(golden_dir: Path, name: str) -> tuple[dict[str, torch.Tensor], dict]:
    """One online fixture (tensors, its provenance record) from golden_dir/online."""
    import json
    info = json.loads((golden_dir / "online" / "online.json").read_text())["fixtures"][name]
    return torch.load(golden_dir / "online" / f"{name}.pt", map_location="cpu", weights_only=True), info


def batch_fixture(golden_dir: Path, folder: str, variant: str) -> tuple[dict[str, torch.Tensor], dict]:
    """A batch method's golden `variant` (tensors) and its entry in `folder`/`folder`.json's "fixtures" (what ran,
    on which tiny model, which parameters adapted)."""
    import json
    info = json.loads((golden_dir / folder / f"{folder}.json").read_text())["fixtures"][variant]
    return torch.load(golden_dir / folder / f"{variant}.pt", map_location="cpu", weights_only=True), info


def fixture_model(info: dict, golden_vit: tuple, golden_model: tuple) -> tuple:
    """(model, class names, class heads) of the golden tiny model a fixture's entry says it ran on."""
    if info["model"] == "shiftlab-tiny-vit":
        return golden_vit
    from shiftlab.methods.context import ClassHeads
    model, names = golden_model
    return model, names, ClassHeads(model, names)


def stream_views(golden_dir: Path, n_views: int) -> list[torch.Tensor]:
    """The online fixtures' stream: per sample, (n_views, 3, 64, 64) float views in [0, 1]."""
    stream = torch.load(golden_dir / "online" / "stream.pt", weights_only=True)
    return [crop_views(base, n_views).float() / 255 for base in stream["base_u8"]]


def slot_gap(labels: list[int], losses: list[float], label: int, loss: float, capacity: int) -> float:
    """A cache/memory class that is full takes a new entry iff its loss is below the class's worst: the
    distance that decides it (inf while the class has room, which needs no float). TDA's caches, DMN's memory."""
    mine = [v for lab, v in zip(labels, losses) if lab == label]
    return abs(loss - max(mine)) if len(mine) >= capacity else math.inf


def previous_entries(want: dict, i: int, cache: str, key: str) -> list:
    """The fixture's `cache/key` entries after sample i - 1 (none before the first sample)."""
    return want[f"{i - 1}/{cache}/{key}"].tolist() if i else []


# -- tolerances: comparisons with fixtures made on another machine ------------------------------
#
# float32 kernels (BLAS, oneDNN, the vectorised exp) choose their summation order and
# instruction set per CPU, so a float32 result is reproducible to its last bits only on the
# machine that made it: another x86-64 machine (AVX-512, MKL) gave the golden text features
# with max |diff| 1.1e-6, 96% of the values differing. Every float compared with a fixture uses
# one of these absolute tolerances; exact comparisons are for discrete values (tokens, indices,
# uint8 pixels, labels, counts), and a discrete result derived from floats (selected views,
# votes, argmax, cache labels) is compared exactly only after a margin check below has shown
# that no value within the tolerance could change it.

FEATURES = 1e-5
"""Unit-norm float32 features, cosine similarities and anything of that scale (text and image
features, R-TPT's similarity matrix and its top-k scores, MTA's mode). float32 spacing near 1 is
6e-8; a 64..1024-term dot product re-associated by another kernel moves a value by ~1e-6
(measured: 1.1e-6 across two x86 CPUs; 6.4e-7 between the authors' one-query attention pool and
open_clip's). 1e-5 is ~10x the largest seen, and a 100x smaller error than any real mistake
(a wrong normalisation, a missing QuickGELU, a dropped token) makes."""

LOGITS = 2e-4
"""Logits = logit_scale (100) x cosine: FEATURES-sized noise scaled by 100 (measured 1.1e-4
between the authors' code and shiftlab); golden/README.md recommends the same."""

TUNED_LOGITS = 1e-3
"""Logits through parameters tuned at test time (a prompt after several steps, LoRA weights): the inputs'
LOGITS-size difference decides the sign of gradient entries that nearly cancel, and AdamW's first step
moves such an entry by about lr whatever its size, so the tuned parameters, and every later step, carry
it; FEATURES-sized noise x 100 (measured: RLCF 1.8e-4 after 3 steps, TTL 1.0e-4 after 4, on the machine
that made the fixtures). Each step's own inputs from the authors' state are still held to LOGITS."""

PARAMS = 1e-6
"""The learnable prompt context (values ~1e-2): the initial context is a copy of fp16 token rows
(exact), and one AdamW step moves each entry by lr x m/(sqrt(v) + eps), which is lr x sign(grad)
on the first step whatever the gradient's last bits, so the result is far steadier than the
gradient itself (golden/README.md: 1e-6)."""

LOSS = 1e-5
"""Scalars of order 1 built from softmaxes of LOGITS-noisy logits and averaged (entropies,
losses, ATFD, reliability weights, MTA inlierness and bandwidth, probabilities): the average
damps the logits' noise; golden/README.md recommends 1e-5."""

GRAD_RTOL = 5e-4
"""Gradients, relative to the largest entry: a gradient is a difference of nearly equal terms,
so its absolute error has no fixed scale (golden/README.md)."""

PIXELS = 1e-6
"""Attacked pixels in [0, 1]: k/255 plus a sum of +-alpha steps, clipped, all elementwise and
correctly rounded (float32 spacing below 1 is 6e-8), so equal wherever the gradients' signs
agree; a test allows for the pixels where a near-zero gradient takes the other sign."""

RATIOS = 1e-6
"""Ratios of small integers (vote shares): a correctly rounded division is the same on every IEEE
machine, so this only allows for a normalisation on the way (a softmax of log-counts)."""

FLOAT32_UNDERFLOW_LOG = math.log(2.0 ** -150)
"""ln of half the smallest float32 subnormal: exp() of anything below rounds to exactly 0 (IEEE
float32 with subnormals, the default of x86-64 and arm64 unless flush-to-zero is turned on)."""


def assert_close(got: torch.Tensor, want: torch.Tensor, atol: float, what: str) -> float:
    """|got - want| <= atol everywhere (same shape); returns the largest difference."""
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    torch.testing.assert_close(got, want, rtol=0, atol=atol, msg=lambda m: f"{what}: {m}")
    return float((got - want).abs().max()) if got.numel() else 0.0


def check_margin(gap: float, tol: float, what: str) -> None:
    """A discrete result is portable when the values deciding it are more than 2 x their
    tolerance apart: then no two machines within the tolerance can order them differently."""
    if not gap > 2 * tol:
        raise AssertionError(f"{what}: margin too small: gap {gap:.3g} <= 2 x tolerance {tol:.3g}; "
                             "another machine could decide this the other way, so it cannot be "
                             "compared exactly")


def entropy_tolerance(logits: torch.Tensor, logit_tol: float = LOGITS) -> torch.Tensor:
    """(..., C) logits -> (...) the largest change of each row's entropy when every logit moves
    by at most logit_tol: dH = -sum_j p_j (log p_j + H) dz_j, so |dH| <= logit_tol x
    sum_j p_j |log p_j + H| (first order; the second order is ~logit_tol^2)."""
    logp = logits.float().log_softmax(-1)
    p = logp.exp()
    h = -(p * logp).sum(-1, keepdim=True)
    return logit_tol * (p * (logp + h).abs()).sum(-1)


def assert_selection_margin(scores: torch.Tensor, k: int, tol: torch.Tensor | float, what: str) -> None:
    """The k lowest of `scores` (N,) form the same SET within `tol` (a scalar or (N,) per-entry
    bounds): the k-th and (k+1)-th lowest finite scores are more than the sum of their
    tolerances apart. Non-finite scores sort last (the authors' NaN entropies); whether a score is
    finite is checked separately (assert_underflow_margin)."""
    tol = torch.as_tensor(tol, dtype=torch.float32).expand(scores.shape)
    finite = torch.isfinite(scores)
    order = torch.argsort(torch.where(finite, scores, torch.inf), stable=True)
    if k >= int(finite.sum()):
        return
    a, b = order[k - 1], order[k]
    check_margin(float(scores[b] - scores[a]), float(tol[a] + tol[b]) / 2, f"{what} (views {int(a)} | {int(b)})")


def assert_top1_margin(logits: torch.Tensor, tol: float, what: str) -> None:
    """Each row's argmax is the same within `tol` on every logit: top-1 and top-2 more than 2 tol apart."""
    top2 = logits.float().reshape(-1, logits.shape[-1]).topk(2, dim=-1).values
    gaps = top2[:, 0] - top2[:, 1]
    row = int(gaps.argmin())
    check_margin(float(gaps[row]), tol, f"{what} (row {row}: top-1 vs top-2)")


def assert_underflow_margin(logits: torch.Tensor, tol: float, what: str) -> None:
    """Whether softmax(logits) holds an exact 0 (which makes the authors' -sum p log p NaN) is the
    same within `tol` on every logit. softmax stores exp(d) / S per class (d = z - max z, S the
    row's sum of exp(d)): the smallest exp(d) rounds to m = round(exp(d) / 2^-149) subnormal
    steps, and m / S steps round to 0 below 1/2. So the answer changes where exp(d) / 2^-149
    crosses k - 1/2 with k = ceil(S / 2) (for S < 2: FLOAT32_UNDERFLOW_LOG) or where S crosses 2m.
    A shift of the logits by tol moves d and ln S by <= 2 tol, so both log-distances must exceed
    4 tol (check_margin with 2 tol)."""
    z = logits.double().reshape(-1, logits.shape[-1])
    d = z.min(-1).values - z.max(-1).values
    log_s = torch.logsumexp(z - z.max(-1, keepdim=True).values, -1)
    for row in range(z.shape[0]):
        log_m = float(d[row]) + 149 * math.log(2.0)       # ln(exp(d) / 2^-149)
        if log_m > math.log(1e4):                          # S <= C classes: far from any 0
            continue
        s = math.exp(float(log_s[row]))
        gap = abs(log_m - math.log(math.ceil(s / 2) - 0.5))
        m = round(math.exp(log_m))
        if m >= 1:
            gap = min(gap, abs(math.log(2 * m) - float(log_s[row])))
        check_margin(gap, 2 * tol, f"{what} (row {row}: smallest probability vs float32 underflow)")


NORM_PARAMS = 1e-4
"""Normalisation affine parameters (values ~1) adapted at test time by a few dozen optimiser steps (TENT, EATA,
SAR on the tiny ViT): each Adam step moves an entry by about lr x m / (sqrt(v) + eps), so the LOGITS-sized noise
of the inputs reaches the parameters through the sign and size of gradients that nearly cancel; measured 1.6e-5
after 30 Adam steps (lr 1e-3, eps 1e-6), 1.2e-7 after SGD steps, between CLIPTTA's code and shiftlab."""


TOLERANCES_FILE = "tolerances.json"
"""A method's own golden tolerances live beside its fixture, ``<fixture folder>/tolerances.json``:
``{"<key>": {"value": <positive number>, "why": "<what it bounds, and what was measured>"}}``; the constants above
are the ones that several methods share. tests/test_golden_tolerances.py checks every such file."""


def tolerance_file_problems(entries: object) -> list[str]:
    """What is wrong with a tolerances.json's contents (empty when nothing)."""
    if not isinstance(entries, dict) or not entries:
        return ["not a non-empty JSON object"]
    problems = []
    for key, entry in entries.items():
        if not key.isidentifier() or key != key.lower():
            problems.append(f"{key!r}: the key is not a lower-case identifier")
        elif not isinstance(entry, dict) or set(entry) != {"value", "why"}:
            problems.append(f"{key!r}: needs exactly 'value' and 'why'")
        elif isinstance(entry["value"], bool) or not isinstance(entry["value"], (int, float)) \
                or not 0 < entry["value"] < math.inf:
            problems.append(f"{key!r}: value {entry['value']!r} is not a positive finite number")
        elif not isinstance(entry["why"], str) or len(entry["why"].split()) < 8:
            problems.append(f"{key!r}: 'why' does not say why (a sentence of 8 words or more)")
    return problems


def fixture_tolerances(name: str, fixtures: Path = FIXTURES) -> dict[str, float]:
    """The tolerances kept beside the fixture tests/fixtures/golden/<name>/: key -> value."""
    import json
    path = fixtures / name / TOLERANCES_FILE
    entries = json.loads(path.read_text())
    problems = tolerance_file_problems(entries)
    if problems:
        raise ValueError(f"{path}: {'; '.join(problems)}")
    return {key: float(entry["value"]) for key, entry in entries.items()}

class OptimizerStepRecorder:
    """Within `with`: every optimiser step's gradient (before it) and value (after it) of the first parameter of
    the first group, in `grad` and `param` (what a golden test compares step by step with the authors' run)."""

    def __enter__(self):
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        self.grad, self.param = [], []
        self.hooks = [register_optimizer_step_pre_hook(
            lambda o, a, k: self.grad.append(o.param_groups[0]["params"][0].grad.detach().clone())),
            register_optimizer_step_post_hook(
            lambda o, a, k: self.param.append(o.param_groups[0]["params"][0].detach().clone()))]
        return self

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()



ROID_RESNET_GRAD_RTOL = 2e-3
"""SGD's momentum buffers of ROID and CMF on the golden tiny ResNet, relative to the largest entry: their weighted
soft likelihood ratio backpropagated through BatchNorm with the statistics of 8 images is ill-conditioned on this
tower (shiftlab against itself: norm parameters moved by 1e-6 change the next batches' gradients by 1.4%, 16% and
16%), so the FEATURES-sized noise between the two codes grows batch by batch; measured against their code: 1.3e-5,
6.8e-5 and 6.0e-4 after batches 0, 1, 2 (CMF, lr 0.001), 1.7e-5 at most (ROID, lr 0.001)."""

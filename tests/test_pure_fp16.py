"""The `fp16-pure` precision (shiftlab.models.precision): the model itself in float16, as TDA's authors run it.

Their `clip.load` on CUDA casts the convolution, linear, attention and projection weights to
fp16 (OpenAI's `convert_weights`) and runs without autocast. shiftlab honours it on CUDA only
(on the CPU every precision is float32), so these tests check the policy object on both
devices and run the CUDA policy's half model on the CPU, where torch has half kernels: the
features must be those of a straightforward `copy.deepcopy(clip).half()`.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import shiftlab
import shiftlab.methods.base as method_base
from shiftlab.engine.step import Evaluator
from shiftlab.methods.context import ClassHeads
from shiftlab.methods.head_kinds import text_head
from shiftlab.models.precision import Precision, resolve
from shiftlab.models.text import class_head, tokenize

NAMES = ["cat", "dog", "hen"]
TEMPLATES = ("a photo of a {}.", "a sketch of the {}.")
CUDA_PURE = Precision("fp16-pure", "cuda")     # the policy a CUDA run resolves; its half copy runs on the CPU too


def _views(model: shiftlab.ClipModel, n: int = 6) -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    return model.normalize(torch.rand(n, 3, model.image_size, model.image_size, generator=gen))


def test_the_policy_on_cuda_casts_the_model_and_turns_autocast_off():
    policy = resolve("fp16-pure", "cuda")
    assert policy == CUDA_PURE
    assert policy.model_dtype == torch.float16 and policy.amp_dtype is None and not policy.loss_scaling
    assert policy.key == "fp16-pure" != resolve("fp16", "cuda").key     # its features are not autocast's
    with policy.autocast():
        assert not torch.is_autocast_enabled("cuda") and not torch.is_autocast_enabled("cpu")
    assert resolve("fp16-pure", "cuda", run="bf16") == policy              # a method's own setting wins


def test_the_policy_on_cpu_is_float32_like_every_precision():
    policy = resolve("fp16-pure", "cpu")
    assert policy.model_dtype is None and policy.amp_dtype is None and policy.key == "fp32"


def test_it_is_a_method_setting_not_a_runs():
    msg = ("precision 'fp16-pure' is a method setting (the authors' half-precision model, e.g. "
           "tda's precision='fp16-pure' (RunConfig: method_config={'tda': {'precision': 'fp16-pure'}})), not a "
           "run's; a run's is one of auto, fp32, fp16, bf16")
    with pytest.raises(ValueError) as info:
        resolve("auto", "cpu", run="fp16-pure")
    assert str(info.value) == msg
    from shiftlab.options import speaking_cli
    with speaking_cli(), pytest.raises(ValueError) as info:
        resolve("auto", "cpu", run="fp16-pure")
    assert str(info.value) == ("precision 'fp16-pure' is a method setting (the authors' half-precision model, e.g. "
                               "--set tda.precision=fp16-pure), not a run's; a run's is one of auto, fp32, fp16, bf16")


def test_a_run_precision_of_fp16_pure_is_refused_before_any_method(tiny_model):
    with pytest.raises(ValueError, match=r"^precision 'fp16-pure' is a method setting"):
        Evaluator(tiny_model, NAMES, ["zeroshot"], precision="fp16-pure")


def test_methods_without_a_half_model_path_refuse_it(tiny_model):
    with pytest.raises(ValueError, match=r"^tpt.precision: 'fp16-pure' \(the authors' half-precision model\) is "
                                         r"implemented for (\w+, )*tda(, \w+)* only; use fp16 \(autocast\) or fp32$"):
        shiftlab.create_method("tpt", tiny_model, NAMES, precision="fp16-pure")


def test_the_cast_copy_holds_weights_as_the_authors_clip_load(tiny_model):
    half = tiny_model.cast(torch.float16)
    assert half is tiny_model.cast(torch.float16)                       # made once
    assert "_cast_copies" not in dict(tiny_model.named_children())
    assert not any(k.startswith("_cast") for k in tiny_model.state_dict())
    visual = half.clip.visual
    assert visual.conv1.weight.dtype == torch.float16 and visual.attnpool.c_proj.weight.dtype == torch.float16
    assert half.clip.text_projection.dtype == torch.float16
    # OpenAI's convert_weights leaves the normalisation layers' parameters in float32
    assert visual.bn1.weight.dtype == torch.float32 and half.clip.ln_final.weight.dtype == torch.float32
    assert tiny_model.clip.visual.conv1.weight.dtype == torch.float32   # the original is untouched


def test_half_features_equal_a_straightforward_half_model(golden_model):
    model, _ = golden_model
    # the golden CLIP's weights are fp16 values (OpenAI's file format), so keeping the normalisation
    # layers in float32 (the authors') and casting everything (.half()) hold the same numbers
    assert all(torch.equal(v.half().float(), v.float()) for k, v in model.clip.state_dict().items()
               if v.is_floating_point() and k != "logit_scale")
    x = _views(model)
    got = model.encode_views(x, CUDA_PURE)
    straightforward = copy.deepcopy(model.clip).half()
    with torch.no_grad():
        want = F.normalize(straightforward.encode_image(x.half()), dim=-1).float()
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert torch.equal(got.half().float(), got)                          # fp16 values, exactly
    fp32 = model.encode_views(x)
    gap = float((got - fp32).abs().max())
    assert 1e-5 < gap < 5e-3, gap                                       # fp16 rounding, no more
    # the CPU policy of the same name is float32
    assert torch.equal(model.encode_views(x, resolve("fp16-pure", "cpu")), fp32)


def test_tda_reads_half_features_and_a_half_text_head(golden_model, monkeypatch):
    model, classnames = golden_model
    names = classnames[:5]
    original = method_base.resolve_precision
    monkeypatch.setattr(method_base, "resolve_precision", lambda name, device, run="auto": (
        CUDA_PURE if name == "fp16-pure" else original(name, device, run=run)))
    tda = shiftlab.create_method("tda", model, names, precision="fp16-pure", templates=TEMPLATES, logit_scale=100.0)
    assert tda.precision == CUDA_PURE
    straightforward = copy.deepcopy(model.clip).half()
    # through shiftlab's text tower (truncated at the longest prompt, shiftlab.models.text) the head is exactly
    # that of a straightforward half model ...
    want_head = class_head(shiftlab.ClipModel(straightforward, model.name, None, model.preprocess), names, TEMPLATES)
    head = text_head(tda)
    torch.testing.assert_close(head, want_head, rtol=0, atol=0)
    # ... and within an fp16 rounding or two of the authors' full 77-token tower
    with torch.no_grad():
        per_template = torch.stack([F.normalize(straightforward.encode_text(
            tokenize([t.format(c) for c in names])).float(), dim=-1) for t in TEMPLATES])
    torch.testing.assert_close(head, F.normalize(per_template.mean(0), dim=-1), rtol=0, atol=1e-3)
    fp32_head = ClassHeads(model, names).templated(list(TEMPLATES))
    assert float((head - fp32_head).abs().max()) > 1e-5                 # not the float32 tower's head
    # predict encodes with the method's own precision: the half model's features
    x = _views(model, 10)
    logits = tda.predict(x)
    ref = shiftlab.create_method("tda", model, names, templates=TEMPLATES, logit_scale=100.0)
    ref.heads = ClassHeads(model.cast(torch.float16), names)             # the same half head, by hand
    from shiftlab.methods.context import SampleContext
    want = ref.predict_context(SampleContext(model, ref.heads, x, image_features=model.encode_views(x, CUDA_PURE)))
    assert torch.equal(logits, want.logits)


def test_on_the_cpu_tda_with_fp16_pure_is_tda_in_float32(tiny_model):
    x = _views(tiny_model, 10)
    pure = shiftlab.create_method("tda", tiny_model, NAMES, precision="fp16-pure")
    plain = shiftlab.create_method("tda", tiny_model, NAMES, heads=pure.heads)
    assert pure.heads.model is tiny_model
    assert torch.equal(pure.predict(x), plain.predict(x))


@pytest.mark.gpu
def test_on_cuda_the_half_model_gives_the_features_of_its_cpu_stand_in(golden_dir):
    """The tests above run the CUDA policy's half copy on the CPU; on CUDA the same copy must give those
    features within fp16 rounding (other kernels, other summation order: measured gap of fp16 to fp32
    on the CPU 5.7e-4), else the CPU tests would vouch for a path CUDA runs differently."""
    weights = str(golden_dir / "tiny_clip_openai.pt")
    cpu = shiftlab.load_model("shiftlab-tiny", weights)
    gpu = shiftlab.load_model("shiftlab-tiny", weights, device="cuda")
    policy = resolve("fp16-pure", "cuda")
    x = _views(cpu)
    got = gpu.encode_views(x.cuda(), policy)
    half = gpu.cast(torch.float16).clip.visual.conv1.weight
    assert got.device.type == "cuda" and got.dtype == torch.float32
    assert half.device.type == "cuda" and half.dtype == torch.float16
    torch.testing.assert_close(got.cpu(), cpu.encode_views(x, CUDA_PURE), rtol=0, atol=3e-3)
    gap = float((got - gpu.encode_views(x.cuda())).abs().max())
    assert 1e-5 < gap < 5e-3, gap                                       # fp16 rounding, no more

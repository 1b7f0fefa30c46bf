"""The library as a newcomer copies it from the README and docs/LIBRARY.md (issue 40 cases 8 and 15): random
weights by the command line's spelling, one-line reprs, damaged weights refused at load, a run over any
map-style dataset object, and the results as a DataFrame."""
from __future__ import annotations

import pytest
import torch

import shiftlab
from conftest import make_tiny_model
from shiftlab.models import ModelLoadError

pytestmark = pytest.mark.usefixtures("one_thread")


# -- weights ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["none", "None", "random"])
def test_pretrained_none_is_random_weights_as_on_the_command_line(tiny_model, spelling):
    model = shiftlab.load_model("shiftlab-tiny", pretrained=spelling, seed=0)
    assert model.pretrained is None and model.checkpoint_sha256 is None and model.weights_seed == 0
    assert model.weights_sha256 == tiny_model.weights_sha256     # the same weights as pretrained=None


def test_run_config_pretrained_none_is_random_weights():
    from shiftlab.engine.config import check_run_config
    assert check_run_config(shiftlab.RunConfig(pretrained="none")).pretrained is None
    assert check_run_config(shiftlab.RunConfig(pretrained="openai")).pretrained == "openai"


@pytest.mark.parametrize("key", ["visual.conv1.weight", "text_projection", "logit_scale"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_checkpoint_with_non_finite_weights_is_refused_at_load_in_one_line(tmp_path, key, bad):
    """Issue 40 case 15: such a checkpoint used to load, and the whole run gave error records with exit 0."""
    sd = {k: v.clone().contiguous() for k, v in make_tiny_model(0).clip.state_dict().items()}
    sd[key].view(-1)[0] = bad
    path = tmp_path / "damaged.pt"
    torch.save(sd, path)
    with pytest.raises(ModelLoadError) as info:
        shiftlab.load_model("shiftlab-tiny", str(path))
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg and key in msg and "NaN or Inf" in msg


# -- reprs --------------------------------------------------------------------------------------------

def test_model_repr_is_one_line(tiny_model):
    text = repr(tiny_model)
    assert "\n" not in text and len(text) < 200
    assert "shiftlab-tiny" in text and "random weights (seed 0)" in text and "parameters" in text
    assert str(tiny_model) == text


def test_dataset_repr_is_one_line(tmp_path):
    from shiftlab.synthetic import make_imagenet_r
    data = make_imagenet_r(tmp_path, classes=range(0, 200, 10))
    dataset = shiftlab.build_dataset("imagenet-r", data)
    text = repr(dataset)
    assert "\n" not in text and len(text) < 300
    assert "imagenet-r" in text and "20 samples" in text and "200 classes" in text
    assert dataset.samples[0][0] not in text                      # no sample list

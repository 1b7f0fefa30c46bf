"""Class heads on disk: a second build reads the first one's file, exactly; other keys never match."""
from __future__ import annotations

import pytest
import torch

from shiftlab.models import head_cache, text
from shiftlab.models.text import class_head

TEMPLATES = [f"a photo {i} of a {{}}." for i in range(4)]
NAMES = [f"class {c}" for c in range(6)]      # 24 prompts, above the lowered MIN_PROMPTS


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(head_cache, "MIN_PROMPTS", 20)
    monkeypatch.setenv("SHIFTLAB_HEAD_CACHE", "1")
    monkeypatch.setenv("SHIFTLAB_CACHE", str(tmp_path))
    return tmp_path / "heads"


def test_second_build_reads_the_file_and_equals_the_first(tiny_model, cache, monkeypatch):
    first = class_head(tiny_model, NAMES, TEMPLATES)
    files = list(cache.glob("*.safetensors"))
    assert len(files) == 1
    monkeypatch.setattr(text, "encode_texts", lambda *a, **k: pytest.fail("the cached head was built again"))
    again = class_head(tiny_model, NAMES, TEMPLATES)
    assert torch.equal(again, first)   # the same process reads back its own float32 bytes


def test_other_prompts_weights_or_a_damaged_file_are_rebuilt(tiny_model, cache):
    from conftest import make_tiny_model
    base = class_head(tiny_model, NAMES, TEMPLATES)
    other_names = class_head(tiny_model, NAMES[:-1] + ["another"], TEMPLATES)
    other_order = class_head(tiny_model, NAMES, TEMPLATES[::-1])
    other_model = make_tiny_model(seed=1)
    other_weights = class_head(other_model, NAMES, TEMPLATES)
    assert len(list(cache.glob("*.safetensors"))) == 4
    assert not torch.allclose(other_weights, base)
    torch.testing.assert_close(other_order, base, rtol=0, atol=1e-6)  # the mean is order-independent up to rounding
    assert not torch.equal(other_names[-1], base[-1])
    path = cache / f"{head_key(tiny_model)}.safetensors"
    path.write_bytes(path.read_bytes()[:100])                  # truncated
    assert torch.equal(class_head(tiny_model, NAMES, TEMPLATES), base)
    assert path.stat().st_size > 100                            # rewritten


def head_key(model) -> str:
    prompts = [t.format(n) for t in TEMPLATES for n in NAMES]
    return head_cache.head_key(model.clip, model.device, prompts)


def test_off_switch_and_small_heads_write_nothing(tiny_model, cache, monkeypatch):
    class_head(tiny_model, NAMES[:5], TEMPLATES[:2])            # 10 prompts: below MIN_PROMPTS
    monkeypatch.setenv("SHIFTLAB_HEAD_CACHE", "0")
    class_head(tiny_model, NAMES, TEMPLATES)
    assert not cache.exists() or not list(cache.iterdir())


def test_digest_covers_only_the_text_tower(tiny_model):
    from conftest import make_tiny_model
    a, b = make_tiny_model(0), make_tiny_model(0)
    assert head_cache.text_tower_digest(a.clip) == head_cache.text_tower_digest(b.clip)
    with torch.no_grad():
        b.clip.visual.conv1.weight.add_(1.0)                    # the image tower does not decide a text head
    b.clip.__dict__.pop("_shiftlab_text_digest", None)
    assert head_cache.text_tower_digest(a.clip) == head_cache.text_tower_digest(b.clip)
    with torch.no_grad():
        b.clip.ln_final.weight.add_(1.0)
    b.clip.__dict__.pop("_shiftlab_text_digest", None)
    assert head_cache.text_tower_digest(a.clip) != head_cache.text_tower_digest(b.clip)


def test_bytes_flipped_inside_the_tensor_are_found_said_and_rebuilt(tiny_model, cache, capsys):
    """Issue 29 finding 1: the header still parses, only the tensor's bytes differ."""
    base = class_head(tiny_model, NAMES, TEMPLATES)
    path = cache / f"{head_key(tiny_model)}.safetensors"
    data = bytearray(path.read_bytes())
    for i in range(len(data) - 40, len(data) - 8):              # inside the tensor data, at the file's end
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    capsys.readouterr()
    again = class_head(tiny_model, NAMES, TEMPLATES)
    assert torch.equal(again, base)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "built again" in err[0]
    assert torch.equal(class_head(tiny_model, NAMES, TEMPLATES), base)   # rewritten intact: read silently
    assert capsys.readouterr().err == ""


def test_an_unwritable_cache_folder_costs_one_line_and_the_head_is_built(tiny_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(head_cache, "MIN_PROMPTS", 20)
    monkeypatch.setenv("SHIFTLAB_HEAD_CACHE", "1")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SHIFTLAB_CACHE", str(blocker))          # heads/ would be inside a file
    head = class_head(tiny_model, NAMES, TEMPLATES)
    assert head.shape[0] == len(NAMES)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write" in err[0] and "kept in memory" in err[0]


def test_a_file_copied_over_another_keys_name_is_not_served(tiny_model, cache, capsys):
    """Issue 40 case 17: an intact file under another key's name (its digest covers its bytes) is rebuilt."""
    base = class_head(tiny_model, NAMES, TEMPLATES)
    other_names = NAMES[:-1] + ["another"]
    other = class_head(tiny_model, other_names, TEMPLATES)
    path = cache / f"{head_key(tiny_model)}.safetensors"
    other_prompts = [t.format(n) for t in TEMPLATES for n in other_names]
    other_path = cache / f"{head_cache.head_key(tiny_model.clip, tiny_model.device, other_prompts)}.safetensors"
    path.write_bytes(other_path.read_bytes())                  # another key's intact file under this key's name
    capsys.readouterr()
    again = class_head(tiny_model, NAMES, TEMPLATES)
    assert torch.equal(again, base) and not torch.equal(again, other)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "another key" in err[0] and "built again" in err[0]
    assert torch.equal(class_head(tiny_model, NAMES, TEMPLATES), base)   # rewritten under its own key: read silently
    assert capsys.readouterr().err == ""

"""DMN-ZS's `tip_cupl` text head (7 Tip-Adapter templates + the user's CuPL descriptions) and its errors."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _imports import lazy_module
from conftest import make_tiny_model
from shiftlab.methods.head_kinds import text_head
from shiftlab.models.text import TIP_TEMPLATES, tip_cupl_head
from shiftlab.options import speaking_cli

open_clip = lazy_module("open_clip", optional=False)   # imported by the first test that reads it

NAMES = ["great_white_shark", "cat", "hot dog"]
# unequal numbers of descriptions per class (3, 1, 2): pooling all sentences differs from averaging
# the template mean with the description mean (a class with none is refused, see below)
DESCRIPTIONS = {"great white shark": ["A large grey fish with many teeth.", "Sharks swim in the ocean.",
                                      "A shark's fin cuts the water."],
                "cat": ["A small furry pet that purrs."],
                "hot dog": ["A sausage in a bun.", "Street food with mustard."]}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model() -> shiftlab.ClipModel:
    return make_tiny_model(seed=2)


@pytest.fixture
def cupl_file(tmp_path) -> str:
    path = tmp_path / "cupl.json"
    path.write_text(json.dumps({**DESCRIPTIONS, "unused class": ["Not in this run."]}))
    return str(path)


def _encode(model: shiftlab.ClipModel, texts: list[str]) -> torch.Tensor:
    """open_clip's full 77-token encode_text, normalised."""
    with torch.no_grad():
        return model.clip.encode_text(open_clip.tokenize(texts), normalize=True).float()


def _want(model: shiftlab.ClipModel) -> torch.Tensor:
    return _pooled(model, NAMES, TIP_TEMPLATES, DESCRIPTIONS)


def test_tip_cupl_head_pools_templates_and_descriptions(model, cupl_file):
    want = _want(model)
    got = tip_cupl_head(model, NAMES, [DESCRIPTIONS[n.replace("_", " ")] for n in NAMES])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # pooled, not the mean of the template half and the description half
    shark = [t.format("great white shark") for t in TIP_TEMPLATES]
    halves = F.normalize(_encode(model, shark).mean(0) + _encode(model, DESCRIPTIONS["great white shark"]).mean(0),
                         dim=-1)
    assert (got[0] - halves).abs().max() > 1e-4
    # through the method: dmn_zs reads the file named by cupl_file
    dmn = shiftlab.create_method("dmn_zs", model, NAMES, text_head="tip_cupl", cupl_file=cupl_file)
    torch.testing.assert_close(text_head(dmn), want, rtol=0, atol=1e-5)
    views = model.normalize(torch.rand(32, 3, model.image_size, model.image_size, generator=torch.Generator()
                                       .manual_seed(0)))
    assert torch.isfinite(dmn.predict(views)).all()


def test_tip_cupl_errors_are_one_line_and_name_the_field(model, tmp_path):
    def refused(**kw) -> str:
        with pytest.raises(ValueError) as err:
            shiftlab.create_method("dmn_zs", model, NAMES, text_head="tip_cupl", **kw)
        assert "\n" not in str(err.value)
        return str(err.value)

    assert refused() == ("dmn_zs.cupl_file: text_head 'tip_cupl' needs CuPL's class descriptions (a JSON file, "
                         "class name -> sentences, not shipped): pass dmn_zs's cupl_file='PATH' (RunConfig: "
                         "method_config={'dmn_zs': {'cupl_file': 'PATH'}}) (or dmn_zs's text_head='ensemble' "
                         "(RunConfig: method_config={'dmn_zs': {'text_head': 'ensemble'}}))")
    with speaking_cli():   # the command line names its flag (#34)
        assert refused() == ("dmn_zs.cupl_file: text_head 'tip_cupl' needs CuPL's class descriptions (a JSON "
                             "file, class name -> sentences, not shipped): pass --set dmn_zs.cupl_file=PATH "
                             "(or --set dmn_zs.text_head=ensemble)")
    missing = str(tmp_path / "nope.json")
    assert refused(cupl_file=missing) == f"dmn_zs.cupl_file: cannot read {missing!r} (No such file or directory)"
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"cat": ["A cat."]}))
    assert refused(cupl_file=str(partial)) == (
        f"dmn_zs.cupl_file: {str(partial)!r} has no sentences for 2 of 3 classes: 'great white shark', 'hot dog'")
    # every class present but mapped to no sentence: refused like missing classes
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({n.replace("_", " "): [] for n in NAMES}))
    assert refused(cupl_file=str(empty)) == (
        f"dmn_zs.cupl_file: {str(empty)!r} has no sentences for 3 of 3 classes: 'great white shark', 'cat', "
        "'hot dog'")
    empty.write_text(json.dumps({"cat": ["A cat."], "great white shark": [" ", ""], "hot dog": []}))
    assert refused(cupl_file=str(empty)) == (
        f"dmn_zs.cupl_file: {str(empty)!r} has no sentences for 2 of 3 classes: 'great white shark', 'hot dog'")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert refused(cupl_file=str(bad)).startswith(f"dmn_zs.cupl_file: {str(bad)!r} is not JSON (")
    bad.write_text(json.dumps(["a list"]))
    assert refused(cupl_file=str(bad)) == (
        f"dmn_zs.cupl_file: {str(bad)!r} must map each class name to a list of sentences (CuPL's format)")
    with pytest.raises(ValueError, match=r"^dmn_zs.text_head: 'cupl' is not a choice; must be one of 'ensemble', "
                                         r"'zeroshot', 'tip_cupl'$"):
        shiftlab.create_method("dmn_zs", model, NAMES, text_head="cupl").prepare()


def test_paper_protocol_needs_the_cupl_file(model, cupl_file):
    with pytest.raises(ValueError, match=r"^dmn_zs\.cupl_file: .* pass dmn_zs's cupl_file='PATH' \(RunConfig: "):
        shiftlab.create_method("dmn_zs", model, NAMES, protocol="paper")
    with speaking_cli(), pytest.raises(ValueError, match=r"^dmn_zs\.cupl_file: .* pass --set dmn_zs\.cupl_file=PATH"):
        shiftlab.create_method("dmn_zs", model, NAMES, protocol="paper")
    dmn = shiftlab.create_method("dmn_zs", model, NAMES, protocol="paper", cupl_file=cupl_file)
    assert dmn.config.text_head == "tip_cupl"
    torch.testing.assert_close(text_head(dmn), _want(model), rtol=0, atol=1e-5)
    # the leaderboard protocol keeps the 80-template head and needs no file
    assert shiftlab.create_method("dmn_zs", model, NAMES).config.text_head == "ensemble"


FLOWERS = ["pink_primrose", "hard-leaved pocket orchid", "canterbury bells"]
FLOWER_DESCRIPTIONS = {"pink primrose": ["A pale pink flower with five petals.", "A primrose in spring."],
                       "hard-leaved pocket orchid": ["An orchid with a pouch."],
                       "canterbury bells": ["Blue bell-shaped flowers on a tall stem."]}


def _pooled(model: shiftlab.ClipModel, names: list[str], templates, descriptions: dict) -> torch.Tensor:
    """Per class: its templates and descriptions as one list of sentences, normalised mean (open_clip)."""
    rows = []
    for name in names:
        spaced = name.replace("_", " ")
        sentences = [t.format(spaced) for t in templates] + descriptions[spaced]
        rows.append(F.normalize(_encode(model, sentences).mean(0), dim=-1))
    return torch.stack(rows)


def test_paper_protocol_pairs_each_dataset_with_its_own_templates(model, tmp_path):
    """DMN's `reset_classnames`: on a fine-grained set, `ID_to_prompts[set]` + that set's CuPL sentences;
    on the ImageNet family (and Caltech101 / SUN397), the 7 Tip-Adapter templates."""
    path = tmp_path / "CuPL_prompts_flowers102.json"
    path.write_text(json.dumps(FLOWER_DESCRIPTIONS))
    dmn = shiftlab.create_method("dmn_zs", model, FLOWERS, protocol="paper", dataset="flowers102",
                                 cupl_file=str(path))
    assert dmn.config.templates == ("a photo of a {}, a type of flower.",)
    want = _pooled(model, FLOWERS, ["a photo of a {}, a type of flower."], FLOWER_DESCRIPTIONS)
    torch.testing.assert_close(text_head(dmn), want, rtol=0, atol=1e-5)
    tip = _pooled(model, FLOWERS, TIP_TEMPLATES, FLOWER_DESCRIPTIONS)
    assert (want - tip).abs().max() > 1e-3                      # the templates do change the head
    for dataset in ("caltech101", "imagenet-r", None):           # None: no dataset known -> the default
        other = shiftlab.create_method("dmn_zs", model, FLOWERS, protocol="paper", dataset=dataset,
                                       cupl_file=str(path))
        assert other.config.templates in (tuple(TIP_TEMPLATES), None)
        torch.testing.assert_close(text_head(other), tip, rtol=0, atol=1e-5)
    # the leaderboard protocol ignores the dataset; --set wins over the dataset's templates
    plain = shiftlab.create_method("dmn_zs", model, FLOWERS, protocol="leaderboard", dataset="flowers102",
                                   text_head="tip_cupl", cupl_file=str(path))
    assert plain.config.templates is None
    torch.testing.assert_close(text_head(plain), tip, rtol=0, atol=1e-5)
    mine = shiftlab.create_method("dmn_zs", model, FLOWERS, protocol="paper", dataset="flowers102",
                                  cupl_file=str(path), templates=("itap of a {}.",))
    torch.testing.assert_close(text_head(mine), _pooled(model, FLOWERS, ["itap of a {}."], FLOWER_DESCRIPTIONS),
                               rtol=0, atol=1e-5)


# ------------------------------------------- a directory of CuPL's per-dataset files

def _cupl_dir(tmp_path, files: dict[str, dict]) -> str:
    folder = tmp_path / "gpt3_prompts"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_text(json.dumps(data))
    return str(folder)


TEXTURES = ["banded", "blotchy", "braided"]
TEXTURE_DESCRIPTIONS = {"banded": ["Stripes of colour in bands."], "blotchy": ["Irregular patches and blots."],
                        "braided": ["Strands woven over each other.", "A plaited pattern."]}


def test_a_cupl_directory_gives_each_dataset_its_own_file(model, tmp_path):
    """DMN's file names (ID_to_gptprompts_path; CuPL_prompts_imagenet.json on the ImageNet family), under
    every protocol, recorded in the config as the chosen file."""
    folder = _cupl_dir(tmp_path, {"CuPL_prompts_flowers102.json": FLOWER_DESCRIPTIONS,
                                  "CuPL_prompts_dtd.json": TEXTURE_DESCRIPTIONS,
                                  "CuPL_prompts_imagenet.json": DESCRIPTIONS})
    for alias in ("flowers102", "flower102"):
        dmn = shiftlab.create_method("dmn_zs", model, FLOWERS, protocol="paper", dataset=alias, cupl_file=folder)
        assert dmn.config.cupl_file == f"{folder}/CuPL_prompts_flowers102.json"
        torch.testing.assert_close(text_head(dmn), _pooled(model, FLOWERS, ["a photo of a {}, a type of flower."],
                                                           FLOWER_DESCRIPTIONS), rtol=0, atol=1e-5)
    dtd = shiftlab.create_method("dmn_zs", model, TEXTURES, protocol="paper", dataset="dtd", cupl_file=folder)
    assert dtd.config.cupl_file == f"{folder}/CuPL_prompts_dtd.json"
    torch.testing.assert_close(text_head(dtd), _pooled(model, TEXTURES, ["{} texture."], TEXTURE_DESCRIPTIONS),
                               rtol=0, atol=1e-5)
    for dataset in ("imagenet-r", "K"):
        net = shiftlab.create_method("dmn_zs", model, NAMES, protocol="leaderboard", dataset=dataset,
                                     text_head="tip_cupl", cupl_file=folder)
        assert net.config.cupl_file == f"{folder}/CuPL_prompts_imagenet.json"
        torch.testing.assert_close(text_head(net), _want(model), rtol=0, atol=1e-5)
    # a head that reads no descriptions leaves the directory alone (and needs no file for the set)
    plain = shiftlab.create_method("dmn_zs", model, NAMES, dataset="eurosat", cupl_file=folder)
    assert plain.config.text_head == "ensemble" and plain.config.cupl_file == folder


def test_a_cupl_directory_without_the_datasets_file_is_a_one_line_error(model, tmp_path):
    folder = _cupl_dir(tmp_path, {"CuPL_prompts_flowers102.json": FLOWER_DESCRIPTIONS})

    def refused(**kw) -> str:
        with pytest.raises(ValueError) as err:
            shiftlab.create_method("dmn_zs", model, NAMES, protocol="paper", cupl_file=folder, **kw)
        return str(err.value)

    assert refused(dataset="oxford-pets") == (f"dmn_zs.cupl_file: directory {folder!r} has no CuPL file for "
                                              "dataset 'oxford-pets' (expected CuPL_prompts_oxfordpets.json)")
    assert refused(dataset="fgvc-aircraft").endswith("(expected CuPL_prompts_fgvcaircraft.json)")
    assert refused(dataset="imagefolder") == (f"dmn_zs.cupl_file: {folder!r} is a directory of CuPL files, but DMN "
                                              "names none for dataset 'imagefolder': pass the file itself "
                                              "(class name -> sentences)")
    assert refused() == (f"dmn_zs.cupl_file: {folder!r} is a directory; the run's dataset picks the file in it "
                         "(dataset or suite), without one pass the file itself")
    with speaking_cli():
        assert "picks the file in it (--dataset or --suite), without one" in refused()


def test_a_single_cupl_file_is_used_on_every_dataset(model, cupl_file):
    for dataset in ("imagenet-r", "dtd", "imagefolder", None):
        dmn = shiftlab.create_method("dmn_zs", model, NAMES, dataset=dataset, text_head="tip_cupl",
                                     cupl_file=cupl_file)
        assert dmn.config.cupl_file == cupl_file
        torch.testing.assert_close(text_head(dmn), _want(model), rtol=0, atol=1e-5)


# ----------------------------------------------------------- a suite on the tiny model

def _sentences(dataset: str, classnames: list[str]) -> dict[str, list[str]]:
    """Made-up CuPL-style sentences, different per dataset and class (one or two each)."""
    return {c.replace("_", " "): [f"A {dataset} picture of {c}."] + [f"Another {c}."] * (k % 2)
            for k, c in enumerate(classnames)}


def test_a_suite_reads_each_datasets_cupl_file_from_the_directory(tmp_path, monkeypatch):
    from _synthetic import make_split_dataset
    from shiftlab.datasets import build_dataset, suites
    from shiftlab.engine import suite as suite_runs
    from shiftlab.engine.config import RunConfig
    from shiftlab.methods.catalogue.protocols import dataset_overrides
    from shiftlab.methods.context import ClassHeads
    from shiftlab.methods.dmn_zs.method import DMNZeroShot
    from shiftlab.synthetic import tiny_clip

    root = tmp_path / "data"
    names = ("flowers102", "dtd")
    datasets = {}
    for name in names:
        make_split_dataset(root, name, with_images=[0, 1], real_images=True)
        datasets[name] = build_dataset(name, str(root))
    files = {"flowers102": "CuPL_prompts_flowers102.json", "dtd": "CuPL_prompts_dtd.json"}
    sentences = {n: _sentences(n, datasets[n].classnames) for n in names}
    folder = _cupl_dir(tmp_path, {files[n]: sentences[n] for n in names})   # each file: its own classes only
    used = []
    original = ClassHeads.tip_cupl

    def spy(self, cupl_file, field="cupl_file", templates=None):
        head = original(self, cupl_file, field, templates)
        if not used or used[-1][1] != cupl_file:   # prepare() and every sample ask; the head is cached
            used.append((list(self.classnames), cupl_file, head))
        return head

    monkeypatch.setattr(ClassHeads, "tip_cupl", spy)
    suite = suites.resolve_suite(None, ",".join(names))
    model = tiny_clip(0)

    def config(out, cupl=folder) -> RunConfig:
        return RunConfig(dataset=names[0], data=str(root), methods=["dmn_zs"], protocol="paper", limit=1,
                         order="sorted", workers=0, progress=False, out=str(out),
                         method_config={"dmn_zs": {"views": 4, "cupl_file": cupl}})

    suite_runs.run_suite(config(tmp_path / "suite"), suite, model=model, datasets=datasets)
    assert [u[1] for u in used] == [f"{folder}/{files[n]}" for n in names]
    for name, (classnames, _, head) in zip(names, used):
        assert classnames == datasets[name].classnames
        summary = json.loads((tmp_path / "suite" / name / "summary.json").read_text())
        assert summary["config"]["method_settings"]["dmn_zs"]["cupl_file"] == f"{folder}/{files[name]}"
        want = _pooled(model, classnames, dataset_overrides("paper", DMNZeroShot, name)["templates"], sentences[name])
        torch.testing.assert_close(head, want, rtol=0, atol=1e-5)
    # the second dataset's file missing: the suite stops before its first dataset runs
    (tmp_path / "gpt3_prompts" / files["dtd"]).unlink()
    with pytest.raises(ValueError) as err:
        suite_runs.run_suite(config(tmp_path / "broken"), suite, model=model, datasets=datasets)
    assert str(err.value) == (f"dmn_zs.cupl_file: directory {folder!r} has no CuPL file for dataset 'dtd' "
                              "(expected CuPL_prompts_dtd.json)")
    assert not (tmp_path / "broken").exists()
    # one file for both sets: the first set to lack sentences stops the suite, also before any work
    with pytest.raises(ValueError, match=r"^dmn_zs\.cupl_file: .*CuPL_prompts_flowers102\.json' has no sentences "
                                         r"for 47 of 47 classes: 'banded', "):
        suite_runs.run_suite(config(tmp_path / "single", f"{folder}/{files['flowers102']}"), suite, model=model,
                         datasets=datasets)
    assert not (tmp_path / "single").exists()

"""Streams of domains: several datasets of one class list run as one stream, `continual` (one after the other,
the online state kept) or `mixed` (shuffled together); recorded, reported per domain, refused when unfit."""
from __future__ import annotations

import json
import re

import pytest
import torch

from _registered import registered
from _runs import json_lines
from _synthetic import make_image_folder, make_imagenet_r
from shiftlab.cli import main as cli_main
from shiftlab.datasets.base import DatasetError
from shiftlab.datasets.build import build_dataset
from shiftlab.datasets.domains import domain_sequence
from shiftlab.engine.config import RunConfig, run_stream
from shiftlab.engine.loop import run
from shiftlab.methods.base import Method, MethodOutput
from shiftlab.report import build_report
from shiftlab.rundir.stream import read_stream, stream_order

pytestmark = pytest.mark.usefixtures("one_thread")
CLASSES = ["cat", "dog", "fox"]


@pytest.fixture(scope="module")
def domains(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("domains")
    parts = {}
    for seed, name in enumerate(("sunny", "foggy")):
        root = make_image_folder(tmp / name, CLASSES, per_class=2, size=(48, 40), seed=seed + 1)
        part = build_dataset("imagefolder", root)
        part.name = name
        parts[name] = part
    return parts


def test_domain_sequence_prefixes_paths_and_delegates(domains):
    seq = domain_sequence(domains)
    assert seq.name == "sunny+foggy" and len(seq) == 12 and seq.classnames == ["cat", "dog", "fox"]
    assert seq.domains == ["sunny", "foggy"] and seq.domain_index == [0] * 6 + [1] * 6
    assert seq.samples[7] == ("foggy/" + domains["foggy"].samples[1][0], domains["foggy"].samples[1][1])
    assert seq.path(7) == domains["foggy"].path(1)
    assert seq.image(7).tobytes() == domains["foggy"].image(1).tobytes()


def test_domain_sequence_refuses_other_class_lists_in_one_line(domains, tmp_path):
    other = build_dataset("imagefolder", make_image_folder(tmp_path / "x", ["cat", "dog", "owl"], per_class=1))
    with pytest.raises(DatasetError, match=r"one class list: x \(3 classes\) differs from sunny \(3 classes\) at "
                                           r"class 2") as info:
        other.name = "x"
        domain_sequence({"sunny": domains["sunny"], "x": other})
    assert "\n" not in str(info.value)
    with pytest.raises(DatasetError, match="two datasets or more"):
        domain_sequence({"sunny": domains["sunny"]})


def test_continual_is_each_domain_shuffled_in_turn_and_mixed_is_one_shuffle():
    domain_of = [0, 1, 0, 1, 1, 0, 2, 2]
    order = stream_order(8, "continual", 4, domains=domain_of)
    assert [domain_of[i] for i in order] == [0, 0, 0, 1, 1, 1, 2, 2]
    gen = torch.Generator().manual_seed(4)
    expected = []
    for members in ([0, 2, 5], [1, 3, 4], [6, 7]):
        expected += [members[j] for j in torch.randperm(len(members), generator=gen).tolist()]
    assert order == expected
    assert stream_order(8, "mixed", 4, domains=domain_of) == stream_order(8, "shuffled", 4)
    with pytest.raises(ValueError, match="two or more"):
        stream_order(3, "continual", 0, domains=[0, 0, 0])


class StreamCount(Method):
    """Test-only online method: zero-shot, recording how many images it has seen before this one."""
    needs_views = False
    episodic = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = 0

    def predict_context(self, ctx):
        self.seen += 1
        return MethodOutput(ctx.zeroshot_logits, extras={"seen": self.seen - 1})

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state):
        self.seen = state["seen"]


@pytest.fixture
def counter():
    with registered("stream_count", StreamCount):
        yield "stream_count"


@pytest.mark.slow
def test_continual_run_keeps_the_online_state_across_domains_and_reports_each(domains, tiny_model, tmp_path,
                                                                              counter):
    seq = domain_sequence(domains)
    config = RunConfig(dataset=seq.name, methods=["zeroshot", "tda", counter], workers=0, progress=False, views=4,
                       seed=2, batch_size=4, order="continual", out=str(tmp_path / "run"), device="cpu")
    run(config, model=tiny_model, dataset=seq)
    stream = read_stream(tmp_path / "run")
    assert stream["ids"] == run_stream(config, seq) and stream["domains"] == ["sunny", "foggy"]
    assert stream["domain_of"] == [0] * 6 + [1] * 6
    recs = json_lines(tmp_path / "run" / "records.jsonl")
    assert {r["path"].split("/")[0] for r in recs} == {"sunny", "foggy"} and len(recs) == 36
    seen = {r["id"]: r["extras"]["seen"] for r in recs if r["method"] == counter}
    assert [seen[i] for i in stream["ids"]] == list(range(12))   # no reset where the second domain starts
    shared = json.loads((tmp_path / "run" / "run.json").read_text())["shared"]
    assert (shared["dataset"], shared["order"]) == ("sunny+foggy", "continual")
    html = build_report([tmp_path / "run"], tmp_path / "report").read_text()
    section = re.search(r'<section id="stream">.*?</section>', html, re.S).group(0)
    assert "Domains of" in section and "sunny" in section and "foggy" in section
    zs = [r for r in recs if r["method"] == "zeroshot"]
    first = [r for r in zs if r["path"].startswith("sunny/")]
    expected = f"{100 * sum(r['correct'] for r in first) / len(first):.2f}"
    assert expected in section


def test_cli_continual_needs_several_datasets(tmp_path, capsys):
    data = make_imagenet_r(tmp_path / "data", classes=[0], per_class=1)
    code = cli_main(["run", "--data", str(data.parent), "--model", "shiftlab-tiny", "--pretrained", "none",
                     "--methods", "zeroshot", "--order", "continual", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "--datasets a,b,... or --suite" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_cli_continual_over_two_datasets_of_imagenets_classes(tmp_path, tiny_checkpoint, capsys):
    from shiftlab.datasets.classes import imagenet_wnids
    for name, folders in (("imagenet-v2", [str(i) for i in range(1000)]), ("imagenet-sketch", imagenet_wnids())):
        make_image_folder(tmp_path / "data" / name, folders, per_class=0)   # every class folder, two with images
        make_image_folder(tmp_path / "data" / name, folders[:2], per_class=2, size=(40, 32), seed=len(name))
    argv = ["run", "--datasets", "imagenet-v2,imagenet-sketch", "--data", str(tmp_path / "data"), "--model",
            "shiftlab-tiny", "--pretrained", str(tiny_checkpoint), "--methods", "zeroshot", "--order", "continual",
            "--allow-partial", "--workers", "0", "--device", "cpu", "--no-progress", "--out", str(tmp_path / "o")]
    assert cli_main(argv) == 0
    shared = json.loads((tmp_path / "o" / "run.json").read_text())["shared"]
    assert (shared["dataset"], shared["order"], shared["n_samples"]) == ("imagenet-v2+imagenet-sketch", "continual", 8)
    stream = read_stream(tmp_path / "o")
    assert stream["domains"] == ["imagenet-v2", "imagenet-sketch"] and stream["domain_of"] == [0] * 4 + [1] * 4
    assert not (tmp_path / "o" / "imagenet-v2").exists()   # one run, not a suite of two


@pytest.mark.slow
def test_cli_continual_over_the_corruption_suite(tmp_path, tiny_checkpoint):
    pytest.importorskip("imagecorruptions")
    from shiftlab.datasets.corrupted import corrupt_image, corruption_seed, prepare_like_imagenet_c
    data = make_imagenet_r(tmp_path / "data", classes=[0, 1], per_class=2, size=(48, 40))
    out = tmp_path / "c"
    argv = ["run", "--suite", "corruption", "--dataset", "imagenet-r", "--corruptions", "brightness,contrast",
            "--severity", "2", "--data", str(data.parent), "--model", "shiftlab-tiny", "--pretrained",
            str(tiny_checkpoint), "--methods", "zeroshot", "--order", "continual", "--allow-partial", "--workers", "0",
            "--device", "cpu", "--no-progress", "--views", "1", "--out", str(out)]
    assert cli_main(argv) == 0
    shared = json.loads((out / "run.json").read_text())["shared"]
    assert shared["dataset"] == "imagenet-r:brightness-2+contrast-2" and shared["order"] == "continual"
    assert list(shared["domains"]) == ["brightness-2", "contrast-2"]
    assert shared["domains"]["contrast-2"]["name"] == "contrast" and shared["domains"]["contrast-2"]["severity"] == 2
    stream = read_stream(out)
    assert stream["domain_of"] == [0] * 4 + [1] * 4 and not (out / "brightness-2").exists()
    # each domain's images are its corruption of the same clean image, as a run of that corruption alone reads it
    from shiftlab.datasets.domains import domain_sequence
    from shiftlab.engine.shifts import run_dataset
    clean = build_dataset("imagenet-r", data)
    seq = domain_sequence({f"{c}-2": run_dataset(RunConfig(dataset="imagenet-r", data=str(data.parent), corruption=c,
                                                           severity=2), clean) for c in ("brightness", "contrast")})
    expected = corrupt_image(prepare_like_imagenet_c(clean.image(1)), "contrast", 2,
                             corruption_seed(0, 1, "contrast", 2))
    assert seq.image(5).tobytes() == expected.tobytes()
    paths = {r["path"] for r in json_lines(out / "records.jsonl")}
    assert {p.split("/")[0] for p in paths} == {"brightness-2", "contrast-2"} and len(paths) == 8

"""`--config run.toml` (issue 34, item 5): any flag of `shiftlab run` from a file, the same checks as typed
flags, flags on the command line winning, the file recorded in run.json."""
from __future__ import annotations

import hashlib
import json

import pytest

from _synthetic import make_imagenet_r
from shiftlab.cli import build_parser
from shiftlab.cli import main as cli_main
from shiftlab.commands import config_file

TOML = """\
dataset = "imagenet-r"
data = "{data}"
model = "shiftlab-tiny"
pretrained = "none"
methods = ["zeroshot", "tpt"]
views = 4
limit = 3
batch-size = 2
workers = 0
device = "cpu"
seed = 7
order = "sorted"
no_progress = true
save-probs = false
random-start = false
out = "{out}"
[set]
tpt = {{ lr = 0.02, steps = 2 }}
"""
TYPED = ["--dataset", "imagenet-r", "--model", "shiftlab-tiny", "--pretrained", "none",
         "--methods", "zeroshot,tpt", "--views", "4", "--limit", "3", "--batch-size", "2", "--workers", "0",
         "--device", "cpu", "--seed", "7", "--order", "sorted", "--no-progress", "--no-random-start",
         "--set", "tpt.lr=0.02", "--set", "tpt.steps=2"]


def parse(argv: list[str]):
    parser = build_parser()
    argv, record = config_file.expand(parser, argv)
    args = parser.parse_args(argv)
    return args, record


def without_config(args) -> dict:
    return {k: v for k, v in vars(args).items() if k not in ("config", "func")}


def test_a_file_gives_what_the_same_flags_typed_give(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(TOML.format(data=tmp_path / "d", out=tmp_path / "o"))
    from_file, record = parse(["run", "--config", str(path)])
    typed, none = parse(["run", "--data", str(tmp_path / "d"), "--out", str(tmp_path / "o"), *TYPED])
    assert none is None and without_config(from_file) == without_config(typed)
    assert record["path"] == str(path.resolve()) and record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["values"]["set"] == {"tpt": {"lr": 0.02, "steps": 2}} and record["values"]["limit"] == 3


def test_flags_on_the_command_line_win(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(TOML.format(data=tmp_path / "d", out=tmp_path / "o"))
    args, _ = parse(["run", "--limit", "1", "--config", str(path), "--methods", "mta", "--set", "tpt.lr=0.5"])
    assert args.limit == 1 and args.methods == ["mta"]
    from shiftlab.commands.checks import method_config
    assert method_config(args.method_config)["tpt"] == {"lr": 0.5, "steps": 2}   # later --set values win


def test_yaml_works_too(tmp_path):
    # PyYAML comes with open_clip (timm needs it), so YAML is always there in CI
    path = tmp_path / "run.yaml"
    path.write_text("data: d\nout: o\nlimit: 5\nmethods: [zeroshot, mta]\nset: ['mta.lambda_y=0.3']\nresume: true\n")
    args, record = parse(["run", "--config", str(path)])
    assert (args.data, args.out, args.limit, args.methods, args.resume) == ("d", "o", 5, ["zeroshot", "mta"], True)
    assert args.method_config and record["values"]["limit"] == 5


@pytest.mark.parametrize("text, fragments", [
    ('limt = 3\n', ["run.toml: limt: no such flag of `shiftlab run` (did you mean limit?)"]),
    ('views = 0\n', ["argument --views", "between 1 and 1024, got 0"]),
    ('resume = "yes"\n', ["run.toml: resume: expected true or false, got 'yes'"]),
    ('views = [1, [2]]\n', ["run.toml: views: expected a string, number or true/false, got list"]),
    ('limit = \n', ["run.toml: not valid TOML"]),
    ('methods = "tpt,nosuch"\n', ["--methods", "unknown method nosuch"]),
    # issue 40 case 13: two spellings of one flag kept one of them silently
    ('batch_size = 2\nbatch-size = 3\n', ["run.toml: batch_size and batch-size are the same flag; keep one"]),
])
def test_a_bad_file_is_one_line(tmp_path, capsys, text, fragments):
    path = tmp_path / "run.toml"
    path.write_text('data = "d"\nout = "o"\n' + text)
    with pytest.raises(SystemExit) if "argument" in fragments[0] or "--methods" in fragments[0] else _nothing():
        code = cli_main(["run", "--config", str(path)])
        assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err


def test_a_missing_file_is_one_line(tmp_path, capsys):
    assert cli_main(["run", "--config", str(tmp_path / "nope.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("shiftlab: error: --config ") and "nope.toml: cannot read it" in err


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.slow
def test_the_file_round_trips_through_run_json(tmp_path):
    data = make_imagenet_r(tmp_path / "data", classes=range(200), per_class=1, size=(32, 24))
    out = tmp_path / "run"
    path = tmp_path / "run.toml"
    path.write_text(TOML.format(data=data, out=out).replace('["zeroshot", "tpt"]', '["zeroshot"]')
                    .replace("random-start = false\n", ""))   # an attack's field: refused without --attack
    assert cli_main(["run", "--config", str(path), "--limit", "2"]) == 0
    recorded = json.loads((out / "run.json").read_text())["config"]
    values = recorded["config_file"]["values"]
    assert recorded["config_file"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    # the file, read back, is what the run used, except where the command line won
    assert values["limit"] == 3 and recorded["limit"] == 2
    assert recorded["seed"] == values["seed"] == 7 and recorded["order"] == values["order"] == "sorted"
    assert recorded["batch_size"] == values["batch-size"] == 2 and recorded["views"] == values["views"]
    assert recorded["methods"] == values["methods"] and recorded["method_config"] == {"tpt": {"lr": 0.02, "steps": 2}}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["config_file"] == recorded["config_file"]
    # the run.json's config, written back as a file, runs again: resume finds nothing left to do
    again = tmp_path / "again.toml"
    keep = ("dataset", "data", "model", "views", "seed", "order", "limit", "batch_size", "workers", "device", "out")
    again.write_text("".join(f"{k} = {json.dumps(recorded[k])}\n" for k in keep)
                     + 'pretrained = "none"\nmethods = ["zeroshot"]\nresume = true\nno-progress = true\n'
                     + '[set]\ntpt = { lr = 0.02, steps = 2 }\n')
    lines = (out / "records.jsonl").read_text()
    assert cli_main(["run", "--config", str(again)]) == 0
    assert (out / "records.jsonl").read_text() == lines
    assert json.loads((out / "run.json").read_text())["config"]["config_file"]["path"] == str(again.resolve())

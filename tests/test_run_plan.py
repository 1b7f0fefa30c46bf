"""The run plan (engine/run_plan.py): a RunConfig resolved once, without torch, into each method's effective config,
the views encoded per group and the attack; the one place a run calls `effective_config`; `shiftlab run --dry-run`
prints it before torch is imported; a CLI run resolves it once."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from shiftlab.engine.config import RunConfig
from shiftlab.engine.run_plan import PlanError, recipe_key, resolve_plan
from shiftlab.methods.catalogue.declarations import spec
from shiftlab.views.recipe import ViewRecipe

SRC = Path(__file__).resolve().parents[1] / "src" / "shiftlab"


def test_the_plan_holds_each_methods_effective_config_and_views():
    config = RunConfig(methods=["tpt", "tda", "zeroshot"], views=8, method_config={"tda": {"pos_alpha": 2.0}},
                       precision="fp32")
    plan = resolve_plan(config)
    assert list(plan.method_plans()) == ["tpt", "tda", "zeroshot"]
    assert plan.datasets == ("imagenet-r",) and plan.attack == {"name": "none"}
    tpt, tda, zeroshot = plan.method_plans().values()
    assert (tpt.kind, tda.kind, zeroshot.kind) == ("episodic", "online", "episodic")
    assert tpt.reads == ("frozen_features",)
    assert resolve_plan(RunConfig(methods=["ttl"])).method_plans()["ttl"].reads == ("own_tower",)   # its LoRA tower
    assert tda.config.pos_alpha == 2.0 and tda.config.pos_beta == spec("tda").config_class().pos_beta   # --set
    assert tpt.config.views.n_views == 8 and tda.config.views.n_views == 8    # --views on view-reading methods
    assert zeroshot.recipe == ViewRecipe(n_views=1)                            # view 0 alone
    # one group: TPT's and TDA's recipe and zero-shot's view 0 are of one family; encoded, the most views any reads
    assert recipe_key(tpt.recipe) == recipe_key(zeroshot.recipe)
    assert plan.view_groups() == {(recipe_key(tpt.recipe), "auto"): 8}
    assert config.method_config == {"tda": {"pos_alpha": 2.0}} and config.methods == ["tpt", "tda", "zeroshot"]


def test_the_plan_resolves_each_dataset_of_a_suite_with_its_paper_values():
    # TPT's code turns AugMix on for the fine-grained sets only (tpt/spec.py dataset_values)
    plan = resolve_plan(RunConfig(methods=["tpt"], protocol="paper"), ["imagenet-r", "flowers102"])
    assert plan.datasets == ("imagenet-r", "flowers102")
    assert plan.method_configs("imagenet-r")["tpt"].views.augmix is False
    assert plan.method_configs("flowers102")["tpt"].views.augmix is True
    assert plan.method_configs("flowers102")["tpt"].precision == "fp16"


def test_all_is_expanded_and_the_attack_filled_in():
    plan = resolve_plan(RunConfig(methods=["all"], attack={"name": "pgd", "eps": 1 / 255}, model="ViT-B-16"))
    names = list(plan.method_plans())
    assert "all" not in names and {"tpt", "tda", "zeroshot"} <= set(names) and len(names) == len(set(names))
    assert plan.config.methods == names
    assert {m.kind for m in plan.method_plans().values()} == {"episodic", "online"}
    assert plan.attack["name"] == "pgd" and plan.attack["eps"] == pytest.approx(1 / 255) and len(plan.attack) > 2


def test_the_plan_says_what_all_leaves_out_and_why():
    """`--dry-run --methods all` used to list the methods it runs and say nothing of those it leaves out (the run
    itself warns): the ViT-only methods on a ResNet, DiffTPT without its folder of generated views."""
    from shiftlab.methods.catalogue.declarations import spec_names
    plan = resolve_plan(RunConfig(methods=["all"], model="shiftlab-tiny"))
    vit_only = [n for n in spec_names() if "resnet" not in spec(n).towers]
    assert vit_only and not set(vit_only) & set(plan.method_plans())
    lines = plan.text().splitlines()
    assert f"methods 'all' leaves out {', '.join(vit_only)} (another image tower only)" in lines
    (difftpt,) = [line for line in lines if line.startswith("methods 'all' leaves out difftpt")]
    assert "difftpt" not in plan.method_plans() and "diffusion_views is unset" in difftpt
    assert "leaves out" not in resolve_plan(RunConfig(methods=["zeroshot"])).text()


def test_all_leaves_out_the_methods_whose_files_the_run_has_not(tmp_path):
    """`--methods all` on a ViT used to stop at the first method built without its files (COSMIC's DINOv2 checkpoint,
    PromptAlign's and TAPT's token statistics: none can be downloaded), after the data and the model were loaded,
    though the dry run had passed; a method named alone is refused before torch, as DiffTPT without its folder."""
    from shiftlab.engine.config import catalogue_problem
    config = RunConfig(methods=["all"], model="shiftlab-tiny-vit")
    plan = resolve_plan(config)
    assert not {"cosmic", "promptalign", "tapt"} & set(plan.method_plans()) and "tpt" in plan.method_plans()
    lines = plan.text().splitlines()
    assert "methods 'all' leaves out promptalign (promptalign aligns token statistics: set means and vars " \
           "(their ImgNetpre_vis_{means,vars}.pt files; e.g. promptalign's means='FILE'" in " ".join(lines)
    assert any(line.startswith("methods 'all' leaves out tapt (tapt aligns token statistics: set means_adv, ")
               for line in lines)
    assert any(line.startswith("methods 'all' leaves out cosmic (cosmic: DINOv2 weights ") for line in lines)
    assert catalogue_problem(RunConfig(methods=["promptalign"], model="shiftlab-tiny-vit")).startswith(
        "promptalign aligns token statistics: set means and vars")
    with pytest.raises(PlanError, match="^tapt aligns token statistics"):
        resolve_plan(RunConfig(methods=["tapt"], model="shiftlab-tiny-vit"))
    missing = str(tmp_path / "nope.pt")
    assert catalogue_problem(RunConfig(methods=["promptalign"], model="shiftlab-tiny-vit", method_config={
        "promptalign": {"means": missing, "vars": missing}})) == f"promptalign.means: no such file {missing}"
    assert "cosmic: DINOv2 weights" in catalogue_problem(RunConfig(methods=["cosmic"]))
    # what makes them runnable keeps them in "all"
    given = {"cosmic": {"dino_pretrained": "none"}, "promptalign": {"align": False}, "tapt": {"align": False}}
    kept = resolve_plan(RunConfig(methods=["all"], model="shiftlab-tiny-vit", method_config=given))
    assert {"cosmic", "promptalign", "tapt"} <= set(kept.method_plans()) and "leaves out cosmic" not in kept.text()


def test_the_plan_says_which_set_values_no_method_of_the_run_reads():
    """`--methods zeroshot --set tpt.lr=0.1` ran zero-shot alone and nothing said tpt.lr went unused."""
    text = resolve_plan(RunConfig(methods=["zeroshot", "tda"], method_config={
        "tpt": {"lr": 0.1, "steps": 2}, "tda": {"pos_alpha": 2.0}})).text()
    assert "settings for methods the run does not run (not used): tpt (lr, steps)" in text.splitlines()
    assert "not used" not in resolve_plan(RunConfig(methods=["tda"], method_config={"tda": {"pos_alpha": 2.0}})).text()


def test_a_refused_setting_is_one_line():
    with pytest.raises(PlanError, match=r"^mta: needs at least 5 views .* got 4"):
        resolve_plan(RunConfig(methods=["mta"], views=4))
    # an online method in a run of several settings is planned (one state per setting: engine.setting_states)
    plan = resolve_plan(RunConfig(methods=["tda"], attack={"name": "pgd"}, clean_and_robust=True))
    assert plan.config.settings() == ["clean", "pgd"] and plan.method_plans()["tda"].kind == "online"


def _callers(function: str) -> list[tuple[str, str]]:
    """(module, enclosing function or "<module>") of every call of `function` (by name or attribute) in the
    package, one row per call site."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        if function not in text:
            continue
        tree = ast.parse(text)
        enclosing = {}
        for func in ast.walk(tree):
            if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(func):
                    enclosing.setdefault(node, func.name)   # ast.walk is breadth-first: the outermost function
        for node in ast.walk(tree):
            callee = getattr(node, "func", None) if isinstance(node, ast.Call) else None
            if (getattr(callee, "id", None) or getattr(callee, "attr", None)) == function:
                found.append((str(path.relative_to(SRC.parent)), enclosing.get(node, "<module>")))
    return sorted(found)


def test_effective_config_has_one_production_call_site():
    # one function resolves a method's config: a run's plan asks it per method and dataset, `create_method` (the
    # library) for the method it builds, `left_out_of_all` (what "all" leaves out) for each method "all" may run
    assert _callers("effective_config") == [("shiftlab/methods/catalogue/method_plan.py", "plan_method")]
    assert _callers("plan_method") == [("shiftlab/engine/run_plan.py", "resolve_plan"),
                                       ("shiftlab/methods/base.py", "create_method"),
                                       ("shiftlab/methods/catalogue/method_plan.py", "left_out_of_all")]


DRY_RUN = """
import json, sys
from shiftlab.cli import main
code = main(json.loads(sys.argv[1]))
print(json.dumps({"code": code, "heavy": sorted(m for m in ("torch", "open_clip", "numpy") if m in sys.modules)}))
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from shiftlab.synthetic import make_imagenet_r
    root = tmp_path_factory.mktemp("plan-data")
    make_imagenet_r(root, per_class=1, classes=[0, 1])
    return root


@pytest.mark.slow
def test_dry_run_prints_the_plan_without_torch_and_writes_nothing(data, tmp_path):
    out = tmp_path / "run"
    argv = ["run", "--data", str(data), "--out", str(out), "--methods", "tpt,tda,cosmic", "--views", "8",
            "--set", "tda.pos_alpha=2", "--set", "cosmic.dino_pretrained=none", "--allow-partial", "--features",
            str(tmp_path / "fs"), "--dry-run"]
    proc = subprocess.run([sys.executable, "-c", DRY_RUN, json.dumps(argv)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    *printed, last = proc.stdout.strip().splitlines()
    assert json.loads(last) == {"code": 0, "heavy": []}
    text = "\n".join(printed)
    assert text.startswith("methods: tpt, tda, cosmic  (protocol leaderboard, precision auto)")
    assert "  tda (online, reads frozen_features): 8 view(s), precision auto; pos_capacity=3, pos_alpha=2.0," in text
    assert "  views encoded: 8 at precision auto" in text
    # the feature-store entry on either device "auto" may find, without torch: fp16 autocast on CUDA, fp32 on the CPU
    assert "    8 view(s) on cuda: precision fp16, seed 0, storage fp16, recipe {" in text
    assert "    8 view(s) on cpu: precision fp32, seed 0, storage fp16, recipe {" in text
    # COSMIC's DINOv2 (random weights of seed 0): its identity, the key of its entry, computed without torch
    dino = ('{"checkpoint_sha256": null, "encoder": "cosmic.dinov2", '
            '"model": "vit_large_patch14_reg4_dinov2.lvd142m", "random_seed": 0, '
            '"reads": "view 0, CLIP-normalised, float32", "returns": "L2-normalised x_norm_clstoken", "version": 1}')
    assert f"    cosmic reads view 0 through its frozen encoder {dino}" in text
    assert f"    cosmic's frozen encoder of view 0 {dino} on cpu: precision fp32, seed 0, storage fp16" in text
    assert not out.exists() and not (tmp_path / "fs").exists()


@pytest.mark.slow
def test_a_cli_run_resolves_its_plan_once(data, tmp_path, monkeypatch):
    from shiftlab.cli import main as cli_main
    from shiftlab.engine import loop, run_plan
    calls = []
    real = run_plan.resolve_plan

    def counting(*args, **kwargs):
        calls.append(args[0].methods)
        return real(*args, **kwargs)

    monkeypatch.setattr(run_plan, "resolve_plan", counting)
    monkeypatch.setattr(loop, "resolve_plan", counting)
    code = cli_main(["run", "--data", str(data), "--out", str(tmp_path / "run"), "--model", "shiftlab-tiny",
                     "--pretrained", "none", "--methods", "zeroshot", "--limit", "2", "--allow-partial",
                     "--no-progress"])
    assert code == 0
    assert calls == [["zeroshot"]]
    assert (tmp_path / "run" / "summary.json").is_file()


# what the paper protocol's recipes read that is not shipped, as each method's refusal starts
PAPER_FILES = {"awt": "awt.description_file: not set; AWT reads its authors' description files",
               "dmn_zs": "dmn_zs.cupl_file: text_head 'tip_cupl' needs CuPL's class descriptions",
               "dpe": "dpe.cupl_file: text_head 'tip_cupl' needs CuPL's class descriptions",
               "tps": "tps.descriptors_file: text_head 'ensemble_descriptors' needs the class descriptors"}


def test_all_under_the_paper_protocol_leaves_out_the_methods_whose_files_it_reads():
    """`--methods all --protocol paper` left out only what the defaults lack (DiffTPT's folder, COSMIC's DINOv2):
    its dry run passed, then the run stopped at DMN-ZS's CuPL file, then AWT's descriptions, DPE's, TPS's..."""
    plan = resolve_plan(RunConfig(methods=["all"], model="shiftlab-tiny", protocol="paper"))
    lines = plan.text().splitlines()
    for name, reason in PAPER_FILES.items():
        assert name not in plan.method_plans() and plan.left_out[name].startswith(reason)
        assert f"methods 'all' leaves out {name} ({plan.left_out[name]})" in lines
    # the leaderboard protocol's defaults read none of them; the files given (or another head), paper keeps them
    assert set(PAPER_FILES) <= set(resolve_plan(RunConfig(methods=["all"], model="shiftlab-tiny")).method_plans())
    given = {"awt": {"n_descriptions": 0}, "dmn_zs": {"cupl_file": "cupl.json"}, "dpe": {"text_head": "ensemble"},
             "tps": {"descriptors_file": "d.json"}}
    kept = resolve_plan(RunConfig(methods=["all"], model="shiftlab-tiny", protocol="paper", method_config=given))
    assert set(PAPER_FILES) <= set(kept.method_plans()) and not set(PAPER_FILES) & set(kept.left_out)
    # per dataset: a suite leaves a method out where one of its datasets' values needs the file
    assert "dmn_zs" in resolve_plan(RunConfig(methods=["all"], model="shiftlab-tiny", protocol="paper"),
                                    ["imagenet-r", "flowers102"]).left_out


REFUSED_BEFORE_TORCH = """
import json, sys
from shiftlab.cli import main
codes = [main(argv) for argv in json.loads(sys.argv[1])]
print(json.dumps({"codes": codes, "heavy": sorted(m for m in ("torch", "open_clip", "numpy") if m in sys.modules)}))
"""


@pytest.mark.slow
def test_a_paper_method_named_without_its_file_is_refused_before_torch(data, tmp_path):
    argv = ["run", "--data", str(data), "--out", str(tmp_path / "run"), "--model", "shiftlab-tiny", "--pretrained",
            "none", "--methods", "zeroshot,dmn_zs", "--protocol", "paper", "--allow-partial"]
    proc = subprocess.run([sys.executable, "-c", REFUSED_BEFORE_TORCH, json.dumps([argv + ["--dry-run"], argv])],
                          capture_output=True, text=True, timeout=120)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"codes": [2, 2], "heavy": []}, proc.stderr
    refusals = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(refusals) == 2 and len(set(refusals)) == 1, proc.stderr
    assert refusals[0].startswith(f"shiftlab run: error: {PAPER_FILES['dmn_zs']} (a JSON file, class name -> "
                                  "sentences, not shipped): pass --set dmn_zs.cupl_file=PATH"), refusals
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_all_under_the_paper_protocol_runs_without_the_files_it_left_out(data, tmp_path, capsys):
    from shiftlab.cli import main as cli_main
    from shiftlab.methods.catalogue.declarations import spec_names
    argv = ["run", "--data", str(data), "--out", str(tmp_path / "run"), "--model", "shiftlab-tiny", "--pretrained",
            "none", "--methods", "all", "--protocol", "paper", "--allow-partial", "--limit", "2", "--workers", "0",
            "--no-progress", "--set", "rlcf.reward_model=shiftlab-tiny", "--set", "rlcf.reward_pretrained=none"]
    assert cli_main([*argv, "--dry-run"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("methods 'all' leaves out")]
    left_out = {n for line in said for n in line.removeprefix("methods 'all' leaves out ").split(" (")[0].split(", ")}
    assert set(PAPER_FILES) | {"cosmic", "difftpt"} <= left_out
    assert cli_main(argv) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(spec_names()) - set(summary["methods"]) == left_out and summary["errors"] == 0
    warned = capsys.readouterr().err.splitlines()   # the run says it in the dry run's words
    assert all(f"shiftlab run: warning: {line}" in warned for line in said), (said, warned)
    assert "another image tower only" in " ".join(said)


@pytest.mark.slow
def test_a_run_warns_once_of_set_values_for_methods_it_does_not_run(data, tmp_path, capsys):
    """`--methods zeroshot --set tpt.lr=0.1`: the dry run said tpt.lr was not used, the run itself said nothing."""
    from shiftlab.cli import main as cli_main
    argv = ["run", "--data", str(data), "--out", str(tmp_path / "run"), "--model", "shiftlab-tiny", "--pretrained",
            "none", "--methods", "zeroshot", "--limit", "1", "--allow-partial", "--no-progress", "--workers", "0",
            "--set", "tpt.lr=0.1", "--set", "tpt.steps=2"]
    assert cli_main([*argv, "--dry-run"]) == 0
    (said,) = [line for line in capsys.readouterr().out.splitlines() if "not used" in line]
    assert said == "settings for methods the run does not run (not used): tpt (lr, steps)"
    assert cli_main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "not used" in line] == [f"shiftlab run: warning: {said}"], err

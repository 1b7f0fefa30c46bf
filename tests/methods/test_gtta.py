"""GTTA is registered and listed, and refused in one line with its reason (it trains on labelled source data) by
the library, by a run's plan and by `shiftlab methods`' listing; `--methods all` leaves it out (the CLI's refusal
before torch: tests/test_checks_before_torch.py)."""
from __future__ import annotations

import pytest

import shiftlab
from shiftlab.engine.config import RunConfig, settings_problem
from shiftlab.methods.catalogue import listing as catalogue
from shiftlab.methods.catalogue.declarations import refused_methods, spec, spec_names

REASON = "gtta is registered but cannot run here: it trains on labelled source images at every step"


def test_gtta_is_registered_listed_and_left_out_of_the_runnable_names(capsys):
    assert spec("gtta").label == "GTTA" and "gtta" not in spec_names() and "gtta" in refused_methods()
    assert "gtta" not in catalogue.names() and list(catalogue.refused()) == ["gtta"]
    from shiftlab.cli import main
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert "== registered, not runnable on CLIP here\ngtta             refused   it trains on labelled source" in out


def test_gtta_is_refused_in_one_line_by_the_library_and_a_run_plan(tmp_path):
    with pytest.raises(ValueError, match=f"^{REASON}.*web pretraining data$"):      # refused before the model
        shiftlab.create_method("gtta", None, ["cat", "dog"])
    problem = settings_problem(RunConfig(data=str(tmp_path), methods=["zeroshot", "gtta"], out=str(tmp_path / "o")))
    assert problem.startswith(REASON) and "\n" not in problem

"""Every method of the two CLIP test-time adaptation toolkits issue #43 names maps to a shiftlab method, or to a
one-line reason it cannot run on CLIP here (issue #43, "Done when").

The toolkits' method folders, listed once by file name with `git ls-tree` of the fetched repositories (data here,
so the test runs offline):

- MarcLafon/cliptta at f4221f4, `ttavlm/methods/` (CLIPTTA's toolkit);
- mariodoebler/test-time-adaptation at 8b2ed63, `classification/methods/`.

Each file is MAPPED to the registered shiftlab method that runs it (a refused one, GTTA, is registered and says
why it cannot run), NOT_A_METHOD with the reason (a package file or a shared base class), UNOFFERED with the
one-line reason it is not run.
"""
from __future__ import annotations

import pytest

from shiftlab.methods.catalogue.declarations import refused_methods, spec_names

CLIPTTA = "MarcLafon/cliptta@f4221f4 ttavlm/methods/"
MARIODOEBLER = "mariodoebler/test-time-adaptation@8b2ed63 classification/methods/"

FILES = {
    CLIPTTA: (
        "__init__.py", "abstract_model.py", "adacontrast.py", "calip.py", "clipartt.py", "cliptta.py",
        "cliptta_otsu.py", "eata.py", "lame.py", "ostta.py", "rotta.py", "sar.py", "sotta.py", "source.py",
        "stamp.py", "tda.py", "tent.py", "unient.py", "watt.py", "zero.py",
    ),
    MARIODOEBLER: (
        "__init__.py", "adacontrast.py", "base.py", "bn.py", "cmf.py", "cotta.py", "deyo.py", "eata.py", "gtta.py",
        "lame.py", "memo.py", "norm.py", "rmt.py", "roid.py", "rotta.py", "rpl.py", "santa.py", "sar.py", "source.py",
        "tent.py", "tpt.py", "ttaug.py", "vte.py",
    ),
}

# (toolkit, file) -> the shiftlab method that runs it
MAPPED = {
    (MARIODOEBLER, "cotta.py"): "cotta",
    (MARIODOEBLER, "rmt.py"): "rmt",
    (MARIODOEBLER, "santa.py"): "santa",
    (CLIPTTA, "adacontrast.py"): "adacontrast",
    (CLIPTTA, "rotta.py"): "rotta",
    (MARIODOEBLER, "adacontrast.py"): "adacontrast",
    (MARIODOEBLER, "rotta.py"): "rotta",
    (CLIPTTA, "calip.py"): "calip",
    (CLIPTTA, "clipartt.py"): "clipartt",
    (CLIPTTA, "cliptta_otsu.py"): "cliptta",        # its CLIPTTA class; the OOD-aware variant is cliptta_ood
    (CLIPTTA, "eata.py"): "eata",
    (CLIPTTA, "lame.py"): "lame",
    (CLIPTTA, "ostta.py"): "ostta",
    (CLIPTTA, "sar.py"): "sar",
    (CLIPTTA, "sotta.py"): "sotta",
    (CLIPTTA, "source.py"): "zeroshot",             # SourceModel: CLIP without adaptation
    (CLIPTTA, "stamp.py"): "stamp",
    (CLIPTTA, "tda.py"): "tda",
    (CLIPTTA, "tent.py"): "tent",
    (CLIPTTA, "unient.py"): "unient",
    (CLIPTTA, "watt.py"): "watt",
    (CLIPTTA, "zero.py"): "zero",
    (MARIODOEBLER, "bn.py"): "norm_stats",          # AlphaBatchNorm, EMABatchNorm: the layers of norm.py's modes
    (MARIODOEBLER, "cmf.py"): "cmf",
    (MARIODOEBLER, "deyo.py"): "deyo",
    (MARIODOEBLER, "eata.py"): "eata",
    (MARIODOEBLER, "gtta.py"): "gtta",              # registered and refused: labelled source data every step
    (MARIODOEBLER, "lame.py"): "lame",
    (MARIODOEBLER, "memo.py"): "memo",
    (MARIODOEBLER, "norm.py"): "norm_stats",        # BNTest, BNAlpha, BNEMA: test-time normalisation statistics
    (MARIODOEBLER, "roid.py"): "roid",
    (MARIODOEBLER, "rpl.py"): "rpl",
    (MARIODOEBLER, "sar.py"): "sar",
    (MARIODOEBLER, "source.py"): "zeroshot",        # Source: the model without adaptation
    (MARIODOEBLER, "tent.py"): "tent",
    (MARIODOEBLER, "tpt.py"): "tpt",
    (MARIODOEBLER, "ttaug.py"): "ttaug",
    (MARIODOEBLER, "vte.py"): "vte",
}

# (toolkit, file) -> why it is no method to map
NOT_A_METHOD = {
    (CLIPTTA, "__init__.py"): "the package: imports the method classes and builds the chosen one",
    (CLIPTTA, "abstract_model.py"): "the base class every method subclasses (shiftlab: methods/common/)",
    (MARIODOEBLER, "__init__.py"): "the package: imports every method so the registry sees it",
    (MARIODOEBLER, "base.py"): "TTAMethod, the base class every method subclasses (shiftlab: methods/common/)",
}

# (toolkit, file) -> the one-line reason shiftlab does not run it
UNOFFERED = {
    (CLIPTTA, "cliptta.py"): "CLIPTTA_Old, an earlier CLIPTTA (adapts on the memory alone) that their ImageNet "
                             "closed-set scripts still run; shiftlab's cliptta is the cliptta_otsu.py class the "
                             "paper and every other script run (the cliptta README)",
}

# (toolkit, file) -> the registry name another branch of issue #43 is adding; NOT registered on this branch
EVERY = [(toolkit, name) for toolkit, names in FILES.items() for name in names]
TABLES = {"MAPPED": MAPPED, "NOT_A_METHOD": NOT_A_METHOD, "UNOFFERED": UNOFFERED}


def test_the_lists_are_the_toolkits_method_folders():
    assert len(FILES[CLIPTTA]) == len(set(FILES[CLIPTTA])) == 20
    assert len(FILES[MARIODOEBLER]) == len(set(FILES[MARIODOEBLER])) == 23
    assert all(name.endswith(".py") for names in FILES.values() for name in names)


@pytest.mark.parametrize("toolkit, filename", EVERY)
def test_each_file_is_in_exactly_one_table(toolkit, filename):
    holding = [table for table, entries in TABLES.items() if (toolkit, filename) in entries]
    assert len(holding) == 1, f"{toolkit}{filename} is in {holding or 'no table'}; it must be in exactly one"


def test_no_stray_entries():
    listed = {key for entries in TABLES.values() for key in entries}
    assert listed == set(EVERY), sorted(listed ^ set(EVERY))


@pytest.mark.parametrize("toolkit, filename", sorted(MAPPED))
def test_mapped_files_run_as_a_registered_method_or_say_why_not(toolkit, filename):
    name = MAPPED[(toolkit, filename)]
    refused = refused_methods()
    assert name in spec_names() or name in refused, f"{toolkit}{filename}: {name!r} is not registered"
    if name in refused:     # registered and refused: its reason is one line
        assert refused[name].strip() and "\n" not in refused[name]


@pytest.mark.parametrize("toolkit, filename", sorted({**NOT_A_METHOD, **UNOFFERED}))
def test_the_others_give_a_one_line_reason(toolkit, filename):
    why = {**NOT_A_METHOD, **UNOFFERED}[(toolkit, filename)]
    assert why.strip() and "\n" not in why


def test_the_sixteen_of_issue_43_are_mapped_and_registered():
    issue = {"cotta", "rmt", "roid", "cmf", "santa", "memo", "rpl", "norm_stats", "ttaug", "gtta", "adacontrast",
             "rotta", "sotta", "ostta", "stamp", "unient"}
    assert issue <= set(MAPPED.values())
    assert issue <= set(spec_names()) | set(refused_methods())

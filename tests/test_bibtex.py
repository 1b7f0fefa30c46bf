"""`shiftlab methods --bibtex` (issue 34, item 6 / finding 9): every method's citation, as BibTeX a user can
paste into a .bib file (each entry once, distinct keys), read from the methods' specs without torch."""
from __future__ import annotations

import re
import subprocess
import sys

from shiftlab.cli import main as cli_main

# the methods registered when `--bibtex` came, each with the title of the paper it cites
TITLES = {
    "zeroshot": "Learning Transferable Visual Models From Natural Language Supervision",
    "prompt_ensemble": "Learning Transferable Visual Models From Natural Language Supervision",
    "view_ensemble": "R-TPT: Improving Adversarial Robustness of Vision-Language Models through Test-Time Prompt "
                     "Tuning",
    "tpt": "Test-Time Prompt Tuning for Zero-Shot Generalization in Vision-Language Models",
    "ctpt": "C-TPT: Calibrated Test-Time Prompt Tuning for Vision-Language Models via Text Feature Dispersion",
    "rtpt": "R-TPT: Improving Adversarial Robustness of Vision-Language Models through Test-Time Prompt Tuning",
    "mta": "On the Test-Time Zero-Shot Generalization of Vision-Language Models: Do We Really Need Prompt Learning?",
    "zero": "Frustratingly Easy Test-Time Adaptation of Vision-Language Models",
    "tda": "Efficient Test-Time Adaptation of Vision-Language Models",
    "dmn_zs": "Dual Memory Networks: A Versatile Adaptation Approach for Vision-Language Models",
    "boostadapter": "BoostAdapter: Improving Test-Time Adaptation via Regional Bootstrapping",
    "dpe": "Dual Prototype Evolving for Test-Time Generalization of Vision-Language Models",
    "dota": "DOTA: Distributional Test-Time Adaptation of Vision-Language Models",
    "onzeta": "Online Zero-Shot Classification with CLIP",
    "ecalp": "Efficient and Context-Aware Label Propagation for Zero-/Few-Shot Training-Free Adaptation of "
             "Vision-Language Model",
    "dynaprompt": "DynaPrompt: Dynamic Test-Time Prompt Tuning",
    "tps": "Just Shift It: Test-Time Prototype Shifting for Zero-Shot Generalization with Vision-Language Models",
    "ttl": "Test-Time Low Rank Adaptation via Confidence Maximization for Zero-Shot Generalization of "
           "Vision-Language Models",
    "rlcf": "Test-Time Adaptation with CLIP Reward for Zero-Shot Generalization in Vision-Language Models",
    "oga": "Online Gaussian Test-Time Adaptation of Vision-Language Models",
    "stata": "Realistic Test-Time Adaptation of Vision-Language Models",
}


def entries(text: str) -> list[tuple[list[str], str, str, str]]:
    """(methods named in the comment above it, entry type, key, the entry) for each BibTeX entry printed."""
    out = []
    for block in text.strip().split("\n\n"):
        lines = block.splitlines()
        if not lines[0].startswith("% ") or len(lines) < 2:
            continue
        methods = [m.strip() for m in lines[0][2:].split(",")]
        entry = re.sub(r"\n {4,}", " ", "\n".join(lines[1:]))   # a field continued on indented lines
        head = re.match(r"@(\w+)\{([\w:-]+),\n", entry)
        assert head, entry
        out.append((methods, head.group(1), head.group(2), entry))
    return out


def test_every_method_is_cited_once_with_its_papers_title(capsys):
    assert cli_main(["methods", "--bibtex"]) == 0
    printed = entries(capsys.readouterr().out)
    keys = [key for _, _, key, _ in printed]
    assert len(keys) == len(set(keys)), "an entry printed twice: a .bib file takes each key once"
    cited = {}
    for methods, kind, _, entry in printed:
        assert kind in ("inproceedings", "article", "misc")
        assert entry.count("{") == entry.count("}") and entry.endswith("}")
        assert re.search(r"^  year = \{20\d\d\}", entry, re.M) and re.search(r"^  author = \{.+\}", entry, re.M)
        for m in methods:
            cited.setdefault(m, []).append(re.search(r"^  title = \{(.+)\},$", entry, re.M).group(1))
    for method, title in TITLES.items():
        assert title in cited[method], (method, cited.get(method))
    # a variant of a family cites its own paper, not its family's
    assert cited["ctpt"] != cited["tpt"] and cited["rtpt"] != cited["tpt"]


def test_bibtex_needs_no_torch():
    code = ("import sys; from shiftlab.cli import main; code = main(['methods', '--bibtex']); "
            "print('TORCH' if 'torch' in sys.modules else 'NO TORCH', code)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "NO TORCH 0", done.stderr

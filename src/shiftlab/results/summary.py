"""A run's summary: summary.json (scores from the records, identity, timings) and summary.md.

records.jsonl is the source of truth (shiftlab.rundir.records owns it and its scoring); the
summary is rewritten from it by one function, `finish_run`, at the end of every run and by
`shiftlab merge`. Its labels and config come from run.json (the identity, and the `config`
section the run wrote when it started), so a merge after a stopped torchrun job writes the
summary the run would have written.
"""
from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import writes
from ..attacks import split_budgets
from ..methods.catalogue import listing as catalogue
from ..options import OPTIONS
from ..rundir import record_files
from ..rundir import records as run_records
from ..rundir.record_files import run_dir_error
from ..rundir.records import ADAPTIVE_SUFFIX, is_adaptive
from ..writes import resume_advice
from . import metrics, sanity
from .display import attack_details, attack_label, is_random_weights, model_label
from .ood import score_open_set, score_own
from .scoring import score_records
from .suite_table import partial_mark

SUMMARY = "summary.json"
SUMMARY_MD = "summary.md"


# -- finishing a run -------------------------------------------------------------------

class RunSummary(dict):
    """What `shiftlab.run` returns: summary.json's dict (`["methods"][name]["top1"]`, ...), printed as one
    readable line: the run directory, the samples and each method's top-1."""

    def __repr__(self) -> str:
        config = self.get("config") or {}
        methods = self.get("methods") or {}
        scores = ", ".join(f"{name} {_percent(entry.get('top1'))}" for name, entry in methods.items())
        n = max((entry.get("n") or 0 for entry in methods.values()), default=0)
        where = f"{config.get('out')!r}, " if config.get("out") else ""
        return f"RunSummary({where}{config.get('dataset', '?')}, n={n}, top-1 %: {scores or 'none'})"


def _percent(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "-"


def finish_run(run_dir: Path, timings: dict | None = None,
               warn: Callable[[str], None] | None = None) -> tuple[dict, str]:
    """merge -> score -> summary.json and summary.md of a run directory; returns (summary, markdown).

    Lines the run's schema (`run_schema`) refuses are quarantined first, shards are folded into
    records.jsonl, and the summary is made from the records, run.json's identity and config, and
    `timings` (None: the timings of the summary the directory already has). The caller holds the
    run lock. Raises RunIdentityError for a damaged run.json and RunDirError for an unwritable folder.
    """
    from ..rundir import identity as run_identity
    from .published import published_for_run
    run_dir = Path(run_dir)
    from ..rundir.stream import read_stream
    ident = run_identity.read(run_dir) or {}
    recorded = read_stream(run_dir)   # the stream as run: its ids are the records' (any kind, any order of K)
    schema = run_schema(ident, **({"ids": frozenset(recorded["ids"])} if recorded is not None else {}))
    record_files.quarantine(run_dir, warn, schema)
    record_files.merge_records(run_dir, schema)
    recs = record_files.load_records(run_dir, schema)
    from ..rundir.probs import merge_probs
    merge_probs(run_dir, recs)   # torchrun: the ranks' probs/ files folded in
    previous = _read_summary(run_dir)
    if timings is None:
        timings = previous.get("timings") if isinstance(previous.get("timings"), dict) else None
    recorded = {k: v for k, v in ident.items() if k != CONFIG} or None
    summary = summarize(recs, run_config(ident, previous), timings, recorded)
    return summary, write_summary(run_dir, summary, published_for_run(summary))


CONFIG = "config"   # run.json's section holding the summary's config (written when the run starts)


def run_config(ident: dict, previous: dict | None = None) -> dict:
    """The summary's config: run.json's `config`; for a run.json written before it had one, the
    earlier summary's, else what the identity says (dataset, model, weights, settings, methods)."""
    cfg = ident.get(CONFIG)
    if isinstance(cfg, dict):
        return cfg
    cfg = (previous or {}).get("config")
    if isinstance(cfg, dict) and cfg:
        return cfg
    shared = ident.get("shared") if isinstance(ident.get("shared"), dict) else {}
    methods = ident.get("methods") if isinstance(ident.get("methods"), dict) else {}
    keep = ("dataset", "model", "pretrained", "protocol", "views", "augmix", "seed", "order", "limit", "attack",
            "clean_and_robust", "precision", "n_samples", "checkpoint_sha256", "weights_source")
    cfg = {k: shared[k] for k in keep if k in shared}
    if "model" in shared:
        cfg["model_resolved"] = shared["model"]
    return {**cfg, "methods": list(methods), "method_settings": methods} if methods else cfg


def run_schema(ident: dict | None, stream: bool = True, **known: Any) -> run_records.RecordSchema:
    """The records' schema of the run whose run.json holds `ident`: its methods, settings and samples
    (with `stream`, the stream its seed, order and --limit make; this imports torch, which the report
    does without: a finished run's records were checked against it by `finish_run`), and its classes
    when run.json's config lists them."""
    ident = ident if isinstance(ident, dict) else {}
    shared = ident.get("shared") if isinstance(ident.get("shared"), dict) else {}
    n, limit = shared.get("n_samples"), shared.get("limit")
    # a stream its seed alone does not make (another order of --orders K, a label or domain stream) is the one
    # stream.json recorded: the caller passes its ids (finish_run), or they are checked against n_samples only
    rebuildable = shared.get("stream_seed") is None and shared.get("orders", 1) == 1 and shared.get("order") in (
        "shuffled", "sorted")
    if (stream and rebuildable and "ids" not in known and isinstance(n, int) and isinstance(shared.get("seed"), int)
            and (limit is None or isinstance(limit, int))):
        from ..rundir.stream import stream_order
        try:
            known["ids"] = frozenset(stream_order(n, str(shared.get("order")), shared["seed"])[:limit])
        except ValueError:   # an order this version does not know: ids are checked against n_samples only
            pass
    names = (ident.get(CONFIG) or {}).get("classnames") if isinstance(ident.get(CONFIG), dict) else None
    if "n_classes" not in known and isinstance(names, list):
        known["n_classes"] = len(names)
    return run_records.RecordSchema.of_run(ident or None, **known)


def _read_summary(run_dir: Path) -> dict:
    path = Path(run_dir) / SUMMARY
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# -- summaries -------------------------------------------------------------------------

def previous_timings(run_dir: Path) -> dict | None:
    """The timings of the summary a run directory already has (None when it has none)."""
    path = Path(run_dir) / SUMMARY
    try:
        timings = json.loads(path.read_text()).get("timings") if path.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None
    return timings if isinstance(timings, dict) and timings.get("images") else None


def combine_timings(old: dict | None, new: dict) -> dict:
    """Timings of a resumed run: the earlier sessions' plus this one's. A resume with nothing left
    to do keeps the timings it had (its own would say 0 seconds per image)."""
    if not old:
        return new
    if not new.get("images"):
        return old
    images = old["images"] + new["images"]
    shared = (old.get("shared_seconds_per_image", 0.0) * old["images"]
              + new.get("shared_seconds_per_image", 0.0) * new["images"]) / images
    return {**new, "wall_seconds": old.get("wall_seconds", 0.0) + new.get("wall_seconds", 0.0), "images": images,
            "shared_seconds_per_image": shared, "sessions": old.get("sessions", 1) + new.get("sessions", 1)}


def summarize(records: list[dict], config: dict, timings: dict[str, float] | None = None,
              identity: dict | None = None) -> dict:
    """summary.json content from records (the source of truth), measured timings and the run's identity."""
    by: dict[tuple[str, str], list[dict]] = defaultdict(list)
    failed: Counter[tuple[str | None, str]] = Counter()   # (method or None: every method's, setting)
    errors = 0
    for r in records:
        if "error" in r:
            errors += 1
            failed[(r.get("method"), r.get("setting", "clean"))] += 1
            continue
        by[(r["method"], r.get("setting", "clean"))].append(r)
    methods: dict[str, dict] = {}
    attacked_settings: list[str] = []   # each budget's setting; an adaptive one without its suffix
    with_own_scores = any(isinstance(r.get("own_ood_score"), (int, float)) for rs in by.values() for r in rs)
    for (name, setting), recs in sorted(by.items()):
        entry = methods.setdefault(name, {})
        # an open-set run: accuracy on its ID part (OOD samples have no class), detection over both parts
        id_part = [r for r in recs if r.get("ood") is not True]
        scored = {**score_records(id_part), "errors": failed[(name, setting)] + failed[(None, setting)]}
        if not id_part:   # only OOD samples: no class to be right about (null in summary.json, not NaN)
            scored["undefined"] = "no in-distribution samples: top-1, top-5, ECE and NLL need labelled samples"
        detection = score_open_set(recs)
        if detection is not None:
            scored["ood"] = detection
            if with_own_scores:   # a method of the run has a score of its own: a column for every method
                from ..methods.catalogue.listing import own_ood_score  # here: the specs are read only for such a run
                scored["ood_own"] = score_own(recs, own_ood_score(name))
        seconds = sum(r.get("seconds", 0.0) for r in recs) / max(len(recs), 1)
        if setting == "clean":
            entry.update(scored)
            entry["method_seconds_per_image"] = seconds
        elif is_adaptive(setting):   # the attack through the method's own prediction (--attack-target adaptive)
            attacked_settings.append(setting.removesuffix(ADAPTIVE_SUFFIX))
            modes = {r["attack"].get("mode") for r in recs if isinstance(r.get("attack"), dict)}
            entry.setdefault("adaptive_by_setting", {})[setting] = {
                "setting": setting, "mode": "/".join(sorted(m for m in modes if m)), **scored,
                "method_seconds_per_image": seconds}
        else:
            attacked_settings.append(setting)
            entry.setdefault("robust_by_setting", {})[setting] = {"setting": setting, **scored,
                                                                   "method_seconds_per_image": seconds}
    # an eps list's settings in the order of its budgets (records sort them as text: eps1, eps16, eps2)
    order = [s for s in run_records.run_settings(config.get("attack"), False) if s in attacked_settings]
    order += sorted(set(attacked_settings) - set(order))
    for entry in methods.values():
        for key, by_key, suffix in (("robust", "robust_by_setting", ""),
                                    ("adaptive", "adaptive_by_setting", ADAPTIVE_SUFFIX)):
            by_setting = entry.pop(by_key, {})
            ranked = [by_setting[s + suffix] for s in order if s + suffix in by_setting]
            if ranked:
                entry[key] = ranked[0]
                if len(order) > 1:
                    entry[by_key] = {r["setting"]: r for r in ranked}
    for name, entry in methods.items():   # how much robust accuracy the transfer attack overstated
        transfer, adaptive = entry.get("robust", {}), entry.get("adaptive", {})
        if (transfer.get("top1") is not None and adaptive.get("top1") is not None
                and adaptive["setting"] == transfer["setting"] + ADAPTIVE_SUFFIX):
            entry["adaptive_gap"] = transfer["top1"] - adaptive["top1"]
            # a sample is robust only if it survives both attacks (AutoAttack's rule), over the samples both scored
            correct = [{r["id"]: r["correct"] for r in by[(name, entry[k]["setting"])] if r.get("ood") is not True}
                       for k in ("robust", "adaptive")]
            both = sorted(set(correct[0]) & set(correct[1]))
            entry["worst_case"] = {"top1": metrics.top1([correct[0][i] and correct[1][i] for i in both]) if both
                                   else None, "n": len(both)}
    timings = timings or {}
    shared = timings.get("shared_seconds_per_image", 0.0)
    # the transductive track: what each method read beyond the current sample and its past, as the run recorded
    # it (run.json's config `reads_ahead`: "batch", "test_set"); absent for a single-image method
    for name, reads_ahead in (config.get("reads_ahead") or {}).items():
        if name in methods:
            methods[name]["reads_ahead"] = reads_ahead
    for entry in methods.values():
        attacked = entry.get("robust", entry.get("adaptive", {}))
        own = entry.get("method_seconds_per_image", attacked.get("method_seconds_per_image", 0.0))
        entry["seconds_per_image"] = own + shared
    summary = {"config": config, "methods": methods, "errors": errors, "timings": timings}
    if identity is not None:
        summary["identity"] = identity
    if order:
        attack = dict(config.get("attack") or {})
        split = split_budgets(attack) if isinstance(attack.get("eps"), list) else [attack]
        transfer = {r.get("setting") for r in records}
        # `flipped` from the transfer attack's records where it ran, else from the adaptive attack's
        per_setting = {s: _attack_entry(records, s if s in transfer else s + ADAPTIVE_SUFFIX,
                                        split[i] if i < len(split) else attack)
                       for i, s in enumerate(order)}
        if any(is_adaptive(r.get("setting", "clean")) for r in records):
            for entry in per_setting.values():
                entry.update(target=config.get("attack_target", "adaptive"), eot=config.get("eot", 1))
        summary["attack"] = per_setting[order[0]]
        if len(order) > 1:
            summary["attacks"] = per_setting
        summary["sanity"] = sanity.check_summary(summary)
    return summary


def _attack_entry(records: list[dict], setting: str, attack: dict) -> dict:
    """One attacked setting's entry: its attack config, the success rate on zero-shot over its samples and,
    where measured, uniform noise's of the same budget."""
    # `flipped` is measured on the zero-shot model and is the same in every method's record of a
    # sample, so count each attacked sample once, whichever methods ran.
    flips = {r["id"]: r["attack"]["flipped"] for r in records if r.get("setting") == setting and "attack" in r}
    entry = {**attack, "success_rate": metrics.top1(list(flips.values())) if flips else None, "n": len(flips)}
    # uniform noise of the same budget, measured on zero-shot beside the attack (AutoAttack's attacks)
    noise = {r["id"]: r["attack"]["noise_flipped"] for r in records
             if r.get("setting") == setting and "noise_flipped" in (r.get("attack") or {})}
    if noise:
        entry["noise_success_rate"] = metrics.top1(list(noise.values()))
    return entry


def _fmt(x: Any) -> str:
    return "—" if x is None or (isinstance(x, float) and x != x) else f"{x:.2f}"


def summary_markdown(summary: dict, published: dict[str, dict] | None = None) -> str:
    published = published or {}
    robust = any("robust" in m for m in summary["methods"].values())
    adaptive = any("adaptive" in m for m in summary["methods"].values())
    head = ["method", "top-1", "top-5", "ECE", "ECE20", "NLL", "n", "s/img"]
    budgets = list(next((m["robust_by_setting"] for m in summary["methods"].values() if "robust_by_setting" in m),
                        {}))
    if robust:
        head += [f"robust top-1 ({s})" for s in budgets] if budgets else ["robust top-1"]
    adaptive_budgets = list(next((m["adaptive_by_setting"] for m in summary["methods"].values()
                                  if "adaptive_by_setting" in m), {}))
    if adaptive:
        head += [f"adaptive robust top-1 ({s})" for s in adaptive_budgets] or ["adaptive robust top-1"]
        head += ["mode"] + (["transfer - adaptive", "worst case top-1"] if robust else [])
    if published:
        head += ["published top-1"]
    published_ece = any(row.get("paper_ece") is not None for row in published.values())
    if published_ece:
        head += ["published ECE (20 bins)"]
    open_set = any("ood" in m for m in summary["methods"].values())
    if open_set:
        head += ["AUROC", "FPR95", "AUPR", "n OOD"]
    own_scores = any("ood_own" in m for m in summary["methods"].values())
    if own_scores:
        head += ["own OOD score", "AUROC (own)", "FPR95 (own)", "AUPR (own)"]
    rows: dict[str, list[str]] = {}
    for name, m in summary["methods"].items():
        row = [name, _fmt(m.get("top1")), _fmt(m.get("top5")), _fmt(m.get("ece")), _fmt(m.get("ece20")),
               _fmt(m.get("nll")),
               str(m.get("n", 0)), f"{m.get('seconds_per_image', 0.0):.3f}"]
        if robust and budgets:
            row += [_fmt((m.get("robust_by_setting") or {}).get(s, {}).get("top1")) for s in budgets]
        elif robust:
            row.append(_fmt(m.get("robust", {}).get("top1")))
        if adaptive and adaptive_budgets:
            row += [_fmt((m.get("adaptive_by_setting") or {}).get(s, {}).get("top1")) for s in adaptive_budgets]
        elif adaptive:
            row.append(_fmt(m.get("adaptive", {}).get("top1")))
        if adaptive:
            row.append(m.get("adaptive", {}).get("mode", ""))
            row += [_fmt(m.get("adaptive_gap")), _fmt((m.get("worst_case") or {}).get("top1"))] if robust else []
        if published:
            said = {"batch": " (batch-transductive)", "test_set": " (transductive)"}.get(m.get("reads_ahead"), "")
            row.append(_published_cell(published.get(name)) + (said if published.get(name) else ""))
        if published_ece:
            row.append(_fmt((published.get(name) or {}).get("paper_ece")))
        if open_set:
            ood = m.get("ood") or {}
            row += [_fmt(ood.get("auroc")), _fmt(ood.get("fpr95")), _fmt(ood.get("aupr")), str(ood.get("n_ood", 0))]
        if own_scores:
            own = m.get("ood_own") or {}
            row += [str(own.get("score", "")), _fmt(own.get("auroc")), _fmt(own.get("fpr95")),
                    _fmt(own.get("aupr"))]
        rows[name] = row
    # the blocks (shiftlab.methods.catalogue.listing.BLOCKS): single-image methods never share a table with those
    # that read other test images (their batch, the whole test set), as in suite.md and the report
    blocks = _blocks({n: m.get("reads_ahead") for n, m in summary["methods"].items()})
    lines = []
    for block, names in blocks:
        if len(blocks) > 1 or block != catalogue.SINGLE_IMAGE:
            lines += [("" if not lines else "\n") + f"**{catalogue.BLOCKS[block]}**", ""]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(rows[n]) + " |" for n in names]
    cfg = summary.get("config", {})
    title = f"{cfg.get('dataset', '?')} · {model_label(cfg.get('model'), cfg.get('pretrained'))}"
    if is_random_weights(cfg.get("pretrained")):
        title += " · RANDOM WEIGHTS: accuracies are meaningless"
    accounted = [int((m.get("n") or 0) + (m.get("errors") or 0) + ((m.get("ood") or {}).get("n_ood") or 0))
                 for m in summary["methods"].values() if "n" in m]
    partial = partial_mark(cfg, accounted)
    if partial:   # a --limit run, or one stopped early: never to be read as the dataset's number
        said = partial.replace("partial:", "PARTIAL:").replace("incomplete:", "INCOMPLETE:")
        title += f" · {said}, not comparable with published numbers"
    notes = [f"errors: {summary.get('errors', 0)}"]
    lost = cfg.get("dataset_lost") or []
    if lost:
        notes.append(f"LOST SAMPLES: {len(lost)} problem(s) in the dataset's files left samples out "
                     f"(--allow-partial), first: {lost[0]}")
    ahead = {n: m["reads_ahead"] for n, m in summary["methods"].items() if m.get("reads_ahead")}
    if ahead:
        notes.append("transductive (not comparable with single-image methods): " + ", ".join(
            f"{n} reads {'its batch' if r == 'batch' else 'the whole test set'}" for n, r in ahead.items()))
    corruption = (summary.get("identity") or {}).get("shared", {}).get("corruption") or {}
    if corruption:
        title += f" · {corruption.get('name')} severity {corruption.get('severity')} ({corruption.get('source')})"
    if open_set:
        mix = (summary.get("identity") or {}).get("shared", {}).get("open_set") or {}
        notes.append(f"open set: top-1 etc. on the ID part; OOD {', '.join(mix.get('ood') or ['?'])} at ratio "
                     f"{mix.get('ratio', '?')} (seed {mix.get('seed', '?')}); AUROC/FPR95/AUPR (%) by the max "
                     "softmax probability (MCM), ID positive")
    if "attack" in summary and not cfg.get("clean_and_robust"):
        # the clean columns read "—" with n 0: say why, so the dash is not read as a failure
        both = OPTIONS["clean_and_robust"]   # a file: both spellings, whoever started the run
        notes.append(f"clean images not scored (the run scores its attacked settings; {both.flag} or "
                     f"{both.keyword} scores both in one pass)")
    for a in (summary.get("attacks") or {"": summary["attack"]} if "attack" in summary else {}).values():
        described = " ".join(t for t in (attack_label(a), attack_details(a)) if t)
        notes.append(f"attack {described}, success rate on zero-shot {_fmt(a.get('success_rate'))}%"
                     + (f" (uniform noise of the same budget: {_fmt(a['noise_success_rate'])}%)"
                        if a.get("noise_success_rate") is not None else ""))
    if robust:   # the default target: a test-time method's "robust top-1" is not an attack on its adaptation
        target = OPTIONS["attack_target"]
        notes.append("robust top-1: transfer, the attack's images made against zero-shot CLIP and every method scored "
                     "on them, its adaptation unseen by the attack (" + (
                         "the adaptive columns attack" if adaptive else
                         f"{target.flag} adaptive or {target.keyword}\"adaptive\" attacks")
                     + " each method's own prediction)")
    if adaptive:
        notes.append(f"adaptive: the attack through each method's own prediction (mode: the method's spec, "
                     f"docs/ROBUSTNESS.md), {summary['attack'].get('eot', 1)} draw(s) of its random views per gradient")
    notes += [f"SANITY CHECK FAILED: {w['message']}" for w in summary.get("sanity") or []]
    return f"### {title}\n\n" + "\n".join(lines) + "\n\n" + "; ".join(notes) + "\n"


def _blocks(reads_ahead: dict[str, str | None]) -> list[tuple[str, list[str]]]:
    """Methods by table block (`catalogue.BLOCKS` order), from what each read beyond its image as the run recorded
    it (run.json's `reads_ahead`), so a summary is rewritten the same without the methods' specs."""
    of = {None: catalogue.SINGLE_IMAGE, "batch": catalogue.BATCH_TRANSDUCTIVE, "test_set": catalogue.TRANSDUCTIVE}
    blocks = [(b, [n for n, r in reads_ahead.items() if of.get(r, catalogue.SINGLE_IMAGE) == b])
              for b in catalogue.BLOCKS]
    return [(b, names) for b, names in blocks if names]


def _published_cell(row: dict | None) -> str:
    if not row:
        return "—"
    vals = [str(v) for k, v in row.items() if k in ("seed_leaderboard", "paper") and v is not None]
    return " / ".join(vals) if vals else "—"


def json_safe(value: Any) -> Any:
    """`value` with every NaN or infinity as None: JSON has neither (Python's bare `NaN` breaks every strict
    parser), and a metric that cannot be computed is null, its reason said beside it ("undefined")."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_summary(run_dir: Path, summary: dict, published: dict[str, dict] | None = None) -> str:
    run_dir = Path(run_dir)
    md = summary_markdown(summary, published)
    try:
        writes.write_file(run_dir / SUMMARY, json.dumps(json_safe(summary), indent=2, sort_keys=False, allow_nan=False),
                          resume_advice())
        writes.write_file(run_dir / SUMMARY_MD, md, resume_advice())
    except OSError as exc:
        raise run_dir_error(run_dir / SUMMARY, exc) from None
    return md

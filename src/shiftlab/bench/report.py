"""`shiftlab bench`'s human-readable report (`format_report`) of `run_bench`'s result."""
from __future__ import annotations


def _fmt(x, spec: str = ".2f", none: str = "-") -> str:
    return none if x is None else format(x, spec)


def format_report(result: dict) -> str:
    cfg = result["config"]
    model = cfg.get("model") or {}
    lines = [
        f"shiftlab bench on {result['device']}: {model.get('name', '?')} "
        f"({model.get('pretrained') or 'random weights'}), {cfg['classes']} classes, {cfg['views']} views, "
        f"{cfg['images']} image(s) + {cfg['warmup']} warm-up, torch {result['machine']['torch']}, "
        f"{result['machine']['torch_threads']} threads",
    ]
    machine = result["machine"]
    if "loadavg_at_start" in machine:
        loads = [f"{label} {' '.join(f'{x:.2f}' for x in machine[key])}"
                 for label, key in (("start", "loadavg_at_start"), ("end", "loadavg_at_end")) if key in machine]
        lines.append(f"{machine['cpu_count']} CPU cores; load average (1, 5, 15 min) at " + ", at ".join(loads))
    if result["methods"]:
        lines += [
            "",
            "seconds per image, each method alone (decode+views + encode + text tower + method); peak memory of "
            "its pass, and (+MiB) that peak over what the process held when the pass began:",
            f"{'method':<16}{'s/img':>8}{'img/s':>8}{'dec+views':>10}{'encode':>8}{'text':>8}{'method':>8}"
            f"{'peak MiB':>9}{'+MiB':>7} | {'baseline':>9}{'speedup':>8}{'top-1':>7}{'max|dlogit|':>12}",
        ]
    for name, r in result["methods"].items():
        s = r["split_seconds_per_image"]
        lines.append(
            f"{name:<16}{r['seconds_per_image']:>8.2f}{_fmt(r['images_per_second']):>8}{s['decode_views']:>10.2f}"
            f"{s['image_encode']:>8.2f}{s['text_tower']:>8.2f}{s['method']:>8.2f}{r['peak_memory_mib']:>9.0f}"
            f"{_fmt(r.get('peak_memory_added_mib'), '.0f'):>7} | "
            f"{_fmt(r['baseline_seconds_per_image']):>9}{_fmt(r['speedup'], '.1f'):>8}"
            f"{_fmt(r['top1_agreement'], '.0%'):>7}{_fmt(r['max_abs_logit_diff'], '.1e'):>12}")
        if r.get("baseline_skipped"):
            lines.append(f"{'':<16}baseline skipped: {r['baseline_skipped']}")
    split = result["all_methods_split_seconds_per_image"]
    lines += [
        "",
        f"all methods in one pass: {result['all_methods_seconds_per_image']:.2f} s/image "
        f"(decode+views {split['decode_views']:.2f}, encode {split['image_encode']:.2f}, "
        f"methods {sum(split['methods'].values()):.2f})" + (
            f"; sum of the methods alone: {result['sum_of_individual_seconds_per_image']:.2f} s/image; "
            f"ratio {_fmt(result['all_to_sum_ratio'])}" if result["methods"] else ""),
        f"peak memory: all methods {result['all_methods_peak_memory_mib']:.0f} MiB; process high-water mark "
        f"(incl. baselines) {result['process_peak_rss_mib']:.0f} MiB",
    ]
    rounds = result.get("rounds")
    if rounds:
        lines += ["", f"medians over {rounds['rounds']} interleaved rounds (min-max), decode+views excluded:",
                  f"{'':<16}{'s/img':>9}{'spread':>17}{'x floor':>9}{'speedup':>9}"]

        def row(label: str, spi: dict, ratio: dict | None, speedup: dict | None = None) -> str:
            span = f"{spi['min']:.3f}-{spi['max']:.3f}"
            return (f"{label:<16}{spi['median']:>9.3f}{span:>17}"
                    f"{_fmt(ratio and ratio['median'], '.2f'):>9}{_fmt(speedup and speedup['median'], '.1f'):>9}")
        lines.append(row("floor", rounds["floor_seconds_per_image"], None))
        for name, r in rounds["methods"].items():
            lines.append(row(name, r["seconds_per_image"], r["ratio_to_floor"], r.get("speedup")))
        lines.append(row("all methods", rounds["all_methods_seconds_per_image"], rounds["all_methods_ratio_to_floor"]))
        lines.append(row("  its encoding", rounds["all_methods_encode_seconds_per_image"], None))
        store = rounds.get("store")
        if store:
            lines.append(row("from the store", store["seconds_per_image"], store["ratio_to_floor"]))
            lines.append(row("  its reading", store["read_seconds_per_image"], None))
            budget = store["budget_seconds_per_image"]["median"]
            lines.append(f"re-run from a feature store: {store['over_budget']['median']:.2f}x its budget of "
                         f"{budget:.3f} s/image (the methods' own share + 0.05 x floor); reading "
                         f"{store['read_speedup']['median']:.0f}x faster than encoding; one more sweep point, "
                         "x floor: " + ", ".join(f"{m} {r['median']:.3f}"
                                                  for m, r in store["method_ratio_to_floor"].items()))
        lines.append("(all methods x floor: each round's all-methods pass over its own encoding, so >= 1; "
                     "a method alone x floor: over the floor row)" if rounds.get("all_methods_encodes", True) else
                     "(all methods x floor: over the floor row, as no method of the pass reads the frozen tower's "
                     "features; a method alone x floor: over the floor row)")
        for bad in rounds.get("unreliable_rounds") or []:
            lines.append(f"round {bad['round']} UNRELIABLE (the machine's load changed under it; its figures are in "
                         "the medians: re-run on a quieter machine or with more --repeats): "
                         + "; ".join(bad["reasons"]))
        lines += projection_lines(result["projection"], rounds)
    ld = result["loader"]
    lines.append(
        f"loader ({ld['workers']} workers): {ld['seconds_per_image']:.3f} s/image "
        f"(startup {ld['startup_seconds']:.1f} s; "
        f"{ld['in_process_seconds_per_image']:.3f} s/image in-process) vs model {ld['model_seconds_per_image']:.2f} "
        f"s/image -> the {ld['bottleneck']} is the bottleneck")
    return "\n".join(lines)


def projection_lines(pr: dict, rounds: dict) -> list[str]:
    """The projection, saying what was measured and what was extrapolated."""
    lines = [f"measured: {rounds['images']} image(s) x {rounds['rounds']} round(s) at {pr['measured_views']} views"
             f"{'' if rounds['methods'] else ', the floor and all methods together only'}",
             f"projected ImageNet-R ({pr['images']} images, {pr['views']} views each) on this device: "
             f"floor {pr['floor_seconds'] / 3600:.2f} h, all methods {pr['all_methods_seconds'] / 3600:.2f} h "
             f"(loader alone {pr['loader_seconds'] / 3600:.2f} h)"]
    if pr.get("later_runs_seconds") is not None:
        lines.append(f"  every later run of all methods, from a feature store: {pr['later_runs_seconds'] / 3600:.2f} h")
    if pr.get("extrapolated"):
        lines.append(f"  extrapolated, not measured: {pr['extrapolated']}")
    return lines

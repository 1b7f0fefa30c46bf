"""`--orders K`: one run's accuracy over K seeded orders of the same samples, as mean, std, worst and
Expected Tail Accuracy.

A K-order run directory holds order 0 as the run itself (every method) and orders 1..K-1 as run directories
of their own under `orders/<k>/` (the online methods only: an episodic method's records do not depend on the
order, so order 0's are every order's). `orders.json` (and `orders.md`) gather them:

    {"orders": K, "order_seeds": [...], "methods": {name: {"kind": "online" | "episodic",
     "top1": [K accuracies, %], "mean", "std", "worst", "eta", "tail": n}}, "missing": [orders not yet run]}

ETA: the mean accuracy of the worst 10 % of the orders (OGA's definition, cfuchs2023/OGA README.md line 34:
"the average accuracy in the worst 10% of runs"; OGA's code does not compute it), over ceil(0.1 K) orders, at
least one. `std` is the population standard deviation (numpy's default, ddof 0).
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import writes

ORDERS_DIR = "orders"
ORDERS_FILE, ORDERS_MD = "orders.json", "orders.md"
TAIL_FRACTION = 0.1


def order_dir(run_dir: Path | str, k: int) -> Path:
    """Where order k (>= 1) of a K-order run lives; order 0 is `run_dir` itself."""
    return Path(run_dir) / ORDERS_DIR / f"{k:03d}"


def order_stats(accuracies: Sequence[float], tail_fraction: float = TAIL_FRACTION) -> dict[str, Any]:
    """mean, std (ddof 0), worst and eta (mean of the worst ceil(tail_fraction x K), at least one) of K values."""
    values = [float(a) for a in accuracies]
    if not values:
        raise ValueError("order_stats needs at least one accuracy")
    k = len(values)
    mean = sum(values) / k
    tail = max(1, math.ceil(tail_fraction * k))
    return {"mean": mean, "std": math.sqrt(sum((v - mean) ** 2 for v in values) / k), "worst": min(values),
            "eta": sum(sorted(values)[:tail]) / tail, "tail": tail}


def _top1(run_dir: Path) -> dict[str, float]:
    path = run_dir / "summary.json"
    if not path.is_file():
        return {}
    methods = json.loads(path.read_text()).get("methods", {})
    return {name: row["top1"] for name, row in methods.items() if isinstance(row, dict) and "top1" in row}


def summarize_orders(run_dir: Path | str, orders: int, order_seeds: Sequence[int], online: Sequence[str],
                     episodic: Sequence[str]) -> dict[str, Any]:
    """orders.json's content from the summaries on disk (an order whose run is not finished is `missing`)."""
    run_dir = Path(run_dir)
    per_order = [_top1(run_dir)] + [_top1(order_dir(run_dir, k)) for k in range(1, orders)]
    missing = [k for k, top1 in enumerate(per_order) if not top1 or any(n not in top1 for n in online)]
    methods: dict[str, Any] = {}
    for name in list(episodic) + list(online):
        if name in online:
            values = [top1[name] for top1 in per_order if name in top1]
        else:   # the same records in every order: order 0's accuracy, K times
            values = [per_order[0][name]] * orders if name in per_order[0] else []
        if values:
            methods[name] = {"kind": "online" if name in online else "episodic", "top1": values,
                             **order_stats(values)}
    return {"orders": orders, "order_seeds": list(order_seeds), "methods": methods, "missing": missing}


def orders_markdown(table: dict[str, Any]) -> str:
    lines = [f"## Accuracy over {table['orders']} stream orders (top-1 %; ETA: mean of the worst 10 %)", "",
             "| method | kind | orders | mean | std | worst | ETA |", "|---|---|---:|---:|---:|---:|---:|"]
    for name, row in table["methods"].items():
        lines.append(f"| {name} | {row['kind']} | {len(row['top1'])} | {row['mean']:.2f} | {row['std']:.2f} | "
                     f"{row['worst']:.2f} | {row['eta']:.2f} |")
    if table["missing"]:
        lines += ["", f"Orders not finished yet: {', '.join(map(str, table['missing']))} (resume to complete them)."]
    return "\n".join(lines) + "\n"


def write_orders(run_dir: Path | str, table: dict[str, Any]) -> None:
    run_dir = Path(run_dir)
    for name, text in ((ORDERS_FILE, json.dumps(table, indent=2) + "\n"), (ORDERS_MD, orders_markdown(table))):
        writes.write_file(run_dir / name, text, writes.resume_advice())


def read_orders(run_dir: Path | str) -> dict[str, Any] | None:
    path = Path(run_dir) / ORDERS_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def refresh_orders(run_dir: Path | str) -> dict[str, Any] | None:
    """orders.json recomputed from the orders' summaries as they are now (`shiftlab merge` after merging each
    order); None for a run directory without one."""
    table = read_orders(run_dir)
    if not table:
        return None
    kinds = {name: row.get("kind") for name, row in table.get("methods", {}).items()}
    online = [n for n, k in kinds.items() if k == "online"]
    episodic = [n for n, k in kinds.items() if k != "online"]
    fresh = summarize_orders(run_dir, int(table["orders"]), table.get("order_seeds", []), online, episodic)
    write_orders(run_dir, fresh)
    return fresh

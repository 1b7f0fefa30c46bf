#!/usr/bin/env bash
# One-command GPU figure (issue 15.4): all leaderboard methods on CUDA at the default precision
# (fp16 autocast), a few hundred synthetic ImageNet-R-sized images, RN50 with random weights
# conditioned as `shiftlab bench` does (no download), the floor (views encoded alone), each
# method alone and all together, and the projected wall time of the full ImageNet-R (30,000
# images). Writes the JSON to $OUT/gpu_check.json (or ./gpu_check.json) and prints the summary.
#
#   benchmarks/gpu_check.sh                              # on the GPU machine: a few minutes incl. set-up
#   DEVICE=cpu benchmarks/gpu_check.sh --tiny --images 1 --warmup 0 --views 16 --classes 10 --workers 0  # CPU dry run
#
# Extra arguments are passed to `shiftlab bench` after the defaults (the last one wins); DEVICE sets the device.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
out_dir=${OUT:-.}
mkdir -p "$out_dir"
json="$out_dir/gpu_check.json"
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" timeout "${GPU_CHECK_TIMEOUT:-540}" "$PY" -m shiftlab.cli bench \
    --device "${DEVICE:-cuda}" --precision auto --methods all --images 200 --warmup 4 \
    --no-baseline --json "$@" > "$json"
# one loader worker on ImageNet-R-sized (500x400) JPEGs: how many workers the measured model speed needs
model_ips=$("$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); print(1/((r.get('rounds') or {}).get('all_methods_seconds_per_image', {}).get('median') or r['all_methods_seconds_per_image']))" "$json")
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$PY" benchmarks/view_throughput.py --images 8 --reps 2 \
    --model-ips "$model_ips" | tee "$out_dir/gpu_check_views.txt"
# the image tower's execution choices on this device (issue 15.1): the engine's chunk of 256 views vs one
# call and 128, and torch.compile, interleaved, fp16 autocast, with top-1 agreement against the first
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" timeout "${AB_TIMEOUT:-240}" "$PY" benchmarks/image_tower_ab.py \
    --device "${DEVICE:-cuda}" --precision "${AB_PRECISION:-fp16}" --views "${AB_VIEWS:-512}" \
    --variants "${AB_VARIANTS:-cl-c256,cl,cl-c128,compile}" --reps "${AB_REPS:-5}" --json \
    > "$out_dir/image_tower_ab.json" || echo "image tower A/B did not finish (see $out_dir/image_tower_ab.json)"
"$PY" - "$json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"device {r['device']}, {r['config']['images']} images, {r['config']['views']} views")
if r.get("floor_seconds_per_image"):
    print(f"floor (the views encoded alone): {r['floor_seconds_per_image']:.4f} s/image (median)")
for name, m in r["methods"].items():
    spi = m.get("rounds_seconds_per_image") or m["seconds_per_image"]
    print(f"  {name:<16} {spi:.4f} s/image  x{m.get('ratio_to_floor') or float('nan'):.2f} floor")
allm = (r.get("rounds") or {}).get("all_methods_seconds_per_image", {}).get("median", r["all_methods_seconds_per_image"])
print(f"all methods in one pass: {allm:.4f} s/image "
      f"x{r.get('all_methods_ratio_to_floor') or float('nan'):.2f} floor")
p = r.get("projection")
if p:
    print(f"projected ImageNet-R ({p['images']} images): all methods {p['all_methods_seconds'] / 60:.1f} min, "
          f"floor {p['floor_seconds'] / 60:.1f} min")
ld = r["loader"]
print(f"loader: {ld['seconds_per_image']:.4f} s/image with {ld['workers']} workers -> {ld['bottleneck']} bound")
print(f"JSON: {sys.argv[1]}")
PYEOF

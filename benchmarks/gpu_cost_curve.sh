#!/usr/bin/env bash
# The cost curve on one GPU, float32 and float64, with achieved FLOP/s against the card's peak.
#
#   bash benchmarks/gpu_cost_curve.sh            # on a machine with an NVIDIA GPU and jax[cuda] installed
#
# Writes benchmarks/results/cost_curve_gpu.json (+ .png) and prints, per dtype, the best
# achieved FLOP/s of the gradient and the HVP (XLA's FLOP count / measured time) as a
# fraction of the peak below. Peaks are NVIDIA's H200 SXM datasheet figures (dense):
# FP64 34 TFLOP/s (67 with tensor cores), FP32 67 TFLOP/s; override with PEAK_FP64 / PEAK_FP32.
# The same Python code runs on CPU unchanged; this script only selects the GPU platform.
set -euo pipefail
cd "$(dirname "$0")/.."
export JAX_PLATFORMS=cuda
export XLA_PYTHON_CLIENT_PREALLOCATE=false   # so the memory figures are the kernels', not the pool's
PEAK_FP64=${PEAK_FP64:-34e12}
PEAK_FP32=${PEAK_FP32:-67e12}
OUT=benchmarks/results/cost_curve_gpu.json
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c "import jax; print(jax.devices()); assert jax.default_backend() == 'gpu', 'no GPU visible to JAX'"
python benchmarks/cost_curve.py --part ops --dtype float64 --out "$OUT"
python benchmarks/cost_curve.py --part ops --dtype float32 --out "$OUT"
python benchmarks/cost_curve.py --part solve --out "$OUT"
python - "$OUT" "$PEAK_FP64" "$PEAK_FP32" <<'PY'
import json, sys
out, peak64, peak32 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
res = json.load(open(out))
print(f"machine: {res['machine']}")
for key, peak in (("ops", peak64), ("ops_float32", peak32)):
    rows = res.get(key, {}).get("rows", [])
    for op in ("grad", "hvp"):
        best = max(rows, key=lambda r: r[f"{op}_flop_rate"])
        print(f"{res.get(key, {}).get('dtype', key)} {op}: best {best[f'{op}_flop_rate'] / 1e12:.2f} TFLOP/s "
              f"({100 * best[f'{op}_flop_rate'] / peak:.1f}% of {peak / 1e12:.0f}) at d = {best['d']}, n = {best['n']}")
PY

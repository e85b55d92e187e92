#!/usr/bin/env bash
# The GPU checks, for a machine with an NVIDIA GPU and the CUDA toolkit (CI has no GPU; it builds the
# CUDA parts and runs the error paths only). Builds with the CUDA backend, then:
#   1. every [cuda]-tagged Catch2 test case, per test executable (CTest's <test>-cuda tests; a run
#      that exits 77, skipped for want of a device, counts as a failure here);
#   2. a short profiled GPU run (wb-train --device cuda --steps 20 --profile) and `wb report` on it,
#      which must show kernel time per op; the kernel rows' link to host ranges is checked in SQL;
#   3. step one against PyTorch on the GPU: wb-train --dump-step 0, torch_step.py --device cuda,
#      wb compare --profile migration-fp32;
#   4. the GPU benchmark (bench/gpu_vs_torch: ours vs PyTorch per precision, profiling overhead);
# and prints a PASS/FAIL table; the exit code is non-zero when anything failed.
#
# Needs no network and installs nothing: it uses what CMake finds. cuDNN and NCCL may come from the
# toolkit, from $CUDNN_ROOT / $NCCL_ROOT (folders holding include/ and lib/), or from the Python wheels
# nvidia-cudnn-* / nvidia-nccl-* of the PyTorch interpreter. Settings (environment):
#   WB_TORCH_PYTHON   Python with torch, torchvision and numpy (default: python3 on PATH)
#   WB_GPU_BUILD      build folder (default build-gpu)     WB_GPU_JOBS  parallel jobs (default: cores)
#   CUDNN_ROOT NCCL_ROOT CMAKE_PREFIX_PATH CUDAToolkit_ROOT CMAKE_CUDA_ARCHITECTURES (default 90)
#   WB_GPU_SKIP_BENCH=1  leave out the benchmark (it takes a few minutes)
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${WB_GPU_BUILD:-$root/build-gpu}
[[ $build = /* ]] || build=$root/$build
jobs=${WB_GPU_JOBS:-$(nproc)}
py=${WB_TORCH_PYTHON:-$(command -v python3 || echo /usr/bin/python3)}
logs=$build/gpu-logs
work=$(mktemp -d /tmp/wb-gpu-run-XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$logs"

names=()
verdicts=()
notes=()
record() {  # record NAME PASS|FAIL NOTE
  names+=("$1")
  verdicts+=("$2")
  notes+=("$3")
  printf '%-44s %s  %s\n' "$1" "$2" "$3"
}
summary() {
  local failed=0
  echo
  echo "== GPU checks: summary =="
  printf '%-44s %-6s %s\n' "check" "result" "note"
  for i in "${!names[@]}"; do
    printf '%-44s %-6s %s\n' "${names[$i]}" "${verdicts[$i]}" "${notes[$i]}"
    [[ ${verdicts[$i]} == PASS ]] || failed=$((failed + 1))
  done
  echo "logs: $logs"
  if ((failed > 0)); then
    echo "$failed check(s) failed"
    exit 1
  fi
  echo "all ${#names[@]} checks passed"
  exit 0
}

echo "== GPU checks in $root (build: $build, python: $py) =="
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >"$logs/nvidia-smi.log" 2>&1; then
  record "gpu present" FAIL "nvidia-smi finds no GPU: run this on a GPU machine"
  summary
fi
record "gpu present" PASS "$(head -1 "$logs/nvidia-smi.log")"

# ---- where cuDNN and NCCL are -------------------------------------------------------------------
# A wheel folder (site-packages/nvidia/<lib>) holds include/ and lib/ with versioned names only
# (libcudnn.so.9), which find_library does not match: pass the files themselves to CMake.
wheel_dir() {  # wheel_dir cudnn|nccl -> the folder of the nvidia.<name> package, if the Python has it
  "$py" - "$1" 2>/dev/null <<'EOF'
import importlib, os, sys
try:
    m = importlib.import_module("nvidia." + sys.argv[1])
except Exception:
    sys.exit(1)
paths = list(getattr(m, "__path__", [])) or [os.path.dirname(m.__file__)]
print(paths[0])
EOF
}
first_file() { for f in "$@"; do [[ -e $f ]] && { echo "$f"; return 0; }; done; return 1; }

cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DWB_CUDA=ON -DWB_APP=OFF -DWB_PYTHON="$py"
            -DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-90}")
ld_dirs=()
cudnn_root=${CUDNN_ROOT:-$(wheel_dir cudnn)}
if [[ -n $cudnn_root ]]; then
  lib=$(first_file "$cudnn_root"/lib/libcudnn.so "$cudnn_root"/lib/libcudnn.so.* "$cudnn_root"/lib64/libcudnn.so "$cudnn_root"/lib64/libcudnn.so.*)
  if [[ -n $lib && -f $cudnn_root/include/cudnn.h ]]; then
    cmake_args+=(-DWB_CUDNN_LIBRARY="$lib" -DWB_CUDNN_INCLUDE_DIR="$cudnn_root/include")
    ld_dirs+=("$(dirname "$lib")")
    echo "cuDNN: $lib"
  fi
fi
nccl_root=${NCCL_ROOT:-$(wheel_dir nccl)}
if [[ -n $nccl_root ]]; then
  lib=$(first_file "$nccl_root"/lib/libnccl.so "$nccl_root"/lib/libnccl.so.* "$nccl_root"/lib64/libnccl.so "$nccl_root"/lib64/libnccl.so.*)
  if [[ -n $lib && -f $nccl_root/include/nccl.h ]]; then
    cmake_args+=(-DWB_NCCL_LIBRARY="$lib" -DWB_NCCL_INCLUDE_DIR="$nccl_root/include")
    ld_dirs+=("$(dirname "$lib")")
    echo "NCCL: $lib"
  fi
fi
# NCCL's unique id travels over MPI: without an MPI CMake can find, the build is single-process.
if ! command -v mpicc >/dev/null && ! command -v mpiexec >/dev/null; then
  cmake_args+=(-DWB_MPI=OFF)
  echo "MPI: none found, building with -DWB_MPI=OFF (single-GPU runs only)"
fi
[[ -n ${CUDAToolkit_ROOT:-} ]] && cmake_args+=(-DCUDAToolkit_ROOT="$CUDAToolkit_ROOT")
for d in "${ld_dirs[@]}"; do export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; done

# ---- build ----------------------------------------------------------------------------------------
if cmake -S "$root" -B "$build" "${cmake_args[@]}" >"$logs/configure.log" 2>&1; then
  record "configure (WB_CUDA=ON)" PASS ""
else
  record "configure (WB_CUDA=ON)" FAIL "see $logs/configure.log (missing packages are named there)"
  summary
fi
if ! grep -q "WB_BACKEND_CUDA=1" "$build/build.ninja" 2>/dev/null; then
  record "CUDA backend configured" FAIL "cuDNN not found: set CUDNN_ROOT (see $logs/configure.log)"
  summary
fi
record "CUDA backend configured" PASS ""
if cmake --build "$build" -j "$jobs" >"$logs/build.log" 2>&1; then
  record "build" PASS ""
else
  record "build" FAIL "see $logs/build.log"
  summary
fi
bin=$build/bin

# ---- 1. [cuda] tests ------------------------------------------------------------------------------
for t in "$build"/tests/test_*; do
  [[ -x $t && -f $t ]] || continue
  name=$(basename "$t")
  count=$("$t" --list-test-names-only "[cuda]" 2>/dev/null | grep -c . || true)
  ((count > 0)) || continue
  log=$logs/$name.log
  (cd "$build" && "$t" "[cuda]" --durations yes) >"$log" 2>&1
  rc=$?
  if ((rc == 77)); then
    record "[cuda] $name" FAIL "skipped (exit 77): the test sees no CUDA device, see $log"
  elif ((rc != 0)); then
    record "[cuda] $name" FAIL "exit $rc, see $log"
  elif grep -q "no CUDA device" "$log"; then
    record "[cuda] $name" FAIL "skipped: the test sees no CUDA device (see $log)"
  else
    record "[cuda] $name" PASS "$count test case(s)"
  fi
done

# ---- 2. a profiled GPU run and its report ---------------------------------------------------------
run=$work/gpu.sqlite
if "$bin/wb-train" --device cuda --steps 20 --profile --batch-size 64 --image-size 128 --data-workers 4 \
     --run "$run" >"$logs/wb-train-gpu.log" 2>&1; then
  record "wb-train --device cuda --steps 20 --profile" PASS "$(grep -m1 'rank(s)' "$logs/wb-train-gpu.log")"
  cp "$run" "$logs/gpu-run.sqlite"
  "$bin/wb" report "$run" >"$logs/report.log" 2>&1
  rc=$?
  if ((rc == 0)) && grep -Eqi 'kernel time|gpu time|kernels? by op|device time' "$logs/report.log"; then
    record "wb report: kernel time per op" PASS ""
  else
    record "wb report: kernel time per op" FAIL "exit $rc; no per-op kernel time table in $logs/report.log"
  fi
  # The data behind such a table: kernels joined to the host ranges that launched them.
  "$py" - "$run" >"$logs/kernels-per-op.log" 2>&1 <<'EOF'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
total, linked = db.execute(
    "SELECT COUNT(*), SUM(EXISTS (SELECT 1 FROM range r WHERE r.corr_id = k.corr_id AND k.corr_id != 0)) "
    "FROM kernel k WHERE k.kind = 0").fetchone()
print(f"kernels {total}, linked to a host range {linked}")
rows = db.execute(
    "SELECT s.text, COUNT(*), SUM(k.end_ns - k.start_ns) FROM kernel k JOIN range r ON r.corr_id = k.corr_id "
    "JOIN string s ON s.id = r.name_id WHERE k.kind = 0 AND k.corr_id != 0 GROUP BY s.text "
    "ORDER BY 3 DESC LIMIT 15").fetchall()
for name, n, ns in rows:
    print(f"  {name:32s} {n:7d} kernels {ns / 1e6:10.3f} ms")
sys.exit(0 if total and linked and linked >= 0.9 * total and rows else 1)
EOF
  if (($? == 0)); then
    record "kernel rows linked to op ranges (SQL)" PASS "$(head -1 "$logs/kernels-per-op.log")"
  else
    record "kernel rows linked to op ranges (SQL)" FAIL "see $logs/kernels-per-op.log"
  fi
else
  record "wb-train --device cuda --steps 20 --profile" FAIL "see $logs/wb-train-gpu.log"
fi

# ---- 3. step one against PyTorch on the GPU -------------------------------------------------------
step_run=$work/step1.sqlite
ref=$work/ref.safetensors
if "$bin/wb-train" --device cuda --precision fp32 --data synthetic --synthetic-samples 64 --steps 1 --dump-step 0 \
     --batch-size 32 --image-size 64 --seed 7 --run "$step_run" >"$logs/step1-train.log" 2>&1 &&
   "$py" "$root/compare/reference/torch_step.py" "$step_run" --out "$ref" --device cuda >"$logs/step1-torch.log" 2>&1; then
  "$bin/wb" compare "$step_run" "$ref" --profile migration-fp32 --no-save --no-color >"$logs/step1-compare.log" 2>&1
  rc=$?
  if ((rc == 0)); then
    record "step one vs PyTorch (cuda, migration-fp32)" PASS ""
  else
    record "step one vs PyTorch (cuda, migration-fp32)" FAIL "wb compare exit $rc, see $logs/step1-compare.log"
  fi
else
  record "step one vs PyTorch (cuda, migration-fp32)" FAIL "see $logs/step1-train.log and $logs/step1-torch.log"
fi

# ---- 4. benchmark ---------------------------------------------------------------------------------
if [[ ${WB_GPU_SKIP_BENCH:-0} == 1 ]]; then
  record "bench gpu_vs_torch" PASS "skipped (WB_GPU_SKIP_BENCH=1)"
elif [[ ! -x $bin/gpu_vs_torch ]]; then
  record "bench gpu_vs_torch" FAIL "not built"
elif WB_TORCH_PYTHON="$py" "$bin/gpu_vs_torch" >"$logs/gpu_vs_torch.log" 2>&1 && grep -q '^ratio ours/pytorch' "$logs/gpu_vs_torch.log"; then
  record "bench gpu_vs_torch" PASS "$(tail -1 "$logs/gpu_vs_torch.log")"
  grep -E 'img/s, ratio|profiling overhead' "$logs/gpu_vs_torch.log"
else
  record "bench gpu_vs_torch" FAIL "see $logs/gpu_vs_torch.log"
fi

summary

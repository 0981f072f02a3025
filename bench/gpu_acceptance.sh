#!/usr/bin/env bash
# The GPU acceptance run of detaudit's dynamic pass, in one command (under 5 minutes on one GPU):
#
#   bash bench/gpu_acceptance.sh [--dry-run] [WHEEL_DIR]
#
#  0. the tracer's compiled op recorder, built for this torch (and whether it loads);
#  1. the CUDA tests (pytest -m cuda);
#  2. detaudit calibrate --device cuda, and what it measured differently from the shipped ops table;
#  3. bench/trace_overhead.py (CPU and CUDA rows: plain vs traced step times and their ratio);
#  4. detaudit run on GPU fixtures with known causes: index_add_ message passing, bilinear
#     upsample backward, EmbeddingBag(max) backward (each expected nondeterministic), a small
#     ResNet step with cuDNN's defaults (either verdict: it depends on the algorithms cuDNN
#     picks on that GPU; printed), and the same step under detaudit.deterministic() (expected
#     deterministic), and a torch.compile'd embedding step (Triton kernels; either verdict,
#     printed with the graph and the node the bisection names).  Verdicts, root causes and
#     deviations are printed.
#
# Steps 1-2 and step 4 run side by side (two lanes; none of them times anything), step 3 runs
# alone afterwards so that its timings see an idle GPU.  Each lane's output is printed whole
# when it ends.  A step that fails or runs out of time is reported and the next one runs; the
# exit code is 1 if any step failed.  Without a CUDA GPU it says so and exits 0 at once.
# With $OUT set, the log and the calibrated table are also written there.
#
# --dry-run checks this script on a machine without a GPU: the same steps, on CPU, made
# small (CUDA tests collected, not run; one calibration entry; one overhead round; the
# audits on CPU fixtures with known verdicts), the GPU fixtures compiled, and the
# installation left alone.
#
# The GPU machine may have no network: detaudit is installed from this checkout with
# `pip install --no-index --no-deps`, and the packages it needs that are missing there
# (libcst, usually; rich, pytest and numpy come with most images) from the wheels in
# WHEEL_DIR ($DETAUDIT_WHEELS, default .whl/ in the checkout, git-ignored) through
# `pip install --no-index --find-links WHEEL_DIR`.  Fill it beforehand on a machine with
# network, for the GPU machine's Python, e.g.:
#   pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl libcst
set -u
DRY=0
if [ "${1:-}" = "--dry-run" ]; then
    DRY=1
    shift
fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
WHEELS="${1:-${DETAUDIT_WHEELS:-$ROOT/.whl}}"
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d -t detaudit-gpu-XXXXXX)"
export PYTHON WORK  # the functions that step runs in a child bash read them
STARTED=$SECONDS
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    exec > >(tee "$OUT/gpu_acceptance.log") 2>&1
fi
trap 'rm -rf "$WORK"' EXIT
export PYTHONUNBUFFERED=1

# step NAME LIMIT COMMAND...: run it under a time limit (a function of this script in a
# subshell under the same limit), show its output, and append how it ended to the lane's
# summary ($SUMMARY).
step() {
    local name="$1" limit="$2"
    shift 2
    echo
    echo "=== $name"
    local begun=$SECONDS code
    if declare -F "$1" >/dev/null; then
        export -f "$1" audit_report 2>/dev/null
        timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@"
    else
        timeout --kill-after=10 "$limit" "$@"
    fi
    code=$?
    local took=$((SECONDS - begun)) status
    if [ "$code" -eq 0 ]; then
        status="ok     "
    elif [ "$code" -eq 124 ] || [ "$code" -eq 137 ]; then
        status="TIMEOUT"
    else
        status="FAILED "
    fi
    echo "$status $name ($took s$([ "$code" -ne 0 ] && echo ", exit $code"))" >>"$SUMMARY"
    return 0
}

# audit FIXTURE EXPECTED [detaudit run options...]: detaudit run FIXTURE, print the verdict,
# causes and differing final tensors; fails when the verdict is not EXPECTED ("any": any
# verdict but an error).
audit() {
    local fixture="$1" expected="$2"
    shift 2
    "$PYTHON" -m detaudit run "fixtures/dynamic/$fixture" --format json "$@" >"$WORK/$fixture.json"
    local code=$?
    [ "$code" -le 1 ] && audit_report "$WORK/$fixture.json" "$expected"
}
audit_report() {
    "$PYTHON" - "$1" "$2" <<'EOF'
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit("no JSON report (the run failed; its error is above)")
expected = sys.argv[2]
print(f"verdict: {report['verdict']} (expected {expected}); steps run: {report.get('steps_run')}")
if report["verdict"] == "error":
    print(report["error"]["message"]); print(report["error"]["output_tail"]); sys.exit(1)
for cause in report.get("root_causes", []):
    diff = cause.get("max_abs_diff")
    print(f"  {cause['kind']}: {cause['op']} at {cause['path']}:{cause['line']} ({cause['phase']}"
          f"{', ' + cause['module'] if cause['module'] else ''}) seen {cause['seen']}/{cause['pairs']} pairs"
          f", max |diff| {'-' if diff is None else f'{diff:.3g}'}")
    inside = cause.get("inside_graph")
    if inside:
        print(f"    inside the graph: {inside.get('op', inside.get('error'))} at {inside.get('path')}:{inside.get('line')}"
              f" ({inside.get('module')}), {inside.get('compiles')} compiles")
if report.get("compiled"):
    print(f"  compiled: {report['compiled']['graphs']} graphs, {report['compiled']['calls']} calls traced")
for tensor in report.get("tensors", [])[:6]:
    print(f"  final {tensor['name']} {tensor['dtype']}{tensor['shape']}: max |diff| {tensor['max_abs_diff']:.3g}")
sys.exit(0 if expected in ("any", report["verdict"]) else 1)
EOF
}

echo "detaudit GPU acceptance$([ $DRY -eq 1 ] && echo ' (dry run on CPU)'), $(date -u +%Y-%m-%dT%H:%M:%SZ), $(git rev-parse --short HEAD 2>/dev/null || echo 'no git')"
"$PYTHON" - "$DRY" <<'EOF'
import sys
try:
    import torch
except ImportError:
    sys.exit(2)
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, python {sys.version.split()[0]}")
if torch.cuda.is_available():
    print("GPU:", torch.cuda.get_device_name(0))
elif sys.argv[1] != "1":
    sys.exit(3)
EOF
case $? in
0) ;;
3)
    echo "no CUDA GPU here (torch.cuda.is_available() is False): the GPU acceptance checks need one; nothing was run."
    echo "bash bench/gpu_acceptance.sh --dry-run checks this script on CPU; the CPU code paths are covered by the test suite."
    exit 0
    ;;
*)
    echo "torch is not importable with $PYTHON (set PYTHON=, or activate the environment that has torch)"
    exit 2
    ;;
esac

# -- install ----------------------------------------------------------------------------
if [ $DRY -eq 0 ]; then
    missing="$("$PYTHON" -c 'import importlib.util as u; print(" ".join(m for m in ("libcst", "rich", "pytest", "numpy") if u.find_spec(m) is None))')"
    if [ -n "$missing" ]; then
        echo "installing $missing from $WHEELS"
        "$PYTHON" -m pip install -q --no-index --find-links "$WHEELS" $missing || echo "pip could not install $missing from $WHEELS"
    fi
    if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>"$WORK/pip.err"; then
        echo "pip install -e . failed ($(tail -n 1 "$WORK/pip.err")); running detaudit from the checkout instead"
    fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PYTHON" -c "import detaudit.cli, libcst, rich"; then
    echo "detaudit cannot be imported (above): stopping"
    exit 2
fi

if [ $DRY -eq 1 ]; then
    DEVICE=cpu
    PYTEST_MODE=(--collect-only -q)
    CALIBRATE_ONLY=(--only index_add --repeats 2)
    OVERHEAD=(--rounds 1 --steps 1 --models mlp)
else
    DEVICE=cuda
    PYTEST_MODE=(-q)
    CALIBRATE_ONLY=(--repeats 3)
    OVERHEAD=(--rounds 3 --steps 3)
fi

# -- lane 1: the CUDA tests and the calibration -------------------------------------------
lane_tests_and_calibration() {
    mapfile -t CUDA_TESTS < <(grep -l "mark.cuda" tests/*.py)
    step "pytest -m cuda (${#CUDA_TESTS[@]} files)" 120 \
        "$PYTHON" -m pytest "${PYTEST_MODE[@]}" -m cuda -p no:cacheprovider "${CUDA_TESTS[@]}"
    step "detaudit calibrate --device $DEVICE" 100 \
        "$PYTHON" -m detaudit calibrate --device "$DEVICE" "${CALIBRATE_ONLY[@]}" --output "$WORK/ops-$DEVICE.json"
    if [ -f "$WORK/ops-$DEVICE.json" ]; then
        step "calibrated $DEVICE table vs the shipped one" 30 \
            "$PYTHON" bench/ops_table_diff.py "$WORK/ops-$DEVICE.json" --device "$DEVICE"
        if [ -n "${OUT:-}" ]; then cp "$WORK/ops-$DEVICE.json" "$OUT/"; fi
    fi
}

# -- lane 2: detaudit run on fixtures with known causes -------------------------------------
lane_audits() {
    local run=(--steps 2 --repeats 2 --timeout 60)
    if [ $DRY -eq 1 ]; then
        step "compile the GPU fixtures" 30 "$PYTHON" -m py_compile fixtures/dynamic/cuda_*.py
        step "run (CPU): index_put_ backward" 100 audit index_put_backward.py nondeterministic "${run[@]}"
        step "run (CPU): deterministic MLP" 100 audit deterministic_mlp.py deterministic "${run[@]}"
        step "run (CPU): compiled embedding step (Inductor C++)" 150 \
            audit cuda_compiled_embedding.py any "${run[@]}" -- --device cpu
        return
    fi
    step "run: index_add_ message passing" 70 audit cuda_index_add.py nondeterministic "${run[@]}"
    step "run: bilinear upsample backward" 70 audit cuda_upsample_bilinear.py nondeterministic "${run[@]}"
    step "run: EmbeddingBag(max) backward" 70 audit cuda_embedding_bag_max.py nondeterministic "${run[@]}"
    step "run: ResNet step, cuDNN defaults" 70 audit cuda_resnet_step.py any "${run[@]}"
    step "run: ResNet step under detaudit.deterministic()" 70 \
        audit cuda_resnet_step.py deterministic "${run[@]}" -- --deterministic-block
    step "run: compiled embedding step (Triton)" 150 audit cuda_compiled_embedding.py any "${run[@]}"
}

# -- the tracer's compiled recorder: built once, before the lanes trace (else they record in Python) --
SUMMARY="$WORK/lane0.summary" step "build the compiled op recorder" 120 "$PYTHON" -c '
from detaudit.dynamic.record import native
print("compiled recorder:", native.build() or "not built (the tracer records in Python)")
import torch
print("loaded:", native.load() is not None, native.unavailable_reason())
log = native.failed_build(native.library_path()) if native.library_path() else None
if log is not None:
    print("".join(open(log).readlines()[-30:]))'

SUMMARY="$WORK/lane1.summary" lane_tests_and_calibration >"$WORK/lane1.log" 2>&1 &
LANE1=$!
SUMMARY="$WORK/lane2.summary" lane_audits >"$WORK/lane2.log" 2>&1 &
LANE2=$!
wait "$LANE1" "$LANE2"
cat "$WORK/lane1.log" "$WORK/lane2.log"

# -- tracer overhead, alone on the machine --------------------------------------------------
SUMMARY="$WORK/lane3.summary" step "bench/trace_overhead.py" 90 "$PYTHON" bench/trace_overhead.py "${OVERHEAD[@]}"

echo
echo "=== summary"
cat "$WORK"/lane*.summary
FAILED=$(grep -cv "^ok" "$WORK"/lane*.summary | awk -F: '{s += $NF} END {print s}')
echo "total: $((SECONDS - STARTED)) s; $FAILED step(s) failed"
[ "$FAILED" -eq 0 ]

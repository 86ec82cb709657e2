#!/usr/bin/env bash
# GPU check: the exact-arithmetic test suite and the benches on a CUDA machine whose Python
# already has jax (CUDA build), flax, optax, chex, pytest, pytest-xdist, hypothesis and
# scikit-learn, but no network.
#
#   OUT=results/ HWJAX_GOLDEN=path/to/golden scripts/gpu_check.sh [TEST_SECS] [BENCH_SECS]
#
# TESTS (test files, default: all but the bad-input and CLI suites) and BENCHES (comma-separated
# bench command lines, default "mac,xs3,nvdla,deployed") narrow the run.
#
# Wheels in .whl/ (ai-edge-litert for Python 3.12 and backports.strenum, fetched beforehand
# with `pip download --only-binary=:all: --python-version 3.12 ...`) are installed into a
# private folder first. The tests run on the GPU as users run them (XLA's default
# optimisation); the bad-input suites (errors raised before any arithmetic) and the
# subprocess tests of the command line are left out to fit the time. Logs go to $OUT.
set -u
OUT=${OUT:-gpu_out}
TEST_SECS=${1:-240}
BENCH_SECS=${2:-50}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  SITE=$(mktemp -d)
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    && export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
# hwjax.models and hwjax.train live in models/ and train/ (pyproject's package-dir); without
# an install, copy them where the import system finds them.
[ -d hwjax/models ] || cp -r models hwjax/models
[ -d hwjax/train ] || cp -r train hwjax/train
export XLA_PYTHON_CLIENT_PREALLOCATE=false HWJAX_TEST_FAST_COMPILE=0 PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $PY -c "import jax, jaxlib, flax, numpy; print('jax', jax.__version__, 'flax', flax.__version__, 'numpy', numpy.__version__); print(jax.devices())"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

t0=$(date +%s)
TESTS=${TESTS:-"--ignore=tests/test_bad_input.py --ignore=tests/test_bad_input_api.py
  --ignore=tests/test_bad_input_kernels.py --ignore=tests/test_bad_input_nvdla.py
  --ignore=tests/test_bad_input_xs3.py --ignore=tests/test_tflite_cli.py --ignore=tests/test_packaging.py tests"}
# shellcheck disable=SC2086
timeout "$TEST_SECS" $PY -m pytest -v -n 12 --dist loadfile -p no:cacheprovider -rfE $TESTS > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/pytest.log"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | tail -40

IFS=',' read -ra BENCH_LIST <<< "${BENCHES:-mac,xs3,nvdla,deployed}"
for b in "${BENCH_LIST[@]}"; do
  secs=$BENCH_SECS; [ "${b%% *}" = deployed ] && secs=$(( 2 * BENCH_SECS ))
  echo "== bench $b" | tee -a "$OUT/bench.log"
  # shellcheck disable=SC2086
  timeout "$secs" $PY -m hwjax.bench $b >> "$OUT/bench.log" 2>&1; echo "rc=$?" >> "$OUT/bench.log"
done
cat "$OUT/bench.log"

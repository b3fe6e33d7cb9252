#!/usr/bin/env bash
# The test suite (integration tests included), after the same set-up as the demo.
#
# How it fits the 15-minute budget on 2 cores (docs/measurements/suite_time.md, "Where the
# time goes"): nearly all of its time is XLA compiling small programs, so
# * two pytest workers (pytest-xdist, one file per worker at a time);
# * JAX's persistent compilation cache, shared by the workers and by the child processes the
#   command-line tests start (a program compiled once is loaded, not compiled, elsewhere);
#   in .cache/jax, kept between runs (its keys include the jax version and the flags);
# * LLVM's backend at -O0 for the test programs (XLA's own graph optimisations still run):
#   compiling takes about half as long, and the tests' arrays are tiny. The demo and the
#   experiments run at XLA's default; set FEDJAX_PALS_TEST_XLA_DEFAULT=1 to test it too;
# * tests/conftest.py, with -O0: XLA:CPU's legacy emitters (its fusion emitters took most of
#   the compile time), every program into the cache (not only those of 1 s), and the
#   costliest test files handed to the workers first (docs/measurements/suite_time.md,
#   "2026-11-26 and 27: issue 29's cuts").
# The quick tests and the integration tests run as two pytest invocations: one process that
# had compiled every program of the whole suite once aborted inside XLA's compiler.
# FEDJAX_PALS_VENV picks the virtual environment (scripts/setup.sh), FEDJAX_PALS_TEST_PASSES
# the passes ("quick integration" by default). Extra arguments go to both invocations (e.g. -x,
# -n 0 for one process, CI's -p no:cacheprovider). A selection (-k name, -m marker, --lf, a
# test file or node id) runs as one invocation instead, without the split: a few tests compile
# little, and the pass that would select nothing would still pay a pytest start-up (collecting
# every test file: seconds to tens of seconds). `-k "not ..."` selects most of the suite and
# keeps the split. Of two passes, pytest's "no tests collected" (5) of one counts as success
# when the other ran; of both (or of the one invocation), it fails.
set -euo pipefail

# Whether the arguments select a few tests (see above): -k EXPR but not -k "not ...", -m EXPR,
# --lf, or a positional argument that is an existing path or a node id (path::name). Options and
# their values are not: -p no:cacheprovider, -n 0, -x, --tb short, --basetemp DIR.
selects_tests() {
  local arg rest letter value_of="" options_ended=""
  for arg in "$@"; do
    if [ -n "$value_of" ]; then  # the value of the option before
      case "$value_of" in
        k) [[ "$arg" == not\ * ]] || return 0 ;;
        m) return 0 ;;
      esac
      value_of=""
      continue
    fi
    if [ -z "$options_ended" ]; then
      case "$arg" in
        --) options_ended=1; continue ;;
        --lf|--last-failed) return 0 ;;
        --*=*) continue ;;
        --basetemp|--rootdir|--confcutdir|--junitxml|--junit-xml|--ignore|--ignore-glob|\
        --deselect|--maxfail|--tb|--durations|--durations-min|--numprocesses|--maxprocesses|\
        --dist|--override-ini|--pythonwarnings|--capture|--import-mode|--color|--verbosity|\
        --assert|--log-level|--log-file|--log-file-level|--log-cli-level|--log-format|\
        --log-date-format|--log-cli-format|--log-cli-date-format|--log-file-format|\
        --log-file-date-format|--log-disable|--log-auto-indent|--max-worker-restart|--tx|\
        --rsyncdir|--rsyncignore|--pdbcls|--code-highlight|--timeout|--cov)
          value_of=v; continue ;;
        --*) continue ;;
        -?*)  # short options, maybe clustered (-xk name, -kname, -n0)
          rest=${arg#-}
          while [ -n "$rest" ]; do
            letter=${rest:0:1}
            rest=${rest:1}
            case "$letter" in
              k|m|p|n|c|o|r|W)
                if [ -z "$rest" ]; then
                  value_of=$letter
                elif [ "$letter" = m ] || { [ "$letter" = k ] && [[ "$rest" != not\ * ]]; }; then
                  return 0
                fi
                break ;;
            esac
          done
          continue ;;
      esac
    fi
    if [[ "$arg" == *::* ]] || [ -e "$arg" ]; then return 0; fi
  done
  return 1
}

cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${FEDJAX_PALS_VENV:-.venv}
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$PWD/.cache/jax}"
if [ -z "${FEDJAX_PALS_TEST_XLA_DEFAULT:-}" ]; then
  export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_backend_optimization_level=0"
fi
workers=(-n "${FEDJAX_PALS_TEST_WORKERS:-2}" --dist loadfile)
passes=${FEDJAX_PALS_TEST_PASSES:-quick integration}  # CI's Python 3.13 pass: quick only
if [[ " $passes " == *" quick "* && " $passes " == *" integration "* ]] && selects_tests "$@"; then
  status=0
  "$VENV/bin/python" -m pytest -q "${workers[@]}" "$@" || status=$?
  if [ "$status" = 5 ]; then
    echo "[test] error: no test selected by $*" >&2
  fi
  exit "$status"
fi
quick=5
if [[ " $passes " == *" quick "* ]]; then
  quick=0
  "$VENV/bin/python" -m pytest -q "${workers[@]}" -m "not integration" "$@" || quick=$?
fi
integration=5
if [[ " $passes " == *" integration "* ]]; then
  integration=0
  "$VENV/bin/python" -m pytest -q "${workers[@]}" -m integration "$@" || integration=$?
fi
if [ "$quick" = 5 ] && [ "$integration" = 5 ]; then
  echo "[test] error: no test selected by $* (in the quick or the integration tests)" >&2
  exit 5
fi
[ "$quick" = 5 ] && quick=0
[ "$integration" = 5 ] && integration=0
if [ "$quick" != 0 ]; then exit "$quick"; fi
exit "$integration"

#!/usr/bin/env bash
# The test suite (integration tests included), after the same set-up as the demo.
# Two pytest processes, the quick tests then the integration tests: one process that has
# compiled every program of the whole suite once aborted inside XLA's compiler (BUILD_NOTES.md,
# "Test suite"), while each part passes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
status=0
.venv/bin/python -m pytest -q -m "not integration" "$@" || status=$?
.venv/bin/python -m pytest -q -m integration "$@" || status=$?
exit "$status"

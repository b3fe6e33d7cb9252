#!/usr/bin/env bash
# The test suite (integration tests included), after the same set-up as the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"

#!/usr/bin/env bash
# Set-up shared by the README's two commands: the Fashion-MNIST files (Debian),
# a virtual environment in .venv with the pinned stack, the package installed.
# Idempotent: a second run only checks and returns.
set -euo pipefail
cd "$(dirname "$0")/.."

FMNIST_DIR=/usr/share/datasets/fashion-mnist
if [ ! -e "$FMNIST_DIR/train-images-idx3-ubyte.gz" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing Fashion-MNIST (Debian package dataset-fashion-mnist)"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
           apt-get install -y -qq dataset-fashion-mnist >/dev/null; }; then
      echo "[setup] warning: apt-get could not install dataset-fashion-mnist;" \
           "Fashion-MNIST tests will be skipped and the demo will use the synthetic task." >&2
    fi
  else
    echo "[setup] note: Fashion-MNIST is not in $FMNIST_DIR and this is not root with apt;" \
         "run 'sudo apt-get install dataset-fashion-mnist' or pass --data_dir (see README)." >&2
  fi
fi

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  echo "[setup] error: needs Python 3.11 ($PYTHON is $("$PYTHON" --version 2>&1));" \
       "set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  if ! "$PYTHON" -m venv .venv 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      apt-get install -y -qq python3-venv >/dev/null
      "$PYTHON" -m venv .venv
    else
      echo "[setup] error: '$PYTHON -m venv' failed; install python3-venv." >&2
      exit 1
    fi
  fi
fi

stamp=".venv/.installed-$(cat pyproject.toml requirements/lock.txt | sha256sum | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  echo "[setup] installing the pinned stack into .venv (first time: about a minute;" \
       "log in .venv/install.log)"
  if ! { .venv/bin/python -m pip install --disable-pip-version-check --upgrade pip &&
         .venv/bin/python -m pip install --disable-pip-version-check --no-compile \
             -c requirements/lock.txt -e ".[test]"; } > .venv/install.log 2>&1; then
    tail -n 30 .venv/install.log >&2
    echo "[setup] error: pip install failed; the whole log is .venv/install.log" >&2
    exit 1
  fi
  # pip byte-compiles one file after another (half of the install's time, 33 of 65 s on 2
  # cores with pip's cache warm); compileall does it on every core (20 s). A file that does not
  # compile (a package's Python 2 test data) is skipped, as pip skips it.
  .venv/bin/python -m compileall -q -j 0 \
    "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
    >> .venv/install.log 2>&1 || true
  rm -f .venv/.installed-*
  touch "$stamp"
fi

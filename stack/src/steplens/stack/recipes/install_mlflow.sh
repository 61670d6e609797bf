#!/usr/bin/env bash
# Install the MLflow tracking server (UI + REST API) into a virtual environment of its own.
# usage: install_mlflow.sh VENV VERSION PINS_FILE   (run with the Python that makes the venv)
set -euo pipefail
venv="$1"; version="$2"; pins="$3"
python="${PYTHON:-python3}"
[ -f "$venv/.complete" ] && { echo "mlflow $version already in $venv"; exit 0; }
rm -rf "$venv"
echo "[mlflow] making $venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -c "$pins" "mlflow==$version"
"$venv/bin/python" -c "import mlflow.server" # the server's imports resolve
touch "$venv/.complete"
echo "[mlflow] installed mlflow $version ($(du -sh "$venv" | cut -f1))"

# Sourced by the device scripts: baseline wheels (liger, cce), and this checkout installed
# (editable, no dependencies: the device has torch, triton, transformers and lightning).
# The device has no network: the wheels travel in .whl (carry it).
set -u
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 \
  || { echo "installing the checkout failed:"; tail -5 /tmp/install.log; exit 3; }
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$OUT/nvidia-smi.txt"

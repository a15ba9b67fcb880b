#!/usr/bin/env bash
# Sets up plscale on a pod: `bash runpod/bootstrap.sh` in the project folder, run by `plscale runpod sync`
# when pyproject.toml changed (it compares .plscale/bootstrapped), or by hand on a pod from the console.
# Made for the RunPod PyTorch image (runpod/pytorch:2.8.0-py3.11-cuda12.8.1-cudnn-devel-ubuntu22.04):
# installs rsync if absent, `pip install -e .` into the Python that has the image's CUDA torch (the other
# packages pinned by constraints.txt, its torch line left out), runs
# `plscale doctor`, then writes .plscale/bootstrapped (sha256 of pyproject.toml). Safe to run again.
set -euo pipefail
die() { echo "bootstrap.sh: $*" >&2; exit 2; }
cd "$(dirname "$0")/.."
[[ -f pyproject.toml ]] || die "no pyproject.toml in $PWD: run it from a copy of the plscale project"

if ! command -v rsync > /dev/null; then  # `plscale runpod sync` copies with rsync
  sudo=; [[ $(id -u) -eq 0 ]] || sudo=sudo
  echo "bootstrap.sh: installing rsync" >&2
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq rsync > /dev/null \
    || die "could not install rsync with apt-get: install it by hand, then run this again"
fi

# The image's torch: `python` may be another Python than `python3`; use the first that imports torch
# (PYTHON=... chooses). plscale asks torch>=2.5, which the image's 2.8 satisfies, so pip keeps it
# and pulls no other torch build.
py=
for candidate in ${PYTHON:-python python3 python3.11 python3.12 python3.10}; do
  if command -v "$candidate" > /dev/null && "$candidate" -c 'import torch' 2> /dev/null; then py=$candidate; break; fi
done
[[ -n $py ]] || die "no Python here imports torch: use the RunPod PyTorch image, or install torch first (PYTHON=... picks the Python)"
torch_before=$("$py" -c 'import torch; print(torch.__version__)')
# constraints.txt pins what the references were measured with; less its torch line: the pod keeps the image's
mkdir -p .plscale
pins=()
if [[ -f constraints.txt ]]; then
  grep -v '^torch==' constraints.txt > .plscale/constraints-pod.txt
  pins=(-c .plscale/constraints-pod.txt)
fi
"$py" -m pip install -q "${pins[@]}" -e . || die "pip install -e . failed (see above)"
torch_after=$("$py" -c 'import torch; print(torch.__version__)')
[[ $torch_after == "$torch_before" ]] || echo "bootstrap.sh: warning: pip replaced torch $torch_before by $torch_after" >&2
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
  "$py" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' \
    || die "this pod has GPUs but torch $torch_after does not see CUDA: reinstall the image's torch ($torch_before)"
fi
command -v plscale > /dev/null || die "plscale is installed but not on the PATH: add $("$py" -c 'import sysconfig; print(sysconfig.get_path("scripts"))') to PATH"

plscale doctor || die "plscale doctor reports a problem: see its FAIL rows above"
sha256sum pyproject.toml | cut -d' ' -f1 > .plscale/bootstrapped
echo "bootstrap.sh: ready ($py, torch $torch_after); try: plscale lab run zero2 --gpus 2" >&2

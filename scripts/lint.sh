#!/usr/bin/env bash
# Lint and format checks, as CI runs them:
#   ruff check            Python lint (rules in ruff.toml)
#   ruff format --check   Python formatting (ruff.toml)
#   clang-format          C++/CUDA formatting of the kernels under splat/ (.clang-format)
#
#   bash scripts/lint.sh         check; exit 1 and list what differs
#   bash scripts/lint.sh --fix   apply the fixes and the formatting
#
# The tools are pinned in setup.py's "test" extra (ruff, clang-format).
set -euo pipefail
cd "$(dirname "$0")/.."
RUFF="${RUFF:-ruff}"
CLANG_FORMAT="${CLANG_FORMAT:-clang-format}"

fix=0
case "${1:-}" in
  "") ;;
  --fix) fix=1 ;;
  *) echo "lint.sh: unknown argument '$1' (expected --fix or nothing)" >&2; exit 2 ;;
esac

# Every C++/CUDA source under splat/ (the compiled kernels and their bindings).
mapfile -t kernels < <(find splat \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -type f | sort)
[ "${#kernels[@]}" -gt 0 ] || { echo "lint.sh: no C++/CUDA sources under splat/" >&2; exit 2; }

status=0
if [ "$fix" = 1 ]; then
  "$RUFF" check --fix .
  "$RUFF" format .
  "$CLANG_FORMAT" -i "${kernels[@]}"
else
  "$RUFF" check . || status=1
  "$RUFF" format --check . || status=1
  "$CLANG_FORMAT" --dry-run -Werror "${kernels[@]}" || status=1
fi
exit "$status"

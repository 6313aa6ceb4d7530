#!/usr/bin/env bash
# ASan + UBSan run of the emulated CUDA kernels (tests/test_cuda_emulation.py and
# tests/test_cuda_emulation_3dgs.py, every case) against the CPU backend, plus
# one seeded out-of-bounds read that AddressSanitizer must report.
#
#   bash scripts/cuda_emulation_asan.sh [RESULT.json]
#
# The harness is rebuilt with -fsanitize=address,undefined
# (SPLAT_CUDAEMU_SANITIZE=1, its own build folder) and libasan/libubsan are
# preloaded into Python, which is not itself instrumented; leak checking is
# off (Python's allocator holds memory to exit).  Not in .ci/run: ~10 min on
# the 2-core machine.  Run it after changing a .cu file, core.h or the shim.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench/results/cuda_emulation_asan.json}"
export SPLAT_CUDAEMU_SANITIZE=1 OMP_NUM_THREADS=1
export LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

start=$(date +%s)
clean_log=$(mktemp)
python -m pytest -q -p no:cacheprovider tests/test_cuda_emulation.py tests/test_cuda_emulation_3dgs.py >"$clean_log" 2>&1
clean_rc=$?
clean_secs=$(( $(date +%s) - start ))
clean_summary=$(grep -E "passed|failed|error" "$clean_log" | tail -1)
asan_reports=$(grep -c "ERROR: AddressSanitizer\|runtime error:" "$clean_log")
echo "clean kernels under ASan+UBSan: rc=$clean_rc, $clean_summary, sanitizer reports: $asan_reports (${clean_secs} s)"
[ "$clean_rc" -ne 0 ] && tail -40 "$clean_log"

# A read one past the end of the point list must be reported by ASan.
mutant=$(mktemp -d)
cp splat/kernels/cuda/{binning,forward,backward}.cu splat/kernels/cuda/*.cuh "$mutant/"
python - "$mutant/forward.cu" <<'PY'
import re, sys
p = sys.argv[1]; s = open(p).read()
# whatever the whitespace between the tokens (clang-format may wrap the line)
s, count = re.subn(r"k_load\s*<\s*count\)(\s*)P::store", r"k_load <= count)\1P::store", s)
assert count == 1, "forward.cu changed: update the seeded bug"
open(p, "w").write(s)
PY
mutant_log=$(mktemp)
SPLAT_CUDAEMU_KERNELS="$mutant" python -m pytest -q -s -x -p no:cacheprovider tests/test_cuda_emulation.py >"$mutant_log" 2>&1
mutant_rc=$?
mutant_report=$(grep -m1 -E "ERROR: AddressSanitizer[^ ]* [a-z-]+" -o "$mutant_log")
mutant_frame=$(grep -m1 -E "#[0-9]+ .*forward\.cu:[0-9]+" -o "$mutant_log" | sed 's/.* in //')
echo "seeded read one past the end: rc=$mutant_rc, ${mutant_report:-no ASan report} ${mutant_frame}"
rm -rf "$mutant"

python - "$out" "$clean_rc" "$clean_summary" "$asan_reports" "$clean_secs" "$mutant_rc" "$mutant_report" "$mutant_frame" <<'PY'
import json, platform, subprocess, sys
out, rc, summary, reports, secs, mrc, mreport, mframe = sys.argv[1:]
gcc = subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
result = {"command": "bash scripts/cuda_emulation_asan.sh", "machine": platform.machine(), "compiler": gcc,
          "clean": {"rc": int(rc), "pytest": summary, "sanitizer_reports": int(reports), "seconds": int(secs)},
          "seeded_read_one_past_end": {"rc": int(mrc), "asan_report": mreport, "frame": mframe}}
json.dump(result, open(out, "w"), indent=2)
print(json.dumps(result, indent=2))
ok = int(rc) == 0 and int(reports) == 0 and int(mrc) != 0 and "AddressSanitizer" in mreport
sys.exit(0 if ok else 1)
PY

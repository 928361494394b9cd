#!/usr/bin/env bash
# kvm-unit-tests' x86/vmexit.flat under exitless and under QEMU: the same flat file, the
# same cases, one run each, side by side. Cycles per iteration as vmexit prints them
# (lower is better), and exitless / QEMU.
#   scripts/kut-vmexit.sh KUT_DIR [CASE...]
# Env: EXITLESS (binary, default target/x86_64-unknown-linux-gnu/release/exitless), REPEAT (runs per VMM, median; 3).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
kut=$(cd "${1:?usage: scripts/kut-vmexit.sh KUT_DIR [CASE...]}" && pwd)
shift
exitless=${EXITLESS:-$here/target/x86_64-unknown-linux-gnu/release/exitless}
repeat=${REPEAT:-3}
cases=${*:-cpuid mov_from_cr8 mov_to_cr8 inl_from_pmtimer inl_from_qemu inl_from_kernel outl_to_kernel pci-mem pci-io}
flat=$kut/x86/vmexit.flat
[ -f "$flat" ] || { echo "no $flat: build kvm-unit-tests first" >&2; exit 2; }
command -v qemu-system-x86_64 >/dev/null || { echo "qemu-system-x86_64 is not installed" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for r in $(seq "$repeat"); do
  echo "run $r/$repeat..." >&2
  "$exitless" run --testdevs --kernel "$flat" --cmdline "$cases" --timeout 600 \
    </dev/null >"$work/exitless.$r" 2>/dev/null || true
  timeout 600 qemu-system-x86_64 -machine pc,accel=kvm -cpu qemu64 -m 256 -nodefaults -display none \
    -serial stdio -device pc-testdev -device isa-debug-exit,iobase=0xf4,iosize=0x4 -device pci-testdev \
    -kernel "$flat" -append "$cases" </dev/null >"$work/qemu.$r" 2>/dev/null || true
done

python3 - "$work" "$repeat" <<'PY'
import re, statistics, sys
work, repeat = sys.argv[1], int(sys.argv[2])
def runs(vmm):
    out = {}
    for r in range(1, repeat + 1):
        for line in open(f"{work}/{vmm}.{r}", errors="replace"):
            m = re.match(r"^([\w:-]+) (\d+)\s*$", line.strip())
            if m:
                out.setdefault(m.group(1), []).append(int(m.group(2)))
    return {k: statistics.median(v) for k, v in out.items()}
x, q = runs("exitless"), runs("qemu")
print(f"{'case':<36} {'exitless cycles':>16} {'qemu cycles':>12} {'exitless/qemu':>14}")
for case in list(dict.fromkeys(list(x) + list(q))):
    a, b = x.get(case), q.get(case)
    ratio = f"{a / b:.2f}" if a and b else "-"
    print(f"{case:<36} {a if a is not None else '-':>16} {b if b is not None else '-':>12} {ratio:>14}")
print(f"(medians of {repeat} runs each; cycles per iteration as vmexit.flat reports them)")
PY

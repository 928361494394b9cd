#!/usr/bin/env bash
# Runs kvm-unit-tests' x86 tests under exitless and, where qemu-system-x86_64 is installed,
# under QEMU with the suite's own runner; prints each test's verdict for both and each VMM's
# total wall time.
#   scripts/kvm-unit-tests.sh KUT_DIR [TEST...]
# KUT_DIR is a built checkout (./configure && make): the suite is GPL and not part of this
# repo. TEST names are sections of KUT_DIR/x86/unittests.cfg (default: all of them).
# Env: EXITLESS (binary, default target/x86_64-unknown-linux-gnu/release/exitless), QEMU_TOO=0 to skip QEMU,
# TIMEOUT_SCALE (multiplies each test's timeout; CPL0 code is emulated on nested hosts).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
kut=${1:?usage: scripts/kvm-unit-tests.sh KUT_DIR [TEST...]}
shift
kut=$(cd "$kut" && pwd)
exitless=${EXITLESS:-$here/target/x86_64-unknown-linux-gnu/release/exitless}
scale=${TIMEOUT_SCALE:-1}
cfg=$kut/x86/unittests.cfg
[ -f "$cfg" ] || { echo "no $cfg: is $kut a kvm-unit-tests checkout?" >&2; exit 2; }
[ -x "$exitless" ] || { echo "no $exitless: cargo build --release first" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# unittests.cfg -> one line per test: name|file|smp|test_args|extra_params|arch|timeout|accel|check
python3 - "$cfg" >"$work/tests" <<'PY'
import re, sys, configparser
text = open(sys.argv[1]).read()
cp = configparser.ConfigParser(interpolation=None, strict=False, comment_prefixes=('#',), inline_comment_prefixes=None)
cp.optionxform = str
cp.read_string(text)
for name in cp.sections():
    s = cp[name]
    get = lambda k, d='': s.get(k, d).strip().strip("'\"")
    extra = (get('extra_params') + ' ' + get('qemu_params')).strip()
    print('|'.join([name, get('file'), get('smp', '1'), get('test_args'), extra, get('arch'),
                    get('timeout', '90s'), get('accel'), get('check')]))
PY

wanted=" $* "
seconds() { local t=${1%s}; case $t in *m) echo $((${t%m} * 60));; *[!0-9]*|'') echo 90;; *) echo "$t";; esac; }

printf '%-28s %-28s %s\n' test exitless qemu >"$work/table"
declare -A verdict_q
total_x=0
: >"$work/names"
while IFS='|' read -r name file smp args extra arch timeout accel check; do
  [ $# -eq 0 ] || [[ $wanted == *" $name "* ]] || continue
  echo "$name" >>"$work/names"
  reason=""
  [ "$arch" = i386 ] && reason="i386 only"
  [ "$accel" = tcg ] && reason="needs TCG"
  [ -f "$kut/x86/$file" ] || reason="${reason:-no x86/$file (not built)}"
  case $smp in ''|*[!0-9]*) reason="${reason:-smp = $smp}";; esac
  if [ -n "$check" ] && [ -z "$reason" ]; then
    for c in $check; do
      f=${c%%=*}; v=${c#*=}
      [ "$(cat "$f" 2>/dev/null)" = "$v" ] || reason="check $c does not hold"
    done
  fi
  # QEMU options exitless has no equivalent for (devices, machine types, memory backends).
  mem=256M
  append=""
  if [[ $extra =~ -append\ +\'?([^\']*)\'? ]]; then append=${BASH_REMATCH[1]}; fi
  if [[ $extra =~ -m\ +([0-9]+)([MGmg]?) ]]; then
    unit=${BASH_REMATCH[2]:-M}
    mem=${BASH_REMATCH[1]}${unit^^}
  fi
  # -machine pit=off only keeps SVM's AVIC from being inhibited: harmless to ignore.
  # -enable-kvm: exitless always runs on KVM.
  # q35 with an intel-iommu and edu: --testdev-iommu (the VT-d model remaps the edu's
  # interrupts itself, so the irqchip need not be split).
  devices=""
  if [[ $extra == *"-device intel-iommu"* && $extra == *"-device edu"* ]]; then devices="--testdev-iommu"; fi
  other=$(sed -E "s/-append +'[^']*'//; s/-append +[^ ]+//; s/-m +[0-9]+[MGmg]?//; s/-cpu +[^ ]+//g; s/-smp +[^ ]+//; s/-machine +pit=off//; s/-enable-kvm//" <<<"$extra" | xargs)
  [ -z "$devices" ] || other=$(sed -E "s/-M +q35,kernel-irqchip=split//; s/-device +intel-iommu[^ ]*//; s/-device +edu//" <<<"$other" | xargs)
  [ -z "$other" ] || reason="${reason:-needs QEMU options: $other}"
  if [ -n "$reason" ]; then
    printf '%-28s %-28s\n' "$name" "SKIP ($reason)" >>"$work/rows"
    continue
  fi
  t=$(( $(seconds "$timeout") * scale ))
  start=$(date +%s.%N)
  set +e
  # --sample-guest 10 --stuck-after 10: a guest whose every vCPU has spun in place (a
  # deadlock) or halted for 10 s ends then (STUCK), not at its timeout. (A `vmcall`, which
  # this nested host's KVM never completes at CPL0, is answered by the nested profile.)
  "$exitless" run --testdevs $devices --kernel "$kut/x86/$file" --vcpus "$smp" --mem "$mem" \
    --cmdline "$args $append" --timeout "$t" --sample-guest 10 --stuck-after 10 \
    </dev/null >"$work/$name.log" 2>"$work/$name.err"
  status=$?
  set -e
  took=$(echo "$(date +%s.%N) - $start" | bc)
  total_x=$(echo "$total_x + $took" | bc)
  if grep -q "did not finish within" "$work/$name.err"; then v=TIMEOUT
  elif grep -q "guest stopped on vCPU [0-9]*: stuck: " "$work/$name.err"; then v=STUCK
  elif [ $status -eq 0 ]; then v=PASS
  # report_summary() returns 77 >> 1 when every test skipped: QEMU's isa-debug-exit turns
  # that into 77 (SKIP) for the suite's runner; exitless hands the guest's code back as is.
  elif [ $status -eq 38 ] || [ $status -eq 77 ]; then v=SKIP
  else v="FAIL($status)"; fi
  summary=$(grep -a "^SUMMARY" "$work/$name.log" | tail -n 1 | tr -d "\r" | cut -c10- || true)
  why=$(grep -a "guest stopped on\|triple fault" "$work/$name.err" | head -n 1 | sed 's/.*exitless: //; s/.*neither can exitless: //; s/guest stopped on vCPU [0-9]*: //; s/^stuck: for [0-9]* s this vCPU has looped over the same \([0-9]*\) register states (RIP \([^)]*\)).*/spinning in place at \2/' | cut -c1-70 || true)
  printf '%-28s %-28s\n' "$name" "$v $(printf '%.1f' "$took")s ${summary:-$why}" >>"$work/rows"
done <"$work/tests"

total_q="-"
if [ "${QEMU_TOO:-1}" != 0 ] && command -v qemu-system-x86_64 >/dev/null; then
  start=$(date +%s.%N)
  set +e
  (cd "$kut" && ACCEL=kvm ./run_tests.sh $(cat "$work/names") >"$work/qemu.out" 2>&1)
  set -e
  total_q=$(printf '%.1f' "$(echo "$(date +%s.%N) - $start" | bc)")
  while read -r v n rest; do
    case $v in *PASS*|*FAIL*|*SKIP*) verdict_q[$n]="$(sed 's/\x1b\[[0-9;]*m//g' <<<"$v") $rest";; esac
  done < <(sed 's/\x1b\[[0-9;]*m//g' "$work/qemu.out")
fi
while IFS= read -r row; do
  name=${row%% *}
  printf '%s %s\n' "$row" "${verdict_q[$name]:--}"
done <"$work/rows" >>"$work/table"
cat "$work/table"
echo "wall time: exitless $(printf '%.1f' "$total_x") s, qemu (run_tests.sh) $total_q s"

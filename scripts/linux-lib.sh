# Shell functions the Linux check scripts share: sourced after each sets `work` (and,
# for check, `passed=0 failed=0`, which `harness` sets).
harness() { # script name[, result marker]: say, fail, pids killed at exit, the counts, result
  harness_name=$1 result_marker=${2:-}
  say() { echo "$harness_name: $*" >&2; }
  fail() { say "FAILED at step $1"; exit 1; }
  pids=()
  cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
  trap cleanup EXIT
  passed=0 failed=0
  # name, log: the value on the log's last "MARKER name value" line.
  result() { grep -a "^$result_marker $1 " "$2" | tr -d '\r' | tail -n 1 | cut -d' ' -f3- || true; }
}
api() { # socket, method, path[, body]: the status code; the body answered is in $work/answer
  curl -s -o "$work/answer" -w "%{http_code}" --unix-socket "$1" -X "$2" "http://localhost$3" \
    ${4:+-H 'Content-Type: application/json' -d "$4"}
}
wait_for() { # file, text, seconds
  local i=0
  until grep -aq "$2" "$1" 2>/dev/null; do
    i=$((i + 1)); [ "$i" -gt $(($3 * 10)) ] && return 1; sleep 0.1
  done
}
check() { # name, condition (0/1), detail
  if [ "$2" = 0 ]; then echo "PASS $1: $3"; passed=$((passed + 1)); else echo "FAIL $1: $3"; failed=$((failed + 1)); fi
}
field() { python3 -c 'import json,sys; v=json.load(open(sys.argv[1])).get(sys.argv[2]); print("" if v is None else v)' "$work/answer" "$1"; }

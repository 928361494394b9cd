# Shell functions the Linux check scripts share: sourced after each sets `work` (and,
# for check, `passed=0 failed=0`).
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

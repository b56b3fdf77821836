#!/usr/bin/env bash
# Runs a test binary built with ASAN=1 and fails on a leak that reaches our code.
#
# Criterion runs each test in a worker process whose LeakSanitizer report does not fail the
# test, and its 2.4 runner itself now and then leaks a block of its own when tests run in
# parallel. So LSan reports without touching exit codes, and this script reads the reports:
# a leak counts when a frame of its stack lies in planner/, plugin/, tools/ or test/.
#
# exitcode is a flag LSan shares with ASan: exitcode=0 also makes a process that ASan stopped
# (a use after free, an overflow) exit with status 0, so a forked rank's error read as a clean
# exit. abort_on_error=1 turns those into SIGABRT, which every test that forks sees as a crash
# (LSan's leak reports do not abort: with exitcode=0 they never stop the process).
set -uo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}abort_on_error=1 \
    LSAN_OPTIONS=${LSAN_OPTIONS:+$LSAN_OPTIONS:}exitcode=0 "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
ours=$(awk '
    /^(Direct|Indirect) leak of/ { inleak = 1; hit = 0; next }
    inleak && /^ *#[0-9]+ / { if ($0 ~ /[ (](planner|transport|plugin|tools|test)\//) hit = 1; next }
    inleak { leaks += hit; inleak = 0 }
    END { leaks += inleak && hit; print leaks + 0 }' "$log")
if [ "$ours" -gt 0 ]; then
    echo "asan-run: $ours leak(s) reach the project's code (reports above)" >&2
    exit 1
fi
exit "$rc"

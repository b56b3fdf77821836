#!/bin/sh
# Prints the failed tests of a Criterion TAP report (--tap=FILE) with their assertion texts, so
# the last lines of a failed `make test` name what failed even when only the tail of the log
# survives (a CI summary). Exits 0; the caller keeps the test run's status.
[ "$#" -eq 1 ] && [ -r "$1" ] || { echo "usage: $0 REPORT.tap" >&2; exit 2; }
awk '
    /^not ok/ { n++; print; inblock = 1; next }
    /^(ok|not ok) / { inblock = 0 }
    inblock && /^  (---|\.\.\.)$/ { next }
    inblock && /^  / { print; next }
    { inblock = 0 }
    END { printf "tap-failures: %d failed test(s) in %s\n", n, FILENAME }' "$1"

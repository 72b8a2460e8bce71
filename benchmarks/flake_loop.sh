#!/usr/bin/env bash
# Run the fault and lifecycle tests N times in a row and report which runs and tests failed.
#
# A test that passes once can still flake under load (timing, process start-up, exit-code
# races); this loop is how we look for that. Not a test itself: it always exits 0 when it
# ran to the end, and 1 when some run failed, so it can gate a CI job if wanted.
#
# Usage: benchmarks/flake_loop.sh [N] [LOG_DIR]     (from the repository root; N default 20)
# Every run's full output is kept in LOG_DIR (default: a new temporary directory).
set -u

n="${1:-20}"
logs="${2:-$(mktemp -d -t aioloader-flake-XXXXXX)}"
mkdir -p "$logs"
tests=(tests/test_faults.py tests/test_lifecycle.py)
python=${PYTHON:-python}

echo "flake loop: $n runs of: $python -m pytest -q -p no:cacheprovider ${tests[*]}"
echo "date (UTC): $(date -u)"
echo "machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.1f GiB RAM", $2 / 1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "git: $(git describe --always --dirty 2>/dev/null || echo unknown)"
echo "logs: $logs"

failed_runs=0
start=$(date +%s)
for i in $(seq 1 "$n"); do
    log="$logs/run-$(printf '%03d' "$i").log"
    t0=$(date +%s)
    "$python" -m pytest -q -p no:cacheprovider "${tests[@]}" >"$log" 2>&1
    rc=$?
    t1=$(date +%s)
    load=$(cut -d' ' -f1 /proc/loadavg)
    summary=$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed|error).* =+$' "$log" | tail -1 | tr -d '=' | sed 's/^ *//;s/ *$//')
    if [ "$rc" -ne 0 ]; then
        failed_runs=$((failed_runs + 1))
        echo "run $i: FAILED (rc $rc, $((t1 - t0)) s, load $load): $summary"
        # pytest's -ra summary lists each failing test on a FAILED/ERROR line.
        grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /'
    else
        echo "run $i: ok ($((t1 - t0)) s, load $load): $summary"
    fi
done

echo
echo "runs: $n, failed runs: $failed_runs, total $(($(date +%s) - start)) s"
if [ "$failed_runs" -gt 0 ]; then
    echo "failing tests (times failed):"
    cat "$logs"/run-*.log | grep -E '^(FAILED|ERROR) ' | sed -E 's/^(FAILED|ERROR) ([^ ]+).*/\1 \2/' | sort | uniq -c | sort -rn
    exit 1
fi
echo "failing tests: none"

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# usage: scripts/gpu-bundle.sh [--out DIR] [--max-mib N] [--no-make]   (-h, --help: this text)
#
# Makes what scripts/gpu-check.sh needs on a GPU machine that can build nothing and reach no
# package archive (Ubuntu 24.04 with Python, torch and NCCL from pip): builds here (make all
# and the GPU programs), then gathers into DIR (default build/gpu-bundle, inside the ignored
# build folder) a tree laid out like the build folder:
#
#   lib/libnccl-net-reshard.so     the library (with the pack kernels when nvcc was here)
#   bin/                           reshard-plan, reshard_perf, reshard_net_perf
#   test/unit, test/net_driver     the Criterion suites (gpu-check runs gpu/*)
#   test/perf/                     pack_bench, delta_dev_bench, device_refit, nccl_check,
#                                  nccl_net_check, m2n_check
#   test/fake/                     the stand-in libcuda and libnccl (gpu-check.sh --stand-in)
#   lib/                           every library those need beyond glibc, from this machine:
#                                  Criterion and its dependencies, UCX (libucp, loaded by
#                                  name: RESHARD_UCX_LIB) and its TCP and CMA modules in
#                                  lib/ucx/, jansson (RESHARD_JANSSON_LIB)
#   BUNDLE.txt                     what was built from which commit, each file's origin
#
# Nothing is found through LD_LIBRARY_PATH (which would also reach torch): every library gets
# RUNPATH $ORIGIN, every program one pointing at lib/. glibc, the loader, libstdc++ and
# libgcc_s stay the image's (newer, and shared with torch). Debug information is stripped; the
# bundle must stay under --max-mib (default 48: a device run carries at most 64 MiB with the
# working tree). Needs make, a C compiler, patchelf, binutils (apt-get install patchelf).
# --no-make gathers the build as it is (each file must be there): for a caller that has just
# built it, or that runs beside another make of the same folder (the test suite).
# Environment: BUILD (the build folder to gather, default build) and MAKE_KNOBS (the make
# knobs it was built with, such as ASAN=1).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=build/gpu-bundle
MAX_MIB=48
NO_MAKE=0
BUILD=${BUILD:-build}
die() { echo "gpu-bundle: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
    -h | --help) awk 'NR > 3 && !/^#/ { exit } NR > 3 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    --out) [ $# -ge 2 ] || die "--out needs a folder"; OUT=$2; shift 2 ;;
    --no-make) NO_MAKE=1; shift ;;
    --max-mib)
        [[ ${2:-} =~ ^[0-9]+$ ]] || die "--max-mib needs a number of MiB"
        MAX_MIB=$2
        shift 2
        ;;
    *) die "unknown argument '$1' (-h says more)" ;;
    esac
done
for t in make patchelf strip ldd readelf; do
    command -v "$t" >/dev/null || die "$t not found (apt-get install $([ $t = patchelf ] && echo patchelf || echo binutils make))"
done
case $(realpath -m "$OUT") in
"$(realpath .)" | "$(realpath .)/build" | /) die "--out $OUT would replace the tree or the build" ;;
esac

PROGRAMS=(bin/reshard-plan bin/reshard_perf bin/reshard_net_perf test/unit test/net_driver
    test/perf/pack_bench test/perf/delta_dev_bench test/perf/device_refit test/perf/nccl_check test/perf/nccl_net_check
    test/perf/m2n_check)
FAKES=(test/fake/libcuda.so.1 test/fake/libnccl.so.2)
if [ $NO_MAKE = 0 ]; then
    # shellcheck disable=SC2086  # MAKE_KNOBS: the knobs BUILD was made with (ASAN=1, DEBUG=1)
    make -s -j"$(nproc)" BUILD="$BUILD" ${MAKE_KNOBS:-} all "${PROGRAMS[@]/#/$BUILD/}" \
        "${FAKES[@]/#/$BUILD/}" >&2
fi
for f in "${PROGRAMS[@]}" "${FAKES[@]}" libnccl-net-reshard.so libreshard-m2n.so; do
    [ -e "$BUILD/$f" ] || die "$BUILD/$f is missing: build it (or drop --no-make)"
done

rm -rf "$OUT"
mkdir -p "$OUT/lib/ucx" "$OUT/bin" "$OUT/test/perf" "$OUT/test/fake"
for f in "${PROGRAMS[@]}" "${FAKES[@]}"; do
    cp -L "$BUILD/$f" "$OUT/$f"
done
cp -L "$BUILD/libnccl-net-reshard.so" "$BUILD/libreshard-m2n.so" "$OUT/lib/"

# Libraries the GPU image brings itself: glibc's, the loader, and the compiler's runtime.
from_image() {
    case $1 in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libresolv.so.* | \
        libutil.so.* | libanl.so.* | libnss_* | ld-linux*.so.* | linux-vdso.so.* | \
        libstdc++.so.* | libgcc_s.so.*) return 0 ;;
    esac
    return 1
}

# The path of a library by soname, as this machine's loader finds it.
lib_path() {
    ldconfig -p | awk -v n="$1" '$1 == n && /x86-64|x86_64|AArch64/ { if (!p) p = $NF } END { if (p) print p }'
}

declare -A origin=()
real='' pkg=''
add_lib() {  # add_lib PATH: copies it under its file name (the soname links resolve to it)
    local name
    name=$(basename "$1")
    [ -e "$OUT/lib/$name" ] && return 0
    cp -L "$1" "$OUT/lib/$name"
    real=$(realpath "$1")
    pkg=$({ dpkg -S "$real" || dpkg -S "${real#/usr}"; } 2>/dev/null | head -1 | cut -d: -f1) || true
    origin[$name]=${pkg:-$real}
}

# Loaded by name at run time, not listed by ldd: UCX (and its TCP-capable core; the ib and
# rdmacm modules need rdma-core and are left out), jansson.
for so in libucp.so.0 libjansson.so.4; do
    p=$(lib_path "$so")
    [ -n "$p" ] || die "$so is not installed here (apt-get install libucx0 libjansson4)"
    add_lib "$p"
done
ucx_dir=$(dirname "$(realpath "$(lib_path libucs.so.0)")")/ucx
for m in "$ucx_dir"/libuct_cma.so.0; do
    [ -e "$m" ] && cp -L "$m" "$OUT/lib/ucx/" && origin[ucx/$(basename "$m")]=libucx0
done

# Every library any file of the bundle needs, until nothing new appears.
while :; do
    new=0
    while read -r name path; do
        from_image "$name" && continue
        [ -e "$OUT/lib/$name" ] && continue
        [ -n "$path" ] && [ "$path" != "not" ] || die "$name, needed in the bundle, is not found here"
        add_lib "$path"
        new=1
    done < <(find "$OUT" -type f \( -perm -u+x -o -name '*.so*' \) -exec ldd {} \; 2>/dev/null |
        awk '$2 == "=>" && $3 != "" { print $1, $3 } $2 == "=>" && $3 == "not" { print $1, "not" }' |
        grep -v '^libnccl-net-reshard.so \|^libreshard-m2n.so ' | sort -u)
    [ $new = 1 ] || break
done

# Strip debug information, then point every file at lib/.
find "$OUT" -type f \( -perm -u+x -o -name '*.so*' \) -exec strip --strip-debug {} \;
for f in "$OUT"/lib/*.so*; do patchelf --set-rpath '$ORIGIN' "$f"; done
for f in "$OUT"/lib/ucx/*.so*; do [ -e "$f" ] && patchelf --set-rpath '$ORIGIN/..' "$f"; done
for f in "${PROGRAMS[@]}"; do
    up=$(dirname "$f" | awk -F/ '{ s = ""; for (i = 1; i <= NF; i++) s = s "../"; print s }')
    patchelf --set-rpath "\$ORIGIN/${up}lib" "$OUT/$f"
done

# Nothing may still reach for a library outside the bundle and the image.
missing=$(cd "$OUT" && find . -type f \( -perm -u+x -o -name '*.so*' \) -exec sh -c \
    'ldd "$1" 2>/dev/null | awk -v f="$1" '"'"'$2 == "=>" && $3 == "not" { print f ": " $1 }'"'"'' _ {} \;)
[ -z "$missing" ] || die "unresolved in the bundle: $missing"

kernels="absent: no nvcc at build time (gpu-check's kernel steps then SKIP, saying so)"
[ -e "$BUILD/obj/cuda/pack_fatbin.o" ] && kernels="embedded (sm_80, sm_90, sm_100 + PTX)"
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit+local changes"
{
    echo "reshard GPU bundle: $commit, made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | sed -n 1p)"
    echo "pack kernels: $kernels"
    echo "run it where the GPU is: scripts/gpu-check.sh --bundle $OUT"
    echo
    (cd "$OUT" && find . -type f ! -name BUNDLE.txt -printf '%P %s\n' | sort) | while read -r f size; do
        printf '%-34s %9d  %s\n' "$f" "$size" "${origin[${f#lib/}]:-built here}"
    done
} >"$OUT/BUNDLE.txt"

bytes=$(du -sb "$OUT" | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
files=$(find "$OUT" -type f | wc -l)
if [ "$bytes" -gt $((MAX_MIB * 1048576)) ]; then
    echo "gpu-bundle: $OUT is $mib MiB, over the $MAX_MIB MiB allowed (--max-mib)" >&2
    exit 1
fi
echo "gpu-bundle: $OUT: $files files, $mib MiB (limit $MAX_MIB MiB); pack kernels $kernels"

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks that every include line of the library points down its layers.

usage: scripts/check-layers.py [ROOT]      (ROOT: the repository, by default the one this is in)

The layers, bottom up: base <- planner <- cuda <- transport <- plugin <- tools. A file may
include headers of its own folder and of the layers below its own; inside transport/ and
plugin/ the rooms are ordered too (ROOMS below): a room may include lower rooms and its
layer's own headers (transport/tp.h, plugin/reshard.h), never a sibling or a room above.
The files at a layer's top level that are not headers (transport/tp_pick.c) sit above its
rooms. Quoted includes are either a bare name, a header beside the file, or a path from the
root; the planner includes only the C library's headers. Prints one line per violation and
exits 1 when there is any."""
import os
import re
import sys

LAYERS = ["base", "planner", "cuda", "transport", "plugin", "tools"]
# Rooms inside a layer: a larger number sits higher.
ROOMS = {
    "transport": {"sock": 1, "boot": 2, "ucx": 2, "ib": 2},
    "plugin": {"net": 1, "comm": 1, "exec": 2, "api": 3, "m2n": 4},
}
TOP = 99  # the top-level sources of a layer, above its rooms
# What the planner may take from the system: the C library (ISO C and POSIX).
LIBC = {
    "assert.h", "ctype.h", "errno.h", "float.h", "inttypes.h", "limits.h", "math.h", "stdarg.h",
    "stdatomic.h", "stdbool.h", "stddef.h", "stdint.h", "stdio.h", "stdlib.h", "string.h",
    "strings.h", "time.h", "unistd.h", "sys/resource.h", "sys/mman.h", "sys/time.h",
    "sys/types.h",
}
INCLUDE = re.compile(r'^\s*#\s*include\s+([<"])([^>"]+)[>"]')
SOURCES = (".c", ".h", ".cu")


def place(path):
    """(layer index, room rank) of a file's path from the root, or None outside the layers."""
    parts = path.split("/")
    if parts[0] not in LAYERS:
        return None
    layer = LAYERS.index(parts[0])
    rooms = ROOMS.get(parts[0])
    if not rooms:
        return layer, 0
    if len(parts) == 2:  # a top-level file: headers at the bottom, sources at the top
        return layer, 0 if path.endswith(".h") else TOP
    return layer, rooms.get(parts[1], TOP)


def room_name(path):
    parts = path.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 and parts[0] in ROOMS else parts[0]


def check_file(root, path):
    problems = []
    here = place(path)
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    for no, line in enumerate(lines, 1):
        m = INCLUDE.match(line)
        if not m:
            continue
        kind, name = m.groups()
        where = f"{path}:{no}"
        if kind == "<":
            if path.startswith("planner/") and name not in LIBC:
                problems.append(f"{where}: the planner uses only base and the C library, "
                                f"not <{name}>")
            continue
        if "/" not in name:
            target = os.path.join(os.path.dirname(path), name)
            if not os.path.isfile(os.path.join(root, target)):
                problems.append(f'{where}: "{name}" is not beside the file: name its folder')
            continue
        target = os.path.normpath(name)
        if not os.path.isfile(os.path.join(root, target)):
            problems.append(f'{where}: "{name}" does not exist under the root')
            continue
        there = place(target)
        if here is None or there is None:
            continue
        if os.path.dirname(target) == os.path.dirname(path):
            problems.append(f'{where}: "{name}" is beside the file: include it by its bare name')
            continue
        if room_name(target) == room_name(path):
            continue
        if there[0] > here[0]:
            problems.append(f'{where}: includes "{name}": {LAYERS[there[0]]} is above '
                            f'{LAYERS[here[0]]}')
        elif there[0] == here[0] and there[1] >= here[1] and there[1] != 0:
            problems.append(f'{where}: includes "{name}": {room_name(target)} is not below '
                            f'{room_name(path)}')
    return problems


def main(argv):
    if len(argv) > 1 and argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(argv) > 2 or (len(argv) > 1 and argv[1].startswith("-")):
        print(f"check-layers: unexpected argument '{argv[-1]}' (it takes ROOT; -h says more)",
              file=sys.stderr)
        return 2
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isdir(os.path.join(root, "planner")):
        print(f"check-layers: {root} is not a reshard checkout (no planner/)", file=sys.stderr)
        return 2
    problems, nfiles = [], 0
    for layer in LAYERS:
        for d, _, names in os.walk(os.path.join(root, layer)):
            for n in sorted(names):
                if n.endswith(SOURCES):
                    nfiles += 1
                    problems += check_file(root, os.path.relpath(os.path.join(d, n), root))
    for p in problems:
        print(p)
    if problems:
        print(f"check-layers: {len(problems)} include(s) against the layers")
        return 1
    print(f"check-layers: {nfiles} files, every include points down the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Checks docs/architecture.md's dependency rules on the source tree; exits 1 naming each break.

Usage: check_layering.py [ROOT]   (ROOT defaults to the repository holding this script)

The rules (docs/architecture.md, "Dependency rules"):
- common/, controller/, agent/ and rpc/ never include trainer/ nor name a library defined under it:
  what llmctl and llm-train both read lives in common/;
- common/ includes no LibTorch header (torch/, ATen/, c10/): llmctl links common/ and no LibTorch;
- trainer/ knows no transport: it never includes proto/, rpc/, controller/ or agent/.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]')
LIBRARY = re.compile(r'\b(?:llmctl_library|add_library)\(\s*([A-Za-z0-9_-]+)')
SOURCE_SUFFIXES = (".cc", ".h", ".cu", ".inc")
ORCHESTRATION = ("common", "controller", "agent", "rpc")
FORBIDDEN_INCLUDES = {
    "common": ("trainer/", "torch/", "ATen/", "c10/"),
    "controller": ("trainer/",),
    "agent": ("trainer/",),
    "rpc": ("trainer/",),
    "trainer": ("proto/", "rpc/", "controller/", "agent/"),
}


def walk(root, top, names):
    for folder, dirs, files in os.walk(os.path.join(root, top)):
        dirs[:] = [d for d in dirs if d not in ("third_party", "build")]
        for name in files:
            if names(name):
                yield os.path.join(folder, name)


def include_breaks(root):
    for top, forbidden in FORBIDDEN_INCLUDES.items():
        for path in walk(root, top, lambda n: n.endswith(SOURCE_SUFFIXES)):
            with open(path, encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    match = INCLUDE.match(line)
                    if match and match.group(1).startswith(forbidden):
                        yield (f"{os.path.relpath(path, root)}:{number}: {top}/ must not include "
                               f"{match.group(1)}")


def trainer_libraries(root):
    names = set()
    for path in walk(root, "trainer", lambda n: n == "CMakeLists.txt"):
        with open(path, encoding="utf-8") as f:
            names.update(LIBRARY.findall(f.read()))
    return names


def link_breaks(root):
    libraries = trainer_libraries(root)
    if not libraries:
        return
    named = re.compile(r"(?<![A-Za-z0-9_-])(" + "|".join(map(re.escape, sorted(libraries))) +
                       r")(?![A-Za-z0-9_-])")
    for top in ORCHESTRATION:
        for path in walk(root, top, lambda n: n == "CMakeLists.txt"):
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    code = line.split("#", 1)[0]
                    for match in named.finditer(code):
                        yield (f"{os.path.relpath(path, root)}:{number}: {top}/ must not link "
                               f"{match.group(1)}, a library of trainer/")


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    breaks = list(include_breaks(root)) + list(link_breaks(root))
    for line in breaks:
        print(line, file=sys.stderr)
    if breaks:
        print(f"check_layering: {len(breaks)} break(s) of docs/architecture.md's dependency rules",
              file=sys.stderr)
        return 1
    print("check_layering: the dependency rules hold")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

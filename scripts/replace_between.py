#!/usr/bin/env python3
"""replace_between.py FILE BEGIN_MARKER END_MARKER CONTENT_FILE: puts CONTENT_FILE's text between the
two marker lines of FILE (used by `make readme-keys`)."""
import sys

path, begin, end, content_path = sys.argv[1:5]
text = open(path, encoding="utf-8").read()
content = open(content_path, encoding="utf-8").read()
start = text.index(begin) + len(begin) + 1  # keep the marker line and its newline
stop = text.index(end)
open(path, "w", encoding="utf-8").write(text[:start] + content + text[stop:])

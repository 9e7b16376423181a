#!/usr/bin/env python3
"""Fails when a file under src/ or verbs/ includes a folder that its
folder's README.md does not name on its 'May include:' line (the layering
rule, one direction), when a folder holding sources has no such README, or
is longer than MAX_LINES (CONTRIBUTING.md: split a file along what it does
before it gets there)."""
import pathlib
import re
import sys

repo = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
rows = {}
readmes = [p for p in (repo / "src").rglob("README.md") if p.parent != repo / "src"]
readmes.append(repo / "verbs/README.md")
problems = []
for readme in readmes:
    name = readme.parent.relative_to(repo).as_posix()
    name = "verbs" if name == "verbs" else name[len("src/"):]
    lines = [l for l in readme.read_text().splitlines() if l.startswith("May include:")]
    if len(lines) != 1:
        problems.append(f"{readme.relative_to(repo)}: needs one line 'May include: ...'")
        continue
    allowed = lines[0][len("May include:"):].strip()
    rows[name] = set() if allowed.startswith("nothing") else {
        c.strip() for c in allowed.split(",") if c.strip()}
if "core" not in rows or "verbs" not in rows:
    sys.exit("check_layers: no 'May include:' line in src/core/README.md or verbs/README.md")


def folder(path: str):
    """The table's folder of a repository path, or None outside src/ and verbs/."""
    if path.startswith("verbs/"):
        return "verbs"
    if not path.startswith("src/"):
        return None
    parts = path[len("src/"):].split("/")
    for depth in (2, 1):
        name = "/".join(parts[:depth])
        if len(parts) > depth and name in rows:
            return name
    return "(top level)"


MAX_LINES = 500

bad = list(problems)
for source in sorted(list((repo / "src").rglob("*.[ch]pp")) + list((repo / "verbs").rglob("*.[ch]pp"))):
    rel = source.relative_to(repo).as_posix()
    mine = folder(rel)
    lines = len(source.read_text().splitlines())
    if lines > MAX_LINES:
        bad.append(f"{rel}: {lines} lines, more than {MAX_LINES}: split it along what it does")
    if mine not in rows:
        bad.append(f"{rel}: its folder has no README.md with a 'May include:' line")
        continue
    for n, line in enumerate(source.read_text().splitlines(), 1):
        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
        if not m:
            continue
        target = folder(m.group(1))
        if target is None:
            if not m.group(1).startswith("rdmacc/"):
                bad.append(f"{rel}:{n}: includes {m.group(1)} (outside src/, verbs/ and include/)")
            continue
        if target != mine and target not in rows[mine]:
            bad.append(f"{rel}:{n}: {mine} includes {m.group(1)} ({target}), which its README does not allow")
for b in bad:
    print(b)
if bad:
    print(f"check_layers: {len(bad)} problem(s): move the code down or change src/README.md's table "
          "with the reason; split files past the limit")
    sys.exit(1)
print(f"check_layers: {len(rows)} folders, every include allowed, no file over {MAX_LINES} lines")

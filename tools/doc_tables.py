"""Generated tables in docs/: the text between a pair of markers
<!-- NAME:begin --> and <!-- NAME:end --> is replaced by a tool's output, so
numbers in the docs are never typed by hand. Used by tools/benchmark-formation
and tools/benchmark-groups."""
import pathlib
import sys

repo = pathlib.Path(__file__).resolve().parent.parent


def write_between(marker, body, tool, doc="docs/performance.md"):
    """Replaces what is between MARKER's markers in DOC with BODY; exits
    naming TOOL when the markers are missing."""
    path = repo / doc
    text = path.read_text()
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    if begin not in text or end not in text:
        sys.exit(f"{tool}: {doc} has no {marker} markers")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(head + begin + "\n" + body + "\n" + end + tail)
    print(f"{tool}: table written to {path}")

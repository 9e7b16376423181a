"""Every command in README.md and docs/*.md that runs one of rdmacc's tools
(rdmacc-perf, rdmacc-run, rdmacc-info, rdmacc-tune) is accepted by that
tool's command line: each is parsed by the tool itself with
RDMACC_PARSE_ONLY=1 (parse, then exit 0) and must not be a usage error. The
commands are taken from fenced code blocks and from `inline code`; shell
operators end a command, leading VAR=value assignments and wrappers
(tools/with-rdma-device ... --, timeout, sudo) are skipped, and the program
rdmacc-run starts is checked too when it is one of the tools. A command
with a placeholder (<...>, ..., an upper-case word such as N or
COLLECTIVE) is skipped and counted.

    python3 tests/docs/commands.py BIN_DIR REPO_DIR
"""

import os
import re
import shlex
import subprocess
import sys

TOOLS = ("rdmacc-perf", "rdmacc-run", "rdmacc-info", "rdmacc-tune")
OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "2>", "2>&1", "<", ")", "("}


def snippets(text):
    """Command lines from fenced blocks and inline code spans."""
    fenced = re.findall(r"```([a-z]*)\n(.*?)```", text, flags=re.S)
    for language, block in fenced:
        if language not in ("", "sh", "bash", "shell", "console"):
            continue  # C++, Python, output
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            yield line.split(" #")[0].strip()
    # Inline code that is a runnable command (a path or an environment
    # assignment first), not prose naming a tool or an option.
    rest = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`\n]+)`", rest):
        if re.match(r"^(build/|tools/|\$|[A-Z_]+=\S)", span.strip()):
            yield span.strip()


def tool_invocations(line):
    """(tool, args) for every tool the line runs."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return
    i = 0
    while i < len(words):
        name = os.path.basename(words[i])
        if name in TOOLS:
            args = []
            j = i + 1
            while j < len(words) and words[j] not in OPERATORS and not re.match(r"^\d?>", words[j]):
                args.append(words[j])
                j += 1
            yield name, args
            if name == "rdmacc-run":
                # the program it starts: checked as its own invocation
                if "--" in args:
                    inner = args[args.index("--") + 1 :]
                    yield from tool_invocations(shlex.join(inner))
                i = j
                continue
            i = j
        i += 1


def main():
    bin_dir, repo = sys.argv[1], sys.argv[2]
    files = [os.path.join(repo, "README.md")] + sorted(
        os.path.join(repo, "docs", f) for f in os.listdir(os.path.join(repo, "docs")) if f.endswith(".md")
    )
    checked, skipped, bad = 0, 0, []
    seen = set()
    env = dict(os.environ, RDMACC_PARSE_ONLY="1")
    for path in files:
        for line in snippets(open(path).read()):
            for tool, args in tool_invocations(line):
                if tool == "rdmacc-run" and "--" in args:
                    args = args[: args.index("--")] + ["--", "true"]
                if any(re.search(r"<[^>]*>|\.\.\.", a) or re.fullmatch(r"[A-Z][A-Z_]*", a) for a in args):
                    skipped += 1
                    continue
                key = (tool, tuple(args))
                if key in seen:
                    continue
                seen.add(key)
                run = subprocess.run([os.path.join(bin_dir, tool), *args], env=env,
                                     capture_output=True, text=True, timeout=30)
                checked += 1
                if run.returncode != 0:
                    bad.append(f"{os.path.relpath(path, repo)}: {tool} {shlex.join(args)}: exit "
                               f"{run.returncode}: {run.stderr.strip().splitlines()[:1]}")
    print(f"docs commands: {checked} distinct tool command lines accepted, {skipped} with "
          f"placeholders skipped, {len(bad)} refused")
    for b in bad:
        print("  " + b)
    return 1 if bad or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())

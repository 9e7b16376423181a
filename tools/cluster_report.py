#!/usr/bin/env python3
"""The tables (Markdown) of tools/benchmark-cluster from its rdmacc-perf
--json files, and with --plot PNG busbw against message size per loss rate.

    cluster_report.py DIR [--part loss|rails|formation|hier] [--plot PNG]

A value is the range over the rounds (min-max), or one number for one
round; a run that failed (no JSON) shows as "failed". Each part counts its
own rounds (the parts may come from different runs: --only).
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

LOSS = [("0", "none"), ("0.1", "0.1 %"), ("1", "1 %"), ("5", "5 %"),
        ("1r", "1 % + reordering (10 %, 1 ms delay)")]


def load(directory, pattern):
    """{(key groups...): [doc per round]} for files matching pattern (regex
    on the name, the last group being the round)."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        m = re.fullmatch(pattern, os.path.basename(path))
        if not m:
            continue
        with open(path) as f:
            runs.setdefault(m.groups()[:-1], []).append(json.load(f))
    return runs


def row(doc, index):
    """The row of the index-th size of the sweep (-1: the largest): its
    out-of-place row, or the in-place one where there is none (allreduce)."""
    sizes = sorted({r["size"] for r in doc["rows"]})
    if not sizes or index >= len(sizes):
        return None
    rows = [r for r in doc["rows"] if r["size"] == sizes[index]]
    return next((r for r in rows if not r["in_place"]), rows[0])


def size_labels(runs):
    """The sizes of the sweep, from any run (nominal: rounded to KiB/MiB, as
    a split over 3 ranks rounds them down)."""
    for docs in runs.values():
        for d in docs:
            return [human(s) for s in sorted({r["size"] for r in d["rows"]})]
    return []


def span(values, fmt):
    if not values:
        return "failed"
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def med(values):
    """The median (the upper one of an even count), None for no values."""
    values = sorted(values)
    return values[len(values) // 2] if values else None


def wrong(docs):
    total = sum(r["wrong"] or 0 for d in docs for r in d["rows"])
    return "0" if total == 0 else f"**{total}**"


def outcome(docs, rounds):
    """The last two cells of a row: wrong elements, and how many of the row's
    runs (two per round) completed."""
    return f"{wrong(docs) if docs else 'failed'} | {len(docs)} of {2 * rounds} |"


def human(size):
    if size >= 1000000:
        return f"{round(size / 1048576)} MiB"
    return f"{round(size / 1024)} KiB" if size >= 1000 else f"{size} B"


def rounds_of(directory, part):
    """The rounds of the part's last run: the highest round number of its files."""
    return max((int(m.group(1)) for path in glob.glob(os.path.join(directory, f"{part}-*-r*.json"))
                if (m := re.search(r"-r(\d+)\.json$", path))), default=0)


def loss_table(directory):
    rounds = rounds_of(directory, "loss")
    runs = load(directory, r"loss-(.+)-(allreduce|allgather)-r(\d+)\.json")
    if not runs:
        return ""
    labels = size_labels(runs)
    small, big = labels[0], labels[-1]
    out = [f"### Bus bandwidth against packet loss (3 hosts x 1 rank, {rounds} round(s))", "",
           "tc netem on host 2's link (egress); rdmacc-perf with every element checked. "
           "busbw in GB/s, time in us; ratio: busbw at "
           f"{big} over the no-loss runs' (medians).", "",
           f"| loss on host 2's link | allreduce {small} time | allreduce {big} busbw "
           f"| allgather {big} busbw | ratio allreduce / allgather | wrong elements | runs completed |",
           "|---|---|---|---|---|---|---|"]

    def busbw(name, coll):
        return [row(d, -1)["busbw_gbs"] for d in runs.get((name, coll), []) if row(d, -1)]

    base = {c: med(busbw("0", c)) for c in ("allreduce", "allgather")}
    for name, label in LOSS:
        ar, ag = busbw(name, "allreduce"), busbw(name, "allgather")
        small_t = [row(d, 0)["time_us"] for d in runs.get((name, "allreduce"), []) if row(d, 0)]
        ratios = []
        for c, values in (("allreduce", ar), ("allgather", ag)):
            ratios.append(f"{med(values) / base[c]:.2f}" if values and base[c] else "-")
        docs = runs.get((name, "allreduce"), []) + runs.get((name, "allgather"), [])
        out.append(f"| {label} | {span(small_t, '{:.0f}')} | {span(ar, '{:.3f}')} | "
                   f"{span(ag, '{:.3f}')} | {' / '.join(ratios)} | {outcome(docs, rounds)}")
    return "\n".join(out) + "\n"


def rails_table(directory):
    rounds = rounds_of(directory, "rails")
    tables = [rails_variant(
        directory, rounds, "rails",
        f"### One NIC or two per host (2 hosts x 2 ranks, {rounds} round(s))",
        "Both local ranks on rail 0 (`RDMACC_IB_HCA=rxe0`) or spread over two "
        "(`RDMACC_IB_HCA=rxe0,rxe1`, local rank r on rail r); shared memory inside "
        "a host. busbw in GB/s."), rails_variant(
        directory, rounds, "stripe",
        f"### One rank striping over two NICs (2 hosts x 1 rank, {rounds} round(s))",
        "One rank per host on rail 0 (`RDMACC_IB_RAILS=1`) or striping its peer's traffic "
        "over both (`RDMACC_IB_HCA=rxe0,rxe1 RDMACC_IB_RAILS=2`: collective chunks "
        "round-robin over one queue pair per NIC). busbw in GB/s.")]
    return "\n".join(t for t in tables if t)


def rails_variant(directory, rounds, prefix, title, text):
    runs = load(directory, prefix + r"-(\d)-(allreduce|alltoall)-r(\d+)\.json")
    if not runs:
        return ""
    labels = size_labels(runs)
    out = [title, "", text, "",
           "| rails | " + " | ".join(f"{c} {s}" for c in ("allreduce", "alltoall") for s in labels)
           + " | wrong elements | runs completed |",
           "|---|" + "---|" * (2 * len(labels)) + "---|---|"]
    for rails in ("1", "2"):
        cells = []
        docs_all = []
        for c in ("allreduce", "alltoall"):
            docs = runs.get((rails, c), [])
            docs_all += docs
            for i in range(len(labels)):
                cells.append(span([row(d, i)["busbw_gbs"] for d in docs if row(d, i)], "{:.3f}"))
        out.append(f"| {rails} | " + " | ".join(cells) + f" | {outcome(docs_all, rounds)}")
    return "\n".join(out) + "\n"


def formation_table(directory):
    rounds = rounds_of(directory, "formation")
    runs = load(directory, r"formation-(\d+)-(auto|rdma)-r(\d+)\.json")
    if not runs:
        return ""
    counts = sorted({int(k[0]) for k in runs})
    out = [f"### Group formation (2 hosts, {rounds} round(s))", "",
           "From the first call to a working group (the slowest rank), and the "
           "largest rank's resident memory right after: ranks of a host through "
           "shared memory and RDMA between hosts (`auto`), or every pair over RDMA "
           "(`rdma`: one rdma_cm connection and queue pairs per pair).", "",
           "| ranks | auto: time (ms) | auto: memory (MiB) | rdma: time (ms) | rdma: memory (MiB) | runs completed |",
           "|---|---|---|---|---|---|"]
    for n in counts:
        cells = []
        done = 0
        for t in ("auto", "rdma"):
            docs = runs.get((str(n), t), [])
            done += len(docs)
            cells.append(span([d["formation_ms"] for d in docs], "{:.0f}"))
            cells.append(span([d["resident_mib"] for d in docs], "{:.1f}"))
        out.append(f"| {n} | " + " | ".join(cells) + f" | {done} of {2 * rounds} |")
    return "\n".join(out) + "\n"


def hier_table(directory):
    rounds = rounds_of(directory, "hier")
    runs = load(directory, r"hier-(.+)-(flat|hier)-r(\d+)\.json")
    if not runs:
        return ""
    out = [f"### Hierarchical against flat (2 hosts x 2 ranks, {rounds} round(s))", "",
           "Flat: the algorithm auto takes without knowing hosts (recursive doubling, "
           "tree, ring or chain, dissemination); hierarchical: through each host's "
           "shared memory, across hosts, inside each host again. Alternated in each "
           "round, every element checked. Small sizes: time (us, lower is better); "
           "1 MiB and up: busbw (GB/s, higher is better); ratio: hierarchical over "
           "flat of the medians (below 1 is faster for times, above 1 for busbw).", "",
           "| case | size | flat | hierarchical | ratio | wrong elements | runs completed |",
           "|---|---|---|---|---|---|---|"]

    # by collective, small sizes before large
    names = sorted({k[0] for k in runs}, key=lambda n: (n.split("-")[0], n.endswith("-large")))
    for name in names:
        flat, hier = runs.get((name, "flat"), []), runs.get((name, "hier"), [])
        sizes = sorted({r["size"] for d in flat + hier for r in d["rows"]})
        for i, size in enumerate(sizes):
            metric = "busbw_gbs" if size >= 1000000 else "time_us"
            fmt = "{:.3f}" if metric == "busbw_gbs" else "{:.0f}"
            a = [row(d, i)[metric] for d in flat if row(d, i)]
            b = [row(d, i)[metric] for d in hier if row(d, i)]
            ratio = f"{med(b) / med(a):.2f}" if a and b and med(a) else "-"
            collective = name.split("-")[0]
            out.append(f"| {collective} | {human(size) if collective != 'barrier' else '-'} | "
                       f"{span(a, fmt)} | {span(b, fmt)} | {ratio} | {outcome(flat + hier, rounds)}")
    return "\n".join(out) + "\n"


def plot(directory, png):
    runs = load(directory, r"loss-(.+)-(allreduce|allgather)-r(\d+)\.json")
    with tempfile.TemporaryDirectory() as tmp:
        panels = []
        for coll in ("allreduce", "allgather"):
            series = []
            for name, label in LOSS:
                docs = runs.get((name, coll))
                if not docs:
                    continue
                data = os.path.join(tmp, f"{coll}-{name}.dat")
                with open(data, "w") as f:  # the latest round
                    for i in range(len({r["size"] for r in docs[-1]["rows"]})):
                        r = row(docs[-1], i)
                        f.write(f"{r['size']} {r['busbw_gbs']}\n")
                series.append(f"'{data}' using 1:2 with linespoints title 'loss {label}'")
            panels.append((coll, series))
        script = os.path.join(tmp, "plot.gp")
        with open(script, "w") as f:
            f.write(f"set terminal pngcairo size 1200,450\nset output '{png}'\n"
                    "set multiplot layout 1,2 title 'rdmacc across 3 soft-RoCE hosts: busbw against loss on one link'\n"
                    "set logscale x 2\nset xlabel 'message size'\nset ylabel 'busbw (GB/s)'\n"
                    "set key below\nset grid\n")
            sizes = sorted({r["size"] for docs in runs.values() for r in docs[-1]["rows"]})
            tics = ", ".join(f"'{human(x)}' {x}" for x in sizes)
            f.write(f"set xtics ({tics})\n")
            for coll, series in panels:
                if series:
                    f.write(f"set title '{coll}'\nplot {', '.join(series)}\n")
            f.write("unset multiplot\n")
        subprocess.run(["gnuplot", script], check=True)


TABLES = {"loss": loss_table, "rails": rails_table, "formation": formation_table,
          "hier": hier_table}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("directory")
    p.add_argument("--part", choices=sorted(TABLES), help="only this part's table")
    p.add_argument("--plot", help="draw busbw against size per loss rate into this PNG")
    a = p.parse_args()
    parts = [a.part] if a.part else list(TABLES)
    print("\n".join(t for t in (TABLES[part](a.directory) for part in parts) if t))
    if a.plot:
        plot(a.directory, a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

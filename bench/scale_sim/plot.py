"""Plots of the scale simulator's TSV (bench/scale_sim/README.md).

    /usr/bin/python3 bench/scale_sim/plot.py docs/figures/scale_sim.tsv docs/figures [LABEL]

writes scale_time.{png,svg} (modeled layer time, forward + backward, summed
over the packs, against GPU count; floors: compute, and the busiest node's
inter-node exact need over one of its links) and scale_bytes.{png,svg}
(forward bytes received by the busiest rank: all link tiers solid, the
inter-node part thin and dashed where a compiled plan gives it), one panel
per T, one line per strategy;
filled markers where the figure comes from a compiled plan, hollow ones
(dashed line) where it is auto's lower bound of the strategy's modeled time
(bytes: the closed forms); the floors in black. Debian's python3-matplotlib,
the Agg backend, fixed SVG hash salt and no dates: the same TSV gives the
same files.
"""

import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STRATEGIES = ["ring", "allgather", "ulysses", "usp", "sap", "hsap", "auto"]
STYLE = {
    "ring": ("tab:red", "o"),
    "allgather": ("tab:orange", "s"),
    "ulysses": ("tab:purple", "^"),
    "usp": ("tab:brown", "v"),
    "sap": ("tab:blue", "D"),
    "hsap": ("tab:green", "P"),
    "auto": ("black", "x"),
}


def read(path):
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f, delimiter="\t"):
            r["tokens"] = int(r["tokens"])
            r["gpus"] = int(r["gpus"])
            r["modeled_ms"] = float(r["modeled_ms"])
            r["busiest_mib"] = float(r["busiest_mib"])
            r["busiest_inter_mib"] = float(r["busiest_inter_mib"])  # nan: bound rows
            rows.append(r)
    return rows


def tokens_label(t):
    return "%dM" % (t >> 20) if t >= (1 << 20) else "%dK" % (t >> 10)


def panel(ax, rows, t, column, floors, second=None):
    here = [r for r in rows if r["tokens"] == t]
    for s in STRATEGIES:
        if second is not None:
            pts = sorted((r["gpus"], r[second]) for r in here
                         if r["strategy"] == s and r[second] == r[second] and r[second] > 0)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=STYLE[s][0],
                        linewidth=0.7, linestyle="--", zorder=2)
        pts = sorted((r["gpus"], r[column], r["source"]) for r in here if r["strategy"] == s)
        if not pts:
            continue
        color, marker = STYLE[s]
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        ax.plot(xs, ys, color=color, linewidth=1.2, label=s, zorder=2,
                linestyle=":" if s == "auto" else "-")
        for x, y, src in pts:
            ax.plot([x], [y], marker=marker, color=color, markersize=4.5, zorder=3,
                    markerfacecolor=color if src == "plan" else "white")
    for name, style, label in floors:
        pts = sorted((r["gpus"], r[column]) for r in here if r["strategy"] == name)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color="black", linestyle=style,
                    linewidth=1.0, label=label, zorder=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title("T = %s tokens" % tokens_label(t), fontsize=10)
    ax.grid(True, which="major", linewidth=0.4, alpha=0.5)
    ax.tick_params(labelsize=8)


def figure(rows, column, ylabel, floors, title, out_base, second=None):
    tokens = sorted({r["tokens"] for r in rows})
    cols = 3 if len(tokens) > 2 else len(tokens)
    nrows = (len(tokens) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
    for i, t in enumerate(tokens):
        ax = axes[i // cols][i % cols]
        panel(ax, rows, t, column, floors, second)
        if i % cols == 0:
            ax.set_ylabel(ylabel, fontsize=9)
        if i // cols == nrows - 1:
            ax.set_xlabel("GPUs (nodes x 8)", fontsize=9)
    for j in range(len(tokens), nrows * cols):
        axes[j // cols][j % cols].axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8,
               frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 0.93))
    fig.savefig(out_base + ".png", dpi=110, metadata={"Software": None})
    fig.savefig(out_base + ".svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)


def main(argv):
    if len(argv) not in (3, 4):
        print("usage: plot.py SCALE_SIM_TSV OUT_DIR [PROFILE_LABEL]", file=sys.stderr)
        return 2
    profile = argv[3] if len(argv) == 4 else "h100 profile"
    matplotlib.rcParams["svg.hashsalt"] = "hsap-scale-sim"
    matplotlib.rcParams["path.simplify"] = False
    rows = read(argv[1])
    os.makedirs(argv[2], exist_ok=True)
    note = ("filled markers: compiled plans; hollow: too large to compile here, auto's lower "
            "bound of the modeled time and the closed-form bytes")
    figure(rows, "modeled_ms", "modeled ms",
           [("compute_floor", "--", "compute floor"),
            ("inter_need", "-.", "inter-node need over one link (busiest node)")],
           "Modeled layer time (fwd + bwd, summed over the packs), %s, python-stdlib\n%s" % (profile, note),
           os.path.join(argv[2], "scale_time"))
    figure(rows, "busiest_mib", "busiest rank, MiB",
           [("exact_need", "-.", "exact need (busiest rank)"),
            ("inter_need", ":", "inter-node need per link (busiest node)")],
           "Forward bytes received by the busiest rank (summed over the packs; thin dashed: "
           "inter-node only), python-stdlib\n" + note,
           os.path.join(argv[2], "scale_bytes"), second="busiest_inter_mib")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/python3
"""Where a stage of command two spent its time, from Bazel's --profile files.

Usage: scripts/bazel_profile_summary.py STAGE=PROFILE.gz [STAGE=PROFILE.gz ...]

For each stage: the summed duration of its compile, link and test actions
(action time, not wall time: two run at once on CI's 2 cores), and over all
stages the ten longest compile actions. scripts/test.sh prints this at the
end of command two, so that CI's log says what to cut when the run nears
its budget (docs/reliability.md, "Where tests run").
"""
import gzip
import json
import sys


def actions(path):
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "action processing":
            yield e["name"], e["dur"] / 1e6


def main(args):
    compiles = []
    print("%-6s %9s %9s %9s %9s" % ("stage", "compile s", "link s", "test s", "actions"))
    for arg in args:
        stage, _, path = arg.partition("=")
        try:
            acts = list(actions(path))
        except (OSError, ValueError, KeyError) as e:
            print("%-6s (no profile: %s)" % (stage, e))
            continue
        sums = {"Compiling": 0.0, "Linking": 0.0, "Testing": 0.0}
        for name, secs in acts:
            kind = name.split(" ", 1)[0]
            if kind in sums:
                sums[kind] += secs
            if kind == "Compiling":
                compiles.append((secs, stage, name.split(" ", 1)[1]))
        print("%-6s %9.0f %9.0f %9.0f %9d" % (stage, sums["Compiling"], sums["Linking"],
                                             sums["Testing"], len(acts)))
    print("the ten longest compile actions:")
    for secs, stage, name in sorted(compiles, reverse=True)[:10]:
        print("  %7.1f s  %-5s %s" % (secs, stage, name))


if __name__ == "__main__":
    main(sys.argv[1:])

#!/usr/bin/python3
"""Trains the Llama-style model of model.py context-parallel across two
hsapd "nodes" on this machine and checks it against a single-process
reference; plots both loss curves.

    /usr/bin/python3 examples/llama_cp/run.py                 # 60 steps fp32, resume, bf16
    /usr/bin/python3 examples/llama_cp/run.py --steps=8 --tokens=1024 --layers=2 --no-bf16
    /usr/bin/python3 examples/llama_cp/run.py --fault=scale   # must print CHECK FAILED

What runs (each phase bounded by --timeout-s):

1. the reference, fp32: train.py --mode=reference, one process, the whole
   pack, plain masked attention (and with bf16, the same under bf16
   autocast);
2. two hsapd (--devices=cpu:2, TCP on 127.0.0.1, UCX over tcp) and two
   `torchrun --nnodes=2 --node_rank=0|1 --nproc_per_node=2` (gloo): four
   processes, each holding only its shard (hsap.shard) of every step's pack,
   the attention of every layer a collective call across both daemons
   (hsap.nn.ContextParallelAttention); a checkpoint after step --save-at;
3. the same job resumed from that checkpoint, to the last step;
4. with bf16: the context-parallel run under bf16 autocast.

Checks (CHECK PASSED / CHECK FAILED, the exit status 0 / 1):

* fp32: every step's loss within 1e-4 relative of the reference's, and the
  first step's logits (unsharded with hsap.unshard) too: max |difference| /
  max |logit| <= 1e-4 — with identical weights, the sharp check (near
  initialisation the loss hardly depends on attention; the logits do);
  later check steps (every 10th, the last) are reported, not checked: Adam
  amplifies rounding differences between two correct runs there (its
  first updates are nearly sign(gradient) for every weight). With >= 50
  steps the loss falls by >= 40 % (step 1 against the mean of the last 5);
* resume: every resumed step's loss equals the uninterrupted run's
  (relative difference <= 1e-6);
* bf16, against a same-dtype yardstick: Y = the largest relative
  difference of the bf16 reference's loss from the fp32 reference's over
  the run (what bf16 itself does to this training); every step of the
  context-parallel bf16 run is within 2Y of the bf16 reference (if both bf16
  runs stay within Y of the fp32 one, they are within 2Y of each other),
  and so are the first step's logits (against 2x the bf16 reference's logit
  difference from fp32 there).

Console: per step of every run, its loss, tokens/s (the pack's tokens over
the step's wall time) and, for context-parallel runs, the share of the step
spent in attention calls (rank 0: Group.attention_seconds, which includes
waiting for the other ranks). At the end a table and a PNG (--png) of the
loss curves and their relative differences (matplotlib, Agg); everything
is kept in --out-dir. --reference-dir reuses reference runs of the same
configuration (the CI test runs the reference once for three jobs).
"""

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from model import add_model_args  # noqa: E402

FP32_TOLERANCE = 1e-4
RESUME_TOLERANCE = 1e-6
FALL = 0.40
MODEL_FLAGS = ("dim", "layers", "heads", "kv_heads", "ffn", "rope_theta", "tokens", "min_doc",
               "max_doc", "corpus", "lr", "warmup", "min_lr_ratio", "clip", "seed")


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def model_argv(args):
    return [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in MODEL_FLAGS]


class Jobs:
    """Child processes, each in its own session, all killed on close()."""

    def __init__(self):
        self.procs = []

    def start(self, argv, log_path, env=None, echo=None):
        log = open(log_path, "w")
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                text=True, bufsize=1)
        self.procs.append(proc)

        def pump():
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if echo and echo(line):
                    print(line, end="", flush=True)
            log.close()

        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        proc.pump = thread
        return proc

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()


def wait_all(procs, timeout_s, what):
    """Waits for every process; the first failure ends the others. Returns
    True when all exited 0."""
    deadline = time.monotonic() + timeout_s
    running = list(procs)
    ok = True
    while running:
        for p in list(running):
            rc = p.poll()
            if rc is not None:
                running.remove(p)
                if rc != 0:
                    ok = False
        if not ok or time.monotonic() > deadline:
            if ok:
                print(f"{what}: did not finish within {timeout_s} s", flush=True)
                ok = False
            for p in running:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            for p in running:
                p.wait()
            break
        time.sleep(0.05)
    for p in procs:
        p.pump.join(5)
    return ok


def show_log(path, lines=40):
    with open(path) as f:
        tail = f.readlines()[-lines:]
    print(f"--- {path} (last {len(tail)} lines)")
    print("".join(tail), end="", flush=True)


def run_reference(args, jobs, dtype, out_dir, env):
    """(records, logits path) of the reference run in `dtype`, reused from
    --reference-dir when a run of the same configuration is there."""
    key = hashlib.sha256(json.dumps([model_argv(args), args.steps, dtype]).encode()).hexdigest()
    cache = args.reference_dir
    if cache:
        os.makedirs(cache, exist_ok=True)
        cached = os.path.join(cache, f"ref-{dtype}-{key[:16]}.json")
        if os.path.exists(cached):
            print(f"reference {dtype}: reusing {cached}", flush=True)
            with open(cached) as f:
                return json.load(f), cached[:-5] + ".logits"
    out = os.path.join(out_dir, f"ref-{dtype}.json")
    logits = os.path.join(out_dir, f"ref-{dtype}.logits")
    argv = [sys.executable, os.path.join(HERE, "train.py"), "--mode=reference",
            f"--steps={args.steps}", f"--dtype={dtype}", f"--out={out}", f"--logits={logits}",
            f"--threads={args.reference_threads}"] + model_argv(args)
    log = os.path.join(out_dir, f"ref-{dtype}.log")
    started = time.monotonic()
    proc = jobs.start(argv, log, env=env, echo=lambda line: line.startswith("ref"))
    if not wait_all([proc], args.timeout_s, f"reference {dtype}"):
        show_log(log)
        raise SystemExit(f"the {dtype} reference run failed")
    print(f"reference {dtype}: {time.monotonic() - started:.1f} s", flush=True)
    if cache:
        shutil.copy(out, cached)
        shutil.copy(logits, cached[:-5] + ".logits")
    with open(out) as f:
        return json.load(f), logits


class Cluster:
    """Two hsapd on loopback, one per "node" (hsap.daemon.LocalDaemon)."""

    def __init__(self, args, env):
        from hsap.daemon import LocalDaemon
        ports = free_ports(2)
        flags = ["--host=127.0.0.1", "--cpu_threads=1", "--ucx_transports=tcp", "--insecure_peers",
                 "--heartbeat_ms=100", f"--call_deadline_ms={args.deadline_ms}"]
        self.daemons = []
        for port in ports:
            self.daemons.append(LocalDaemon(devices="cpu:2", binary=args.hsapd or None,
                                            flags=flags + [f"--port={port}"]))
        self.addresses = [f"127.0.0.1:{p}" for p in ports]
        print(f"hsapd: {self.addresses[0]} (node 0), {self.addresses[1]} (node 1), "
              f"{os.path.basename(self.daemons[0].binary)} {self.daemons[0].binary}", flush=True)

    def close(self):
        for d in self.daemons:
            d.stop()


def run_cp(args, jobs, cluster, name, out_dir, env, extra):
    """One context-parallel job (two torchruns); returns its records."""
    master_port = free_ports(1)[0]
    out = os.path.join(out_dir, f"{name}.json")
    procs, logs = [], []
    for node in range(2):
        node_env = dict(env, HSAP_SOCKET=cluster.daemons[node].socket, OMP_NUM_THREADS="1")
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                f"--node_rank={node}", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                f"--master_port={master_port}",
                # Debian's torch 1.13 on Python 3.11 cannot parse torchrun's
                # default --redirects/--tee "0" (run_context_parallel.sh).
                "--redirects=2", "--tee=2", f"--log_dir={os.path.join(out_dir, name + '-tr')}",
                os.path.join(HERE, "train.py"), "--mode=cp", f"--steps={args.steps}",
                f"--out={out}", f"--logits={os.path.join(out_dir, name + '.logits')}",
                f"--strategy={args.strategy}", f"--deadline-ms={args.deadline_ms}"]
        argv += model_argv(args) + extra
        log = os.path.join(out_dir, f"{name}-node{node}.log")
        logs.append(log)
        echo = (lambda line: line.startswith(("cp ", "group", "corpus"))) if node == 0 else None
        procs.append(jobs.start(argv, log, env=node_env, echo=echo))
    started = time.monotonic()
    ok = wait_all(procs, args.timeout_s, name)
    if not ok or not os.path.exists(out):
        for log in logs:
            show_log(log)
        for i, d in enumerate(cluster.daemons):
            print(f"--- hsapd node {i}\n{d.log()[-3000:]}")
        raise SystemExit(f"the context-parallel run {name} failed")
    print(f"{name}: {time.monotonic() - started:.1f} s", flush=True)
    with open(out) as f:
        return json.load(f)


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def logits_rel(got_path, want_path, steps):
    """{step: max |got - want| / max |want|} over the check steps."""
    import torch
    got, want = torch.load(got_path), torch.load(want_path)
    out = {}
    for s in steps:
        if s in got and s in want:
            out[s] = ((got[s] - want[s]).abs().max() / want[s].abs().max()).item()
    return out


def losses(records):
    return {r["step"]: r["loss"] for r in records["steps"]}


def plot(path, ref, cp, resumed, save_at, ref_bf16=None, cp_bf16=None, yardstick=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 8.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    steps = sorted(ref)
    top.plot(steps, [ref[s] for s in steps], "-", color="black", lw=1.5,
             label="reference fp32 (1 process, masked attention)")
    top.plot(sorted(cp), [cp[s] for s in sorted(cp)], "o", color="tab:blue", ms=3.5,
             label="hsap fp32 (4 ranks, 2 hsapd)")
    if resumed:
        top.plot(sorted(resumed), [resumed[s] for s in sorted(resumed)], "x", color="tab:green",
                 ms=5, label=f"hsap fp32 resumed from step {save_at}")
    if ref_bf16:
        top.plot(sorted(ref_bf16), [ref_bf16[s] for s in sorted(ref_bf16)], "-", color="tab:red",
                 lw=1, alpha=0.7, label="reference bf16 autocast")
    if cp_bf16:
        top.plot(sorted(cp_bf16), [cp_bf16[s] for s in sorted(cp_bf16)], "s", color="tab:orange",
                 ms=2.5, label="hsap bf16 autocast")
    top.set_ylabel("training loss (nats / byte)")
    top.legend(fontsize=8)
    top.grid(alpha=0.3)
    top.set_title("Llama-style decoder, packed stdlib bytes: hsap context parallel vs one process",
                  fontsize=9)
    floor = 1e-12

    def series(a, b):
        s = sorted(set(a) & set(b))
        return s, [max(rel(a[i], b[i]), floor) for i in s]

    x, y = series(cp, ref)
    bottom.semilogy(x, y, "o-", color="tab:blue", ms=3, lw=0.8, label="|hsap - ref| / ref, fp32")
    if resumed:
        x, y = series(resumed, cp)
        bottom.semilogy(x, y, "x", color="tab:green", ms=5,
                        label=f"|resumed - uninterrupted| / uninterrupted ({floor:g} = equal)")
    if cp_bf16 and ref_bf16:
        x, y = series(cp_bf16, ref_bf16)
        bottom.semilogy(x, y, "s-", color="tab:orange", ms=2.5, lw=0.8,
                        label="|hsap bf16 - ref bf16| / ref bf16")
        bottom.axhline(yardstick, color="tab:orange", ls="--", lw=1,
                       label=f"bf16 yardstick 2Y = {yardstick:.2g}")
    bottom.axhline(FP32_TOLERANCE, color="tab:blue", ls="--", lw=1, label="fp32 tolerance 1e-4")
    bottom.set_xlabel("step")
    bottom.set_ylabel("relative difference")
    bottom.set_ylim(floor / 3, 1.0)
    bottom.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--save-at", type=int, default=None,
                   help="checkpoint after this step and resume from it (default steps // 2; "
                   "0: no resume run)")
    p.add_argument("--no-bf16", action="store_true", help="skip the bf16 runs")
    p.add_argument("--strategy", default="auto")
    p.add_argument("--fault", choices=("", "scale", "position"), default="",
                   help="inject a fault into the context-parallel run (the check must fail)")
    p.add_argument("--out-dir", default="", help="runs, logs, summary (default: a new /tmp dir)")
    p.add_argument("--png", default="", help="the loss plot (default: OUT_DIR/llama_cp_loss.png)")
    p.add_argument("--reference-dir", default="", help="reuse reference runs kept here")
    p.add_argument("--reference-threads", type=int, default=2)
    p.add_argument("--hsapd", default="", help="the daemon binary (default: $HSAPD, Bazel's)")
    p.add_argument("--timeout-s", type=int, default=1800, help="limit of each run")
    p.add_argument("--deadline-ms", type=int, default=120000)
    args = p.parse_args()
    if args.save_at is None:
        args.save_at = args.steps // 2 if args.steps >= 2 and not args.fault else 0
    if args.steps > 0 and not 0 <= args.save_at < args.steps:
        p.error("--save-at must be in [0, steps)")
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="hsap-llama-cp-")
    os.makedirs(out_dir, exist_ok=True)
    png = args.png or os.path.join(out_dir, "llama_cp_loss.png")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    sys.path[:0] = [os.path.join(REPO, "client", "python")]  # hsap.daemon, from the source tree
    started = time.monotonic()
    jobs = Jobs()
    cluster = None
    try:
        ref, ref_logits = run_reference(args, jobs, "fp32", out_dir, env)
        ref_bf16 = ref_bf16_logits = None
        if not args.no_bf16:
            ref_bf16, ref_bf16_logits = run_reference(args, jobs, "bf16", out_dir, env)
        cluster = Cluster(args, env)
        fault = [f"--fault={args.fault}"] if args.fault else []
        save = ([f"--save-at={args.save_at}",
                 f"--checkpoint={os.path.join(out_dir, 'checkpoint.pt')}"] if args.save_at else [])
        cp = run_cp(args, jobs, cluster, "cp-fp32", out_dir, env, fault + save)
        resumed = None
        if args.save_at:
            resumed = run_cp(args, jobs, cluster, "cp-fp32-resumed", out_dir, env,
                             fault + [f"--resume={os.path.join(out_dir, 'checkpoint.pt')}"])
        cp_bf16 = None
        if not args.no_bf16:
            cp_bf16 = run_cp(args, jobs, cluster, "cp-bf16", out_dir, env,
                             fault + ["--dtype=bf16"])
    finally:
        if cluster is not None:
            cluster.close()
        jobs.close()
    wall = time.monotonic() - started
    return report(args, out_dir, png, wall, ref, ref_logits, cp, resumed, ref_bf16,
                  ref_bf16_logits, cp_bf16)


def report(args, out_dir, png, wall, ref, ref_logits, cp, resumed, ref_bf16, ref_bf16_logits,
           cp_bf16):
    failures = []
    ref_l, cp_l = losses(ref), losses(cp)
    steps = sorted(ref_l)
    print(f"\n{'step':>4} {'reference':>10} {'hsap':>10} {'rel diff':>9}"
          + (f" {'resumed':>10}" if resumed else "")
          + (f" {'ref bf16':>10} {'hsap bf16':>10} {'rel diff':>9}" if cp_bf16 else ""))
    res_l = losses(resumed) if resumed else {}
    rb, cb = (losses(ref_bf16), losses(cp_bf16)) if cp_bf16 else ({}, {})
    for s in steps:
        line = f"{s:>4} {ref_l[s]:>10.6f} {cp_l[s]:>10.6f} {rel(cp_l[s], ref_l[s]):>9.2e}"
        if resumed:
            line += f" {res_l[s]:>10.6f}" if s in res_l else f" {'':>10}"
        if cp_bf16:
            line += f" {rb[s]:>10.6f} {cb[s]:>10.6f} {rel(cb[s], rb[s]):>9.2e}"
        print(line)
    worst = max(rel(cp_l[s], ref_l[s]) for s in steps)
    checks = sorted({int(s) for s in torch_keys(os.path.join(out_dir, "cp-fp32.logits"))})
    logit = logits_rel(os.path.join(out_dir, "cp-fp32.logits"), ref_logits, checks)
    worst_logit = max(logit.values()) if logit else float("inf")
    if worst > FP32_TOLERANCE:
        failures.append(f"fp32 loss: worst relative difference {worst:.2e} > {FP32_TOLERANCE}")
    first = steps[0]
    if logit.get(first, float("inf")) > FP32_TOLERANCE:
        failures.append(f"fp32 logits of step {first}: relative difference "
                        f"{logit.get(first, float('inf')):.2e} > {FP32_TOLERANCE}")
    last = [cp_l[s] for s in steps[-5:]]
    fall = (cp_l[steps[0]] - sum(last) / len(last)) / cp_l[steps[0]]
    if len(steps) >= 50 and fall < FALL:
        failures.append(f"the loss fell by {100 * fall:.1f} %, less than {100 * FALL:.0f} %")
    summary = {"steps": len(steps), "wall_s": round(wall, 1), "fp32_worst_loss_rel": worst,
               "fp32_worst_logit_rel": worst_logit, "fp32_logit_rel": logit,
               "loss_first": cp_l[steps[0]], "loss_last5_mean": sum(last) / len(last),
               "fall": fall, "fault": args.fault,
               "cp_tokens_per_s_median": median([r["tokens_per_s"] for r in cp["steps"]]),
               "ref_tokens_per_s_median": median([r["tokens_per_s"] for r in ref["steps"]]),
               "cp_attention_share_median": median([r["attention_seconds"] / r["seconds"]
                                                    for r in cp["steps"]]),
               "calls_per_rank": cp.get("calls_per_rank"), "group": cp.get("group")}
    print(f"\nfp32: worst loss relative difference {worst:.2e} (tolerance {FP32_TOLERANCE}); "
          f"logits " + ", ".join(f"step {s}: {e:.1e}" for s, e in logit.items())
          + f" (step {first} checked, <= {FP32_TOLERANCE}); loss {cp_l[steps[0]]:.4f} -> "
          f"{sum(last) / len(last):.4f} (mean of the last 5), fell {100 * fall:.1f} %"
          + ("" if len(steps) >= 50 else " (not checked under 50 steps)"))
    if resumed:
        worst_resume = max(rel(res_l[s], cp_l[s]) for s in res_l)
        summary["resume_worst_rel"] = worst_resume
        print(f"resume from step {args.save_at}: steps {min(res_l)}-{max(res_l)}, worst relative "
              f"difference from the uninterrupted run {worst_resume:.2e} (tolerance "
              f"{RESUME_TOLERANCE})")
        if worst_resume > RESUME_TOLERANCE:
            failures.append(f"resume: worst relative difference {worst_resume:.2e}")
    yardstick = None
    if cp_bf16:
        y = max(rel(rb[s], ref_l[s]) for s in steps)
        yardstick = max(2 * y, FP32_TOLERANCE)
        worst_bf16 = max(rel(cb[s], rb[s]) for s in steps)
        bf16_logit = logits_rel(os.path.join(out_dir, "cp-bf16.logits"), ref_bf16_logits, checks)
        ref_bf16_logit = logits_rel(ref_bf16_logits, ref_logits, checks)
        logit_bad = {s: e for s, e in bf16_logit.items()
                     if s == steps[0] and e > 2 * ref_bf16_logit.get(s, 0.0)}
        summary.update(bf16_Y=y, bf16_yardstick=yardstick, bf16_worst_loss_rel=worst_bf16,
                       bf16_logit_rel=bf16_logit, ref_bf16_logit_rel_vs_fp32=ref_bf16_logit,
                       cp_bf16_tokens_per_s_median=median([r["tokens_per_s"]
                                                           for r in cp_bf16["steps"]]))
        print(f"bf16: the bf16 reference is within Y = {y:.2e} of the fp32 one; hsap bf16 is "
              f"within {worst_bf16:.2e} of the bf16 reference (yardstick 2Y = {yardstick:.2e}); logits "
              + ", ".join(f"step {s}: {e:.1e} (2x ref {2 * ref_bf16_logit[s]:.1e})"
                          for s, e in bf16_logit.items()))
        if worst_bf16 > yardstick:
            failures.append(f"bf16 loss: {worst_bf16:.2e} > yardstick {yardstick:.2e}")
        if logit_bad:
            failures.append(f"bf16 logits beyond 2x the bf16 reference's: {logit_bad}")
    print(f"context parallel: median {summary['cp_tokens_per_s_median']:.0f} tokens/s, "
          f"{100 * summary['cp_attention_share_median']:.0f} % of a step in attention; reference "
          f"(1 process, {args.reference_threads} threads): median "
          f"{summary['ref_tokens_per_s_median']:.0f} tokens/s; wall {wall:.1f} s")
    plot(png, ref_l, cp_l, res_l, args.save_at, rb or None, cb or None, yardstick)
    summary["png"] = png
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"plot: {png}; runs and logs: {out_dir}")
    for f in failures:
        print(f"FAILED: {f}")
    print("CHECK PASSED" if not failures else "CHECK FAILED", flush=True)
    return 0 if not failures else 1


def torch_keys(path):
    import torch
    return list(torch.load(path).keys())


def median(values):
    v = sorted(values)
    if not v:
        return float("nan")
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


if __name__ == "__main__":
    sys.exit(main())

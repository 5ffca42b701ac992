"""An emulated cluster on one machine: hosts in network namespaces, each with its own shaped link.

    python -m benchmarks.cluster run --hosts 4 --rate 1gbit -- \\
        sh -c 'horovodrun -np 4 -H $TFCOMP_HOSTS --gloo --network-interface eth0 python train.py'
    python -m benchmarks.cluster check     # one line: can this machine make a cluster?
    python -m benchmarks.cluster clean     # removes what a killed run left behind

Needs root. The layout (nothing touches the root namespace's network):

  - a switch: namespace `<tag>-sw` holding the bridge br0;
  - host i (1 .. N): namespace `<tag>-h<i>` with eth0 = 198.18.0.<i>/24 (the benchmarking range),
    joined to the bridge by a veth pair whose other end is port p<i> of br0;
  - each link shaped in both directions to --rate with `tc ... tbf` (host i's eth0 for what it sends,
    port p<i> for what it receives), its bucket 1 ms of the rate (`burst_seconds`), or unshaped with
    `--rate none`;
  - with `pin_cpus`, host i's processes (its sshd and all it starts) on CPU (i - 1) mod the CPUs this
    process may use, so that up to that many hosts each compute on a CPU of their own, as real hosts do;
  - one sshd per host, listening on the host's address, with a host key and a client key made for
    this cluster; host 1's ssh client config (`/etc/netns/<tag>-h1/ssh/ssh_config`, which
    `ip netns exec` mounts over /etc/ssh) logs in with that key, so `horovodrun` launched on host 1
    reaches every host over ssh, as on a real cluster;
  - a hosts file per namespace (`/etc/netns/<tag>-h<i>/hosts`) mapping the machine's hostname to the
    host's own address: every namespace shares the hostname, which otherwise resolves to 127.0.0.1,
    and Gloo would announce that address and fail with `connect [127.0.0.1]: Connection refused`.

COMMAND runs on host 1 with TFCOMP_HOSTS=198.18.0.1:1,...,198.18.0.N:1 in its environment. Whatever
happens (the command fails, an exception, SIGTERM, Ctrl-C), the namespaces, the processes in them,
the sshd processes and the /etc/netns entries are removed. `netem` is not available here, so links
have a rate but no added latency.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

__all__ = ["Cluster", "ClusterError", "cluster_unavailable_reason", "exit_unless_available", "horovodrun_executable",
           "interface_bytes", "parse_rate"]

PREFIX = "tfc-"
SUBNET = "198.18.0"
SSHD = "/usr/sbin/sshd"
NETNS_ETC = "/etc/netns"
_TBF_LATENCY = "100ms"
_MIN_BURST_BYTES = 64 * 1024  # one GSO segment of the veth links
# Each link's token bucket holds this many seconds of its rate (at least _MIN_BURST_BYTES): a transfer
# after the link idled sends that much at once. With 4 ms (a 250 Hz tick, until 2026-11-27) the times
# of 256 KiB to 16 MiB collectives at 1 and 2 Gbit/s were 36 to 69 % off an affine fit, with 1 ms 6 to
# 30 % (research/notebook.md, "The links' token bucket"; research/link_burst.py). A real NIC sends at its
# rate from the first byte.
DEFAULT_BURST_SECONDS = 1e-3
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def _checked_burst(burst_seconds) -> float:
    if isinstance(burst_seconds, bool) or not isinstance(burst_seconds, (int, float)) or not 0 < burst_seconds <= 1:
        raise ValueError(f"burst_seconds: {burst_seconds!r} is not a number of seconds in (0, 1]")
    return float(burst_seconds)


class ClusterError(RuntimeError):
    """The emulated cluster could not be brought up."""


def interface_bytes(device: str = "eth0", proc_net_dev: str = "/proc/net/dev") -> int:
    """Received plus transmitted bytes of `device` so far, in this network namespace."""
    with open(proc_net_dev, encoding="ascii") as f:
        lines = f.read().splitlines()
    for line in lines:
        name, _, counters = line.partition(":")
        if name.strip() == device:
            fields = counters.split()
            return int(fields[0]) + int(fields[8])
    raise RuntimeError(f"no interface {device!r} in {proc_net_dev}")


def parse_rate(rate) -> float | None:
    """Bits per second of a link rate such as '1gbit', '500mbit' or '2.5Gbit/s'; None for 'none' or
    None (unshaped)."""
    if rate is None or str(rate).lower() == "none":
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?bit)(?:/s)?\s*", str(rate).lower())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"--rate: {rate!r} is not a link rate such as 1gbit, 500mbit, 10gbit or none")
    return float(match.group(1)) * _RATE_UNITS[match.group(2)]


def _sh(*command, namespace=None, check=True) -> subprocess.CompletedProcess:
    if namespace:
        command = ("ip", "netns", "exec", namespace, *command)
    done = subprocess.run(command, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise ClusterError(f"`{' '.join(command)}` failed: {done.stderr.strip() or done.stdout.strip()}")
    return done


def cluster_unavailable_reason() -> str | None:
    """None when this machine can make a cluster; otherwise one line saying why not."""
    if os.geteuid() != 0:
        return "the emulated cluster needs root (network namespaces, tc, sshd): run it as root"
    for tool in ("ip", "tc", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"the emulated cluster needs `{tool}` (make setup installs iproute2 and openssh)"
    if not os.access(SSHD, os.X_OK):
        return f"the emulated cluster needs {SSHD} (Debian's openssh-server; make setup installs it)"
    probe = f"{PREFIX}probe-{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"cannot create a network namespace here: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


def exit_unless_available(benchmark: str) -> None:
    """Exits with "<benchmark>: <why>" where this machine cannot make a cluster."""
    reason = cluster_unavailable_reason()
    if reason:
        sys.exit(f"{benchmark}: {reason}")


def _namespaces() -> list:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def _kill_namespace_processes(namespace: str) -> None:
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), sig)
                alive.append(pid)
        if not alive:
            return
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in alive):
            time.sleep(0.05)
        pids = [p for p in alive if os.path.exists(f"/proc/{p}")]


def _remove_namespaces(names) -> None:
    for name in names:
        _kill_namespace_processes(name)
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        shutil.rmtree(os.path.join(NETNS_ETC, name), ignore_errors=True)


def clean(prefix: str = PREFIX) -> list:
    """Removes every namespace (with its processes and /etc/netns entry) whose name starts with
    `prefix`, and /etc/netns entries left without a namespace. Returns the names removed."""
    names = [n for n in _namespaces() if n.startswith(prefix)]
    if os.path.isdir(NETNS_ETC):
        names += [n for n in os.listdir(NETNS_ETC) if n.startswith(prefix) and n not in names]
    _remove_namespaces(names)
    return names


def _terminate_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


class Cluster:
    """`hosts` emulated hosts with links of `rate` ('1gbit', ...; None or 'none': unshaped) whose token
    buckets hold `burst_seconds` of the rate, each host's processes on one CPU of its own where
    `pin_cpus` (`cpus[i]` is host i + 1's; None unpinned).

        with Cluster(hosts=4, rate="1gbit") as cluster:
            cluster.run(cluster.horovodrun_args() + ["python", "train.py"])
            cluster.set_rate("10gbit")

    Entering brings the cluster up (and tears down what it made if that fails); leaving tears it
    down. While it is up, SIGTERM raises SystemExit so the teardown runs."""

    def __init__(self, hosts: int, rate=None, pin_cpus: bool = False, burst_seconds: float = DEFAULT_BURST_SECONDS):
        if not isinstance(hosts, int) or not 1 <= hosts <= 250:
            raise ValueError(f"hosts: {hosts!r} is not a number of hosts from 1 to 250")
        if not isinstance(pin_cpus, bool):
            raise ValueError(f"pin_cpus: {pin_cpus!r} is not True or False")
        self.burst_seconds = _checked_burst(burst_seconds)
        self.count = hosts
        usable = sorted(os.sched_getaffinity(0))
        self.cpus = [usable[i % len(usable)] for i in range(hosts)] if pin_cpus else None
        self.rate_bits = parse_rate(rate)
        self.tag = f"{PREFIX}{os.getpid()}"
        self.switch = f"{self.tag}-sw"
        self.names = [f"{self.tag}-h{i}" for i in range(1, hosts + 1)]
        self.addresses = [f"{SUBNET}.{i}" for i in range(1, hosts + 1)]
        self.hosts = ",".join(f"{a}:1" for a in self.addresses)
        self._tmp = None
        self._previous_sigterm = None

    # Bringing up and down.
    def __enter__(self) -> "Cluster":
        reason = cluster_unavailable_reason()
        if reason:
            raise ClusterError(reason)
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, _terminate_on_sigterm)
        try:
            self._up()
        except BaseException:
            self._down()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self._down()

    def _up(self) -> None:
        self._tmp = tempfile.mkdtemp(prefix=f"{self.tag}-")
        _sh("ip", "netns", "add", self.switch)
        _sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        hostname = socket.gethostname()
        for i, (name, address) in enumerate(zip(self.names, self.addresses), 1):
            _sh("ip", "netns", "add", name)
            _sh("ip", "link", "add", "eth0", "netns", name, "type", "veth", "peer", "name", f"p{i}", "netns", self.switch)
            _sh("ip", "-n", self.switch, "link", "set", f"p{i}", "master", "br0")
            _sh("ip", "-n", self.switch, "link", "set", f"p{i}", "up")
            _sh("ip", "-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
            _sh("ip", "-n", name, "link", "set", "eth0", "up")
            _sh("ip", "-n", name, "link", "set", "lo", "up")
            etc = os.path.join(NETNS_ETC, name)
            os.makedirs(etc, exist_ok=True)
            with open(os.path.join(etc, "hosts"), "w") as f:
                f.write(f"127.0.0.1 localhost\n{address} {hostname}\n")
        self.set_rate(self.rate_bits)
        self._start_sshd()

    def _start_sshd(self) -> None:
        keys = os.path.join(self._tmp, "keys")
        os.makedirs(keys, mode=0o700)
        for key in ("host_key", "client_key"):
            _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.tag, "-f", os.path.join(keys, key))
        shutil.copy(os.path.join(keys, "client_key.pub"), os.path.join(keys, "authorized_keys"))
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
        for i, (name, address) in enumerate(zip(self.names, self.addresses)):
            _sh(*self._pinned(i), SSHD, "-f", "/dev/null", "-h", os.path.join(keys, "host_key"),
                "-o", f"ListenAddress={address}", "-o", f"PidFile={os.path.join(self._tmp, name + '.sshd.pid')}",
                "-o", f"AuthorizedKeysFile={os.path.join(keys, 'authorized_keys')}", "-o", "StrictModes=no",
                "-o", "PasswordAuthentication=no", "-o", "PermitRootLogin=prohibit-password", "-o", "UsePAM=no",
                "-o", "MaxStartups=100", "-o", "MaxSessions=100", namespace=name)
        # Host 1 launches: its ssh client logs in to every host with the cluster's key.
        ssh_etc = os.path.join(NETNS_ETC, self.names[0], "ssh")
        os.makedirs(ssh_etc, exist_ok=True)
        with open(os.path.join(ssh_etc, "ssh_config"), "w") as f:
            f.write(f"Host {SUBNET}.*\n  IdentityFile {os.path.join(keys, 'client_key')}\n"
                    "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
                    "  BatchMode yes\n  ConnectTimeout 10\n")
        for address in self.addresses:
            self._wait_for_ssh(address)

    def _pinned(self, host_index: int) -> list:
        """The prefix that runs a command on the CPU of host `host_index` + 1 (none unpinned)."""
        return ["taskset", "-c", str(self.cpus[host_index])] if self.cpus else []

    def _wait_for_ssh(self, address: str) -> None:
        deadline = time.monotonic() + 20.0
        while True:
            done = _sh("ssh", address, "true", namespace=self.names[0], check=False)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"ssh from host 1 to {address} does not work: {done.stderr.strip()}")
            time.sleep(0.2)

    def _down(self) -> None:
        _remove_namespaces([*self.names, self.switch])
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    # Using it.
    def set_rate(self, rate, burst_seconds: float | None = None) -> None:
        """Shapes every link, both directions, to `rate` (a string such as '10gbit', or bits per
        second; None or 'none': unshaped), in place, with a token bucket of `burst_seconds` of the
        rate (None: the cluster's `burst_seconds`, which this sets)."""
        if burst_seconds is not None:
            self.burst_seconds = _checked_burst(burst_seconds)
        bits = rate if isinstance(rate, (int, float)) or rate is None else parse_rate(rate)
        for i, name in enumerate(self.names, 1):
            for namespace, device in ((name, "eth0"), (self.switch, f"p{i}")):
                if bits is None:
                    _sh("tc", "qdisc", "del", "dev", device, "root", namespace=namespace, check=False)
                else:
                    burst = max(_MIN_BURST_BYTES, int(bits / 8 * self.burst_seconds))
                    _sh("tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", f"{int(bits)}bit",
                        "burst", str(burst), "latency", _TBF_LATENCY, namespace=namespace)
        self.rate_bits = bits

    def horovodrun_args(self, np: int | None = None) -> list:
        """`horovodrun` on the first `np` hosts (default all), one slot each, Gloo, the hosts' eth0.
        Only those hosts are listed: given more slots than -np, horovodrun 0.28.1 with Gloo starts
        a worker on every slot listed (measured: -np 2 with 4 hosts listed ran 4 workers)."""
        count = np or self.count
        if not 1 <= count <= self.count:
            raise ClusterError(f"np must be in [1, {self.count}] (the cluster's hosts), got {np!r}")
        hosts = ",".join(f"{a}:1" for a in self.addresses[:count])
        return [horovodrun_executable(), "-np", str(count), "-H", hosts, "--gloo", "--network-interface", "eth0"]

    def run(self, command: list, env: dict | None = None, timeout: float | None = None,
            capture: bool = False) -> subprocess.CompletedProcess:
        """Runs `command` on host 1 with TFCOMP_HOSTS set (and `env` added). On a timeout the
        command and everything it started in the cluster is killed and TimeoutExpired raised."""
        if self._tmp is None:
            raise ClusterError("the cluster is not up: use it inside `with Cluster(...) as cluster:`")
        full_env = dict(os.environ, TFCOMP_HOSTS=self.hosts, **(env or {}))
        process = subprocess.Popen(["ip", "netns", "exec", self.names[0], *self._pinned(0), *command], env=full_env,
                                   stdout=subprocess.PIPE if capture else None,
                                   stderr=subprocess.PIPE if capture else None, text=True,
                                   start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            for name in self.names:  # the workers started over ssh
                _kill_namespace_processes_except_sshd(name, self._tmp)
            process.wait()
            raise
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    def run_json(self, command: list, json_flag: str, label: str, env: dict | None = None,
                 timeout: float | None = None):
        """Runs `command` (a worker that writes its findings as JSON to the path given by
        `json_flag`, e.g. "--json_out", appended here) as `run` does, and returns what it wrote. A
        non-zero exit or no file is a RuntimeError naming `label`, with the tails of its output."""
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "run.json")
            done = self.run([*command, f"{json_flag}={out}"], env=env, timeout=timeout, capture=True)
            if done.returncode != 0 or not os.path.exists(out):
                raise RuntimeError(f"{label} failed (exit {done.returncode}):\n"
                                   f"{(done.stdout or '')[-3000:]}{(done.stderr or '')[-3000:]}")
            with open(out) as f:
                return json.load(f)


def horovodrun_executable() -> str:
    """horovodrun next to this Python (the virtual environment's, also where it is not activated),
    else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return beside if os.path.exists(beside) else "horovodrun"


def _kill_namespace_processes_except_sshd(namespace: str, tmp: str) -> None:
    keep = set()
    with contextlib.suppress(OSError):
        with open(os.path.join(tmp, f"{namespace}.sshd.pid")) as f:
            keep.add(f.read().strip())
    for pid in subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split():
        if pid not in keep:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cluster", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="action", required=True)
    run = commands.add_parser("run", help="bring up a cluster, run COMMAND on host 1, tear it down")
    run.add_argument("--hosts", type=int, required=True, help="number of hosts (one slot each)")
    run.add_argument("--rate", required=True, help="link rate per host and direction: 1gbit, 500mbit, ... or none")
    run.add_argument("--pin_cpus", action="store_true", help="run host i on CPU (i - 1) mod the CPUs usable")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    commands.add_parser("check", help="say in one line whether a cluster can be made here")
    commands.add_parser("clean", help="remove namespaces and files a killed run left behind")
    args = parser.parse_args(argv)
    reason = cluster_unavailable_reason()
    if args.action == "check":
        print(reason or "the emulated cluster can be made here")
        return 1 if reason else 0
    if reason:
        print(f"cluster: {reason}", file=sys.stderr)
        return 2
    if args.action == "clean":
        removed = clean()
        print(f"removed {', '.join(removed)}" if removed else "nothing to remove")
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("run: give the command after --")
    try:
        parse_rate(args.rate)
        with Cluster(hosts=args.hosts, rate=args.rate, pin_cpus=args.pin_cpus) as cluster:
            return cluster.run(command).returncode
    except (ValueError, ClusterError) as error:
        print(f"cluster: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("cluster: interrupted; torn down", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

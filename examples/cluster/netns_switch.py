#!/usr/bin/env python3
"""The network between netns_cluster.sh's hosts: a switch with netem-like links, in user space.

Each host (a network namespace) gets one TUN device, `net0`, with its address in 198.18.0.0/24.
This process holds the other end of every TUN device and forwards IPv4 packets between hosts by
destination address, after applying the sending host's link settings:

  delay D, jitter J   the packet is delivered D + uniform(-J, +J) ms after it was sent (like
                      `tc netem delay D J`); packets between two hosts keep their order (as netem
                      with a rate does): jitter delays, it does not reorder
  loss L              each packet is dropped with probability L (like `netem loss L%`)
  cut                 every packet from or to the host (or only between two hosts) is dropped,
                      silently: no FIN, no RST, no ICMP; TCP on both sides just sees silence
                      (like `netem loss 100%` on both ends of a link)

Why user space: netem (sch_netem) and the gact drop action are kernel options, and kernels built
without them (such as the CI machine's) cannot shape or cut a veth. TUN is almost always there,
and a TUN device hands over complete packets (no offloaded checksums or GSO), so forwarding them
is a plain read and write.

Control: one command per line on the FIFO given with --ctl, each starting with a sequence number;
after applying it the switch writes "SEQ EPOCH_SECONDS" to the --ack file (atomic rename), so a
caller knows when (wall clock) it took effect:

  SEQ shape HOST|all DELAY_MS JITTER_MS LOSS_PERCENT
  SEQ cut HOST [PEER]        SEQ heal HOST [PEER]        SEQ heal all
  SEQ stats                  (writes --stats as JSON: per host packets sent, delivered, lost,
                              dropped by a cut, dropped on a full queue)
  SEQ quit

Standard library only. Started by netns_cluster.sh inside the cluster's own "sw" namespace.
"""
import argparse
import errno
import fcntl
import heapq
import json
import os
import random
import selectors
import signal
import struct
import subprocess
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000


class Stop(Exception):
    """SIGTERM or SIGINT: leave the loop (a handler that returns would let select() go on)."""


class Host:
    def __init__(self, index, name, netns, ip):
        self.index = index
        self.name = name
        self.netns = netns
        self.ip = ip
        self.ip_bytes = bytes(int(x) for x in ip.split("."))
        self.fd = -1
        self.delay = 0.0  # seconds
        self.jitter = 0.0  # seconds
        self.loss = 0.0  # probability
        self.cut = False
        self.sent = 0  # packets this host sent
        self.delivered = 0  # packets delivered to this host
        self.lost = 0  # packets this host sent that the loss setting dropped
        self.cut_drops = 0  # packets from or to this host dropped by a cut
        self.queue_drops = 0  # packets to this host dropped because its queue was full


def open_tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def run(*cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


class Switch:
    def __init__(self, hosts, ctl, ack, stats, seed):
        self.hosts = hosts
        self.by_name = {h.name: h for h in hosts}
        self.by_ip = {h.ip_bytes: h for h in hosts}
        self.ctl_path = ctl
        self.ack_path = ack
        self.stats_path = stats
        self.cut_pairs = set()  # frozenset({a, b}) of host names
        self.rng = random.Random(seed)
        self.queue = []  # (due, seq, src, dst, packet)
        self.seq = 0
        self.last_due = {}  # (src index, dst index) -> due time of the last queued packet
        self.running = True
        self.buffer = b""

    def setup(self):
        # Create every TUN device here (the switch's namespace), then move it into its host,
        # rename it net0, give it its address and bring it and the host's loopback up.
        for h in self.hosts:
            dev = "csn%d" % h.index
            h.fd = open_tun(dev)
            run("ip", "link", "set", "dev", dev, "netns", h.netns)
            run("ip", "-n", h.netns, "link", "set", "dev", dev, "name", "net0")
            run("ip", "-n", h.netns, "addr", "add", h.ip + "/24", "dev", "net0")
            run("ip", "-n", h.netns, "link", "set", "dev", "net0", "up")
            run("ip", "-n", h.netns, "link", "set", "dev", "lo", "up")

    def now(self):
        return time.monotonic()

    def blocked(self, a, b):
        return a.cut or b.cut or frozenset((a.name, b.name)) in self.cut_pairs

    def on_packet(self, src, packet):
        src.sent += 1
        if len(packet) < 20 or packet[0] >> 4 != 4:
            return  # IPv4 only (the hosts have no IPv6 addresses to talk with)
        dst = self.by_ip.get(packet[16:20])
        if dst is None or dst is src:
            return
        if self.blocked(src, dst):
            src.cut_drops += 1
            return
        if src.loss > 0 and self.rng.random() < src.loss:
            src.lost += 1
            return
        delay = src.delay
        if src.jitter > 0:
            delay += self.rng.uniform(-src.jitter, src.jitter)
        if delay <= 0 and not self.queue:
            self.deliver(src, dst, packet)
            return
        key = (src.index, dst.index)
        due = max(self.now() + max(0.0, delay), self.last_due.get(key, 0.0))
        self.last_due[key] = due
        self.seq += 1
        heapq.heappush(self.queue, (due, self.seq, src, dst, packet))

    def deliver(self, src, dst, packet):
        if self.blocked(src, dst):  # cut while the packet was on the wire
            src.cut_drops += 1
            return
        try:
            os.write(dst.fd, packet)
            dst.delivered += 1
        except BlockingIOError:
            dst.queue_drops += 1
        except OSError as e:
            if e.errno not in (errno.EIO, errno.EINVAL):
                raise
            dst.queue_drops += 1  # the device is down (a host torn down)

    def flush_due(self):
        now = self.now()
        while self.queue and self.queue[0][0] <= now:
            _, _, src, dst, packet = heapq.heappop(self.queue)
            self.deliver(src, dst, packet)

    def hosts_of(self, target):
        if target == "all":
            return list(self.hosts)
        if target not in self.by_name:
            raise ValueError("unknown host " + target)
        return [self.by_name[target]]

    def command(self, line):
        words = line.split()
        if not words:
            return
        seq, words = words[0], words[1:]
        try:
            if not words:
                raise ValueError("empty command")
            op, args = words[0], words[1:]
            if op == "shape" and len(args) == 4:
                for h in self.hosts_of(args[0]):
                    h.delay = float(args[1]) / 1000
                    h.jitter = min(float(args[2]) / 1000, h.delay)
                    h.loss = float(args[3]) / 100
            elif op == "cut" and len(args) == 1:
                for h in self.hosts_of(args[0]):
                    h.cut = True
            elif op == "cut" and len(args) == 2:
                self.hosts_of(args[0]), self.hosts_of(args[1])
                self.cut_pairs.add(frozenset(args))
            elif op == "heal" and len(args) == 1:
                for h in self.hosts_of(args[0]):
                    h.cut = False
                if args[0] == "all":
                    self.cut_pairs.clear()
                else:
                    self.cut_pairs = {p for p in self.cut_pairs if args[0] not in p}
            elif op == "heal" and len(args) == 2:
                self.cut_pairs.discard(frozenset(args))
            elif op == "stats":
                self.write_stats()
            elif op == "quit":
                self.running = False
            else:
                raise ValueError("bad command: " + " ".join(words))
            status = "ok"
        except ValueError as e:
            status = "error " + str(e)
        print("switch: %s -> %s" % (line, status), flush=True)
        self.write_ack(seq, status)

    def write_ack(self, seq, status):
        tmp = self.ack_path + ".tmp"
        with open(tmp, "w") as f:
            f.write("%s %.6f %s\n" % (seq, time.time(), status))
        os.rename(tmp, self.ack_path)

    def write_stats(self):
        out = {
            h.name: {
                "sent": h.sent, "delivered": h.delivered, "lost": h.lost,
                "cut_drops": h.cut_drops, "queue_drops": h.queue_drops,
                "delay_ms": h.delay * 1000, "jitter_ms": h.jitter * 1000,
                "loss_percent": h.loss * 100, "cut": h.cut,
            }
            for h in self.hosts
        }
        out["_cut_pairs"] = sorted(sorted(p) for p in self.cut_pairs)
        tmp = self.stats_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
        os.rename(tmp, self.stats_path)

    def on_ctl(self, fd):
        while True:
            try:
                data = os.read(fd, 4096)
            except BlockingIOError:
                break
            if not data:
                break
            self.buffer += data
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            self.command(line.decode(errors="replace").strip())

    def serve(self):
        if not os.path.exists(self.ctl_path):
            os.mkfifo(self.ctl_path, 0o600)
        # Read-write: the FIFO never reports end of file when a writer goes away.
        ctl = os.open(self.ctl_path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        sel = selectors.DefaultSelector()
        sel.register(ctl, selectors.EVENT_READ, None)
        for h in self.hosts:
            sel.register(h.fd, selectors.EVENT_READ, h)
        self.write_ack("0", "ready")
        while self.running:
            timeout = None
            if self.queue:
                timeout = max(0.0, self.queue[0][0] - self.now())
            for key, _ in sel.select(timeout):
                if key.data is None:
                    self.on_ctl(ctl)
                    continue
                src = key.data
                for _ in range(64):  # a burst per wake-up, fair to the other hosts
                    try:
                        packet = os.read(src.fd, 65536)
                    except BlockingIOError:
                        break
                    except OSError as e:
                        if e.errno in (errno.EIO, errno.EBADFD):
                            break
                        raise
                    self.on_packet(src, packet)
            self.flush_due()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", action="append", default=[], metavar="NAME=NETNS=IP",
                   help="one host (repeat)")
    p.add_argument("--ctl", required=True, help="control FIFO (created if missing)")
    p.add_argument("--ack", required=True, help="file for acknowledgements")
    p.add_argument("--stats", required=True, help="file for statistics (JSON)")
    p.add_argument("--seed", type=int, default=1, help="seed of the loss and jitter draws")
    a = p.parse_args()
    hosts = []
    for i, spec in enumerate(a.host):
        name, netns, ip = spec.split("=")
        hosts.append(Host(i, name, netns, ip))
    sw = Switch(hosts, a.ctl, a.ack, a.stats, a.seed)

    def stop(*_):
        raise Stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        sw.setup()
    except (OSError, subprocess.CalledProcessError) as e:
        print("switch: cannot set up the TUN devices: %s" % e, file=sys.stderr, flush=True)
        return 1
    except Stop:
        return 1
    print("switch: %d hosts up" % len(hosts), flush=True)
    try:
        sw.serve()
    except Stop:
        pass
    sw.write_stats()
    return 0


if __name__ == "__main__":
    sys.exit(main())

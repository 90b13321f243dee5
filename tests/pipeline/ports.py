"""Loopback ports for stages whose address a deployment file names before they start.

A port the kernel hands out for bind(0) comes from the ephemeral range, the same range
every outgoing connection of the parallel suite draws from; between closing the probe socket
and the stage binding the port, another test's client may take it (seen in CI as "the port is
in use").  Ports below that range are never given out implicitly, so only another test picking
the same random port in the same instant could collide, and each pick is checked by binding.
"""
import random
import socket


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n):
    low, high = 10000, max(_ephemeral_low(), 10000 + n + 1)
    chosen = []
    for _ in range(1000):
        port = random.randrange(low, high)
        if port in chosen:
            continue
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            s.close()
        chosen.append(port)
        if len(chosen) == n:
            return chosen
    raise RuntimeError(f"no {n} free loopback ports between {low} and {high}")

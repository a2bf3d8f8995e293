"""redis-py's `Redis` and `RedisCluster` against a RowanKV cluster of processes
whose servers are Redis Cluster nodes (`resp.redirect = "moved"`).

Run by `scripts/redis-py-test`, which starts the cluster (`scripts/cluster up
--redirect moved`) and passes it in ROWANKV_RESP_PORTS and ROWANKV_SERVER_PIDS,
in the same order. Exits non-zero at the first check that does not hold.
"""

import os
import signal
import sys
import time

import redis
from redis.cluster import ClusterNode, RedisCluster

PORTS = [int(p) for p in os.environ["ROWANKV_RESP_PORTS"].split()]
PIDS = [int(p) for p in os.environ["ROWANKV_SERVER_PIDS"].split()]


def check(holds, what):
    if not holds:
        print(f"redis-py test FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def main():
    check(len(PORTS) == len(PIDS) == 3, f"three servers: ports {PORTS}, pids {PIDS}")
    rc = RedisCluster(
        startup_nodes=[ClusterNode("127.0.0.1", p) for p in PORTS],
        decode_responses=True,
    )
    primaries = sorted(n.port for n in rc.get_primaries())
    check(primaries == sorted(PORTS), f"every server leads slots: {primaries}")

    # SET, GET, DEL.
    check(rc.set("py:a", "1") is True, "SET")
    check(rc.get("py:a") == "1", "GET after SET")
    check(rc.delete("py:a") == 1, "DEL of a live key")
    check(rc.get("py:a") is None, "GET after DEL")

    # MGET: one slot (a hash tag) atomically, many slots through the client.
    check(rc.mset({"{py}.x": "1", "{py}.y": "2"}) is True, "MSET in one slot")
    got = rc.mget("{py}.x", "{py}.y", "{py}.z")
    check(got == ["1", "2", None], f"MGET in one slot: {got}")
    keys = {f"py:k{i}": str(i) for i in range(200)}
    for k, v in keys.items():
        check(rc.set(k, v) is True, f"SET {k}")
    got = rc.mget_nonatomic(list(keys))
    check(got == list(keys.values()), "MGET over many slots")
    try:
        rc.execute_command("MSET", "py:k1", "a", "py:k2", "b", target_nodes=rc.get_node_from_key("py:k1"))
        check(False, "MSET over two slots was accepted")
    except redis.exceptions.ResponseError as e:
        check(
            type(e).__name__ in ("ClusterCrossSlotError", "MovedError") or "CROSSSLOT" in str(e),
            f"MSET over two slots: {e!r}",
        )

    # INCR: a read-modify-write at the key's primary.
    for _ in range(10):
        rc.incr("py:counter")
    check(rc.get("py:counter") == "10", "INCR ten times")

    # Expiry: TTL of a key without one, EXPIRE and TTL, SET EX, PERSIST, and a
    # key that expires for real. The expiry time is in the value's log entry.
    check(rc.ttl("py:k1") == -1, "TTL of a key without expiry")
    check(rc.ttl("py:nothing") == -2, "TTL of a missing key")
    check(rc.set("py:ttl", "t") is True and rc.expire("py:ttl", 100) is True, "EXPIRE")
    ttl = rc.ttl("py:ttl")
    check(98 <= ttl <= 100, f"TTL after EXPIRE 100: {ttl}")
    check(rc.persist("py:ttl") is True and rc.ttl("py:ttl") == -1, "PERSIST")
    check(rc.set("py:ex", "gone soon", px=600) is True, "SET PX")
    pttl = rc.pttl("py:ex")
    check(0 < pttl <= 600, f"PTTL after SET PX 600: {pttl}")
    check(rc.get("py:ex") == "gone soon", "GET before the expiry")
    time.sleep(0.8)
    check(rc.get("py:ex") is None, "GET after the expiry")
    check(rc.ttl("py:ex") == -2, "TTL after the expiry")
    check(rc.set("py:ex", "claimed", nx=True) is True, "SET NX over an expired key")
    # An expiry that must outlive the failover below.
    check(rc.set("{py:k1}.ttl", "kept", ex=3600) is True, "SET EX 3600")

    # SCAN over every primary: each key once.
    found = list(rc.scan_iter(match="py:k*", count=50))
    check(sorted(found) == sorted(keys), f"SCAN found {len(found)} keys, {len(set(found))} distinct, of {len(keys)}")

    # A plain client on the key's primary; MOVED from another server.
    owner = rc.get_node_from_key("py:k1").port
    plain = redis.Redis(port=owner, decode_responses=True)
    check(plain.get("py:k1") == "1", "a plain client on the key's primary")
    other = next(p for p in PORTS if p != owner)
    try:
        redis.Redis(port=other).get("py:k1")
        check(False, "a server that does not lead the key served it")
    except redis.exceptions.ResponseError as e:
        check(type(e).__name__ == "MovedError" or "MOVED" in str(e), f"not MOVED: {e!r}")

    # Failover: kill -9 the primary of py:k1 and keep using the client.
    victim = PIDS[PORTS.index(owner)]
    os.kill(victim, signal.SIGKILL)
    killed = time.time()
    last = None
    while True:
        try:
            if rc.get("py:k1") == "1":
                break
        except (redis.exceptions.RedisError, OSError) as e:
            last = e
        check(time.time() - killed < 30, f"py:k1 not served within 30 s of the kill: {last!r}")
        time.sleep(0.1)
    served_after = time.time() - killed
    new_owner = rc.get_node_from_key("py:k1").port
    check(new_owner != owner, f"the slot is still led by the killed server {owner}")
    for k, v in keys.items():
        got = rc.get(k)
        check(got == v, f"{k} after the failover: {got!r}, not {v!r}")
    check(rc.get("py:counter") == "10", "the counter after the failover")
    ttl = rc.ttl("{py:k1}.ttl")
    check(3500 <= ttl <= 3600, f"a TTL after the failover: {ttl}")
    check(rc.set("py:after", "yes") is True and rc.get("py:after") == "yes", "writes after the failover")
    found = list(rc.scan_iter(match="py:k*", count=50))
    check(sorted(found) == sorted(keys), f"SCAN after the failover found {len(found)}")
    print(
        f"redis-py {redis.__version__} test passed: RedisCluster and Redis, {len(keys)} keys; "
        f"py:k1 served again {served_after:.2f} s after kill -9 of its primary (port {owner} -> {new_owner})"
    )


if __name__ == "__main__":
    main()

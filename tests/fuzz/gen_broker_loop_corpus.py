#!/usr/bin/env python3
"""Writes the seed corpus of tests/fuzz/fuzz_broker_loop.c (not part of the
build; run it again when the input format there changes):

    tests/fuzz/gen_broker_loop_corpus.py tests/fuzz/corpus/fuzz_broker_loop

Each seed is byte 0 (flags), then ops: a send op is a control byte
(op << 5 | 0x10 for connection B | number of fds), one kind byte per fd, a
2-byte big-endian length and the bytes; a plant op is 0xc0 and a parameter
byte; a tick is 0xe0 (0xe1: after time has passed).
The frames are Ferry__Broker__Request messages (proto/broker.proto),
encoded by hand: proto2 wire format is varints and length-delimited fields.
"""
import os
import sys

# Flags (byte 0) and kinds: the FL_* and enum fd_kind of fuzz_broker_loop.c.
(FL_SMALL_BUF, FL_LAZY, FL_TIGHT_NOFILE, FL_NO_RULE, FL_UNGATED, FL_TWO_CONNS, FL_B_TENANT,
 FL_IDLE_TIMEOUT) = (1 << i for i in range(8))
(K_DEVNULL, K_PIPE_R, K_PIPE_W, K_SOCK, K_SOCK_INFLIGHT, K_SOCK_SELF,
 K_SOCK_FUSE_INFLIGHT, K_SOCK_DGRAM, K_EVENTFD, K_MEMFD, K_MEMFD_APPEND, K_OPATH,
 K_DIR, K_FILE, K_FILE_RDONLY, K_FILE_APPEND, K_FILE_LINKED, K_FILE_NOBODY,
 K_TMPFILE, K_FUSE, K_FUSE_RDONLY, K_PIDFD) = range(22)
OP_SEND, OP_SEND_NOPUMP, OP_PLANT, OP_TICK = 0, 5, 6, 7
CTL_TO_B, TICK_AGED = 0x10, 0x01
# plant(): bits 0-1 slot (mount id slot+1, name "m<slot>"), 2 made,
# 3 adopted, 4 /dev/fuse fd, 5-6 backing ids, 7 the tenant's (uid 65534).
P_MADE, P_ADOPTED, P_FUSE, P_TENANT = 0x04, 0x08, 0x10, 0x80


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_varint(num, v):
    return varint(num << 3) + varint(v)


def f_bytes(num, b):
    if isinstance(b, str):
        b = b.encode()
    return varint(num << 3 | 2) + varint(len(b)) + b


def request(rid, body_field, body, version=1):
    return f_varint(1, version) + f_varint(2, rid) + f_bytes(body_field, body)


def frame(payload):
    return len(payload).to_bytes(4, "big") + payload


def status(rid):
    return frame(request(rid, 8, b""))


def mount(rid, name, options=()):
    return frame(request(rid, 3, f_bytes(1, name) + b"".join(f_bytes(2, o) for o in options)))


def umount_name(rid, name):
    return frame(request(rid, 4, f_bytes(1, name)))


def umount_id(rid, mount_id):
    return frame(request(rid, 4, f_varint(2, mount_id)))


def attach(rid, name):
    return frame(request(rid, 5, f_bytes(1, name)))


def backing_open(rid, mount_id):
    return frame(request(rid, 6, f_varint(1, mount_id)))


def backing_close(rid, mount_id, backing_id):
    return frame(request(rid, 7, f_varint(1, mount_id) + f_varint(2, backing_id)))


def backing_open_many(rid, mount_id):
    return frame(request(rid, 10, f_varint(1, mount_id)))


def backing_close_many(rid, mount_id, ids):
    packed = b"".join(varint(i) for i in ids)
    return frame(request(rid, 11, f_varint(1, mount_id) + f_bytes(2, packed)))


def send(data, kinds=(), op=OP_SEND, to_b=False):
    ctl = op << 5 | len(kinds) | (CTL_TO_B if to_b else 0)
    return bytes([ctl]) + bytes(kinds) + len(data).to_bytes(2, "big") + data


def plant(param):
    return bytes([OP_PLANT << 5, param])


def tick(aged=False):
    return bytes([OP_TICK << 5 | (TICK_AGED if aged else 0)])


def seed(flags, *ops):
    return bytes([flags]) + b"".join(ops)


SEEDS = {
    "status": seed(0, send(status(1)), send(status(2) + status(3))),
    # Requests refused on their merits (the connection goes on), then one
    # malformed (it ends).
    "mount": seed(0, send(status(1)), send(mount(2, "m0")),
                  send(mount(3, "a/b", ["default_permissions", "max_read=131072", "fsname=ferry",
                                        "subtype=ferry", "ro", "noatime"])),
                  send(mount(4, "m0", ["allow_other"])), send(mount(5, "m0", ["fd=3"]))),
    "mount-with-fd": seed(0, send(mount(1, "m0"), [K_FUSE])),
    "no-mount": seed(0, send(umount_name(1, "m0")), send(umount_id(2, 7)),
                     send(backing_open(3, 1), [K_FILE]), send(backing_close(4, 1, 1))),
    "attach": seed(0, send(attach(1, "m0"), [K_FUSE]), send(attach(2, "m1"), [K_DEVNULL])),
    # Planted mounts: the handlers' table paths.
    "planted-umount": seed(0, plant(P_MADE | P_FUSE), send(umount_name(1, "m0")),
                           plant(1 | P_MADE | P_ADOPTED), send(umount_id(2, 2)),
                           plant(2 | P_FUSE), send(umount_id(3, 3))),
    "planted-attach": seed(0, plant(P_MADE), send(attach(1, "m0"), [K_FUSE]),
                           send(attach(2, "m0"), [K_FUSE_RDONLY]),
                           send(attach(3, "m1"), [K_FUSE])),
    "planted-backing-kinds": seed(0, plant(P_MADE | P_FUSE), *[
        send(backing_open(i + 1, 1), [k]) for i, k in enumerate(
            [K_FILE, K_FILE_RDONLY, K_FILE_APPEND, K_FILE_LINKED, K_FILE_NOBODY, K_TMPFILE,
             K_MEMFD, K_MEMFD_APPEND, K_OPATH, K_DIR, K_PIPE_R, K_EVENTFD, K_SOCK,
             K_FUSE, K_PIDFD])]),
    "planted-backing-close": seed(0, plant(P_MADE | P_FUSE | 0x60),
                                  send(backing_close(1, 1, 1)), send(backing_close(2, 1, 3)),
                                  send(backing_close(3, 1, 9)),
                                  plant(1 | P_ADOPTED | P_FUSE), send(backing_close(4, 2, 5)),
                                  plant(2 | 0x20), send(backing_close(5, 3, 1))),
    # Batches: good and bad fds in one frame, ids known and not.
    "planted-backing-many": seed(0, plant(P_MADE | P_FUSE | 0x20),
                                 send(backing_open_many(1, 1), [K_FILE, K_FILE_RDONLY, K_TMPFILE]),
                                 send(backing_open_many(2, 1), [K_FUSE, K_SOCK, K_FILE]),
                                 send(backing_close_many(3, 1, [1, 2, 3, 99])),
                                 send(backing_open_many(4, 9), [K_FILE]),
                                 send(backing_close_many(5, 1, [])),
                                 send(backing_open_many(6, 1))),
    "planted-quota": seed(0, plant(P_MADE | P_FUSE | 0x60), plant(1 | P_FUSE | 0x60),
                          plant(2 | P_FUSE | 0x60), send(backing_open(1, 1), [K_FILE]),
                          send(mount(2, "m3"))),
    "planted-tenant": seed(0, plant(P_TENANT | P_MADE | P_FUSE | 0x20),
                           send(umount_id(1, 1)), send(backing_open(2, 1), [K_FILE]),
                           send(backing_close(3, 1, 1)), send(attach(4, "m0"), [K_FUSE]),
                           send(mount(5, "m0"))),
    "planted-remount": seed(0, plant(P_MADE | P_FUSE), plant(1 | P_MADE),
                            send(mount(1, "m0")), send(mount(2, "m2")), send(status(3))),
    # Framing: a frame split over chunks, fds on each part; too many fds;
    # too long; garbage and a wrong version (on two connections).
    "split-frame": seed(0, send(backing_open(1, 1)[:2], [K_FILE]),
                        send(backing_open(1, 1)[2:], [K_MEMFD]), send(status(2))),
    "two-fds": seed(0, send(backing_open(1, 1), [K_FILE, K_DEVNULL])),
    "three-socket-fds": seed(0, send(status(1), [K_SOCK_INFLIGHT, K_SOCK_SELF,
                                                 K_SOCK_FUSE_INFLIGHT])),
    "too-long": seed(0, send(b"\x00\x00\x10\x01" + b"\x08" * 64)),
    "garbage": seed(FL_TWO_CONNS, send(frame(b"\xff\xfe\xfd\x00\x01")),
                    send(frame(request(1, 8, b"", version=2)), to_b=True)),
    # Load: many frames in one wake; a peer that does not read; tight fds.
    "many-status": seed(0, send(b"".join(status(i) for i in range(1, 41)))),
    "paused": seed(FL_LAZY | FL_SMALL_BUF,
                   *[send(b"".join(status(i * 40 + j) for j in range(40))) for i in range(6)],
                   tick(), send(status(999))),
    "tight-nofile": seed(FL_TIGHT_NOFILE, plant(P_MADE | P_FUSE),
                         *[send(backing_open(i + 1, 1), [K_SOCK_INFLIGHT], op=OP_SEND_NOPUMP)
                           for i in range(24)], tick(), send(status(99))),
    # Root that no rule matches: STATUS only, fds kept out (or not, ungated).
    "no-rule": seed(FL_NO_RULE, send(status(1)), send(status(2), [K_DEVNULL]),
                    send(mount(3, "m0"))),
    "no-rule-ungated": seed(FL_NO_RULE | FL_UNGATED, send(status(1)),
                            send(status(2), [K_SOCK_INFLIGHT]),
                            send(backing_open(3, 1), [K_FILE])),
    # Two connections: the same owner, or root and the tenant.
    "two-conns": seed(FL_TWO_CONNS, send(status(1)), send(status(2), to_b=True),
                      send(backing_open(3, 1), [K_FILE], op=OP_SEND_NOPUMP),
                      send(backing_open(4, 1), [K_FILE], to_b=True), send(status(5))),
    "tenant": seed(FL_TWO_CONNS | FL_B_TENANT, plant(P_TENANT | P_MADE | P_FUSE | 0x20),
                   plant(1 | P_MADE | P_FUSE), send(status(1), to_b=True),
                   send(backing_open(2, 1), [K_FILE_NOBODY], to_b=True),
                   send(backing_open(3, 2), [K_FILE_NOBODY], to_b=True),
                   send(backing_close(4, 1, 1), to_b=True), send(umount_id(5, 1)),
                   send(umount_name(6, "m0"), to_b=True)),
    "tenant-no-rule-root": seed(FL_TWO_CONNS | FL_B_TENANT | FL_NO_RULE, send(status(1)),
                                send(status(2), to_b=True), send(mount(3, "m0"), to_b=True)),
    # Time passes: an idle connection (B), an unfinished frame (A); unread
    # replies.
    "timeouts": seed(FL_IDLE_TIMEOUT | FL_TWO_CONNS, send(status(1), to_b=True),
                     send(status(2)[:3], [K_DEVNULL]), tick(True), send(status(3))),
    "reply-stall": seed(FL_LAZY | FL_SMALL_BUF,
                        *[send(b"".join(status(i * 40 + j) for j in range(40)))
                          for i in range(4)], tick(True)),
    "ungated": seed(FL_UNGATED, plant(P_MADE | P_FUSE), send(backing_open(1, 1), [K_FILE]),
                    send(status(2), [K_FUSE])),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/corpus/fuzz_broker_loop"
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"{len(SEEDS)} seeds in {out}")


if __name__ == "__main__":
    main()

"""A client process that holds a GPU lease, for test_gpu_quarantine.py.

It speaks raw frames (hostile.py), so nothing maps anything: to the daemon
it is a client that may have the memory of its lease open, which is all
the quarantine can know. Usage:

    lease_holder.py SOCKET DEVICE_TYPE create|attach NAME kick|eof|release|hold

create makes NAME on DEVICE_TYPE's device 0 (its creator's lease, the
tensor left unpublished), attach attaches the published NAME. Then the
connection ends, or not:
    kick     a frame with an unknown protocol version: the daemon answers
             EPROTO and ends the connection itself
    eof      the socket shut down without a Release, the process alive
             (an older client's close, or the socket shut from outside)
    release  Release of the lease, then the shutdown: what tensord_close()
             does once it has closed its IPC handles
    hold     nothing: the connection stays (for kill -9)
It prints "ready KIND" (the lease's handle kind) once that is done, then
lives until its stdin ends.
"""
import os
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # hostile.py, and the conftest.py it imports

from hostile import (F_ATTACH, F_CREATE, F_RELEASE, Raw, create_body, f_bytes,  # noqa: E402
                     f_varint, frame, reply_with_fds, request)

R_LEASE = 5


def main():
    path, dev_type, how_lease, name, ending = sys.argv[1:6]
    c = Raw(path, timeout=10)
    c.hello()
    if how_lease == "create":
        body = create_body(name, [1024], device=(int(dev_type), 0))
        c.send(frame(request(2, F_CREATE, body)))
    else:
        c.send(frame(request(2, F_ATTACH, f_bytes(1, name))))
    r = reply_with_fds(c)
    if r.status != 0:
        sys.exit(f"lease_holder: {how_lease} {name}: {r}")
    lease = r.body(R_LEASE)
    lease_id, kind = lease[1][0], lease[3][0]
    if ending == "kick":
        c.send(frame(b"", version=99))
        r = c.reply()
        assert r.status == -71, r               # EPROTO, then the daemon closes
        c.expect_closed()
    elif ending == "eof":
        c.sock.shutdown(socket.SHUT_RDWR)
    elif ending == "release":
        c.send(frame(request(0, F_RELEASE, f_varint(1, lease_id))))
        c.sock.shutdown(socket.SHUT_RDWR)
    print("ready", kind, flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()

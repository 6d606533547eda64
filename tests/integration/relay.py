"""A relay between a client and a real tensord, for tests that need a
moment in the middle of a command, or a daemon that says odd things.

It listens on its own unix socket, opens a connection to the daemon for
each client, and forwards whole frames both ways, each with the
descriptors its header counts (a Create reply's memfd), taken in arrival
order as the client does. A test may act on each request
before it is forwarded (on_request: called with the request's decoded
fields, hostile.decode), and may rewrite the daemon's replies byte for
byte (replace: pairs of equal length, so every protobuf length stays
right). The relay runs as the test's uid, which tensorctl trusts as its
own daemon's."""
import os
import socket
import struct
import threading

from hostile import decode, n_fds_of

HEADER = struct.Struct("<IHH")   # length, version, flags


class Relay:
    def __init__(self, daemon_socket, path, on_request=None, replace=()):
        for old, new in replace:
            assert len(old) == len(new), (old, new)
        self.daemon_socket = daemon_socket
        self.path = path
        self.on_request = on_request
        self.replace = list(replace)
        self.errors = []
        self.socks = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        os.chmod(path, 0o600)
        self.listener.listen(8)
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.daemon_socket)
            self.socks += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False),
                             daemon=True).start()

    def _pump(self, src, dst, requests):
        buf, fds = b"", []
        try:
            while True:
                data, got, _, _ = socket.recv_fds(src, 1 << 20, 16)
                if not data:
                    break
                buf += data
                fds += got
                while len(buf) >= HEADER.size:
                    length, _, flags = HEADER.unpack_from(buf)
                    n = HEADER.size + length
                    if len(buf) < n:
                        break
                    frame, buf = buf[:n], buf[n:]
                    count = n_fds_of(flags)
                    if count is None or count > len(fds):
                        raise ValueError(f"frame counts {count} descriptors, {len(fds)} came")
                    if requests and self.on_request:
                        self.on_request(decode(frame[HEADER.size:]))
                    if not requests:
                        for old, new in self.replace:
                            frame = frame.replace(old, new)
                    mine, fds = fds[:count], fds[count:]
                    if mine:
                        try:
                            socket.send_fds(dst, [frame], mine)
                        finally:
                            for fd in mine:
                                os.close(fd)
                    else:
                        dst.sendall(frame)
        except OSError:
            pass                 # either side closed
        except Exception as e:   # a hook that failed: the test reads self.errors
            self.errors.append(e)
        finally:
            for fd in fds:
                os.close(fd)
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        try:
            self.listener.shutdown(socket.SHUT_RDWR)   # wakes the accept() below
        except OSError:
            pass
        self.listener.close()
        for s in self.socks:
            # shutdown first: a close() alone leaves the socket open while a
            # pump thread is blocked reading it (the call holds the file),
            # so the daemon would not see the connection end.
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self.thread.join(timeout=10)


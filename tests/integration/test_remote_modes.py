"""A peer that holds the secret learns nothing of an exported tensor its
uid (65534 on the serving node) may not read (issue 30, item 4): every pull
form (plain, with have_generation, with after, waiting, a set's listed
name) gets the same refusal, and a change of such a name told to a peer
that waits on it carries no generation.

A real daemon node-m exporting model/ and a FakePeer node-z speaking the
peer protocol from Python (test_peers.py), as test_remote.py's hostile peer
test does."""
import errno

import numpy as np

from test_peers import fbytes, fint, frame, read_varint
from test_remote import fake_peer_up, peer_frames, start_node_m, tensord, zigzag

F_PULL, F_PULL_REPLY, F_SET_PULL, F_SET_PULL_REPLY, F_CHANGED = 5, 6, 9, 10, 20


def test_private_tensor_every_pull_form_same_refusal(daemon_factory, tmp_path):
    d, key, port = start_node_m(daemon_factory, tmp_path)
    with tensord.Client(d.socket) as c:
        c.put("model/private", np.ones(4, np.float32), mode=0o600)
        gen = c.put("model/private", np.ones(4, np.float32), mode=0o600, replace=True)
        assert gen == 2
        _, s = fake_peer_up(d, key, port)

        def send(field, body):
            # Each with a heartbeat: the daemon calls a silent peer down after 3 s.
            s.sendall(frame(fbytes(3, fint(1, 1))) + frame(fbytes(field, body)))

        def pull(req_id, extra=b""):
            send(F_PULL, fint(1, req_id) + fbytes(2, b"model/private") + extra)
            r = peer_frames(s, F_PULL_REPLY)
            assert r[1] == req_id, r
            return r

        plain = pull(1)
        assert plain[2] == zigzag(-errno.EACCES), plain
        assert b"model/private" in plain[3] and b"uid 65534" in plain[3], plain
        forms = {
            "have_generation current": fint(3, gen),
            "have_generation stale": fint(3, gen - 1),
            "after its generation": fint(4, gen),
            "after an older one": fint(4, gen - 1),
            "after, waiting": fint(4, gen) + fint(5, 1),
            "have_generation, waiting": fint(3, gen) + fint(5, 1),
            "waiting": fint(5, 1),
        }
        for i, (form, extra) in enumerate(forms.items()):
            r = pull(10 + i, extra)
            # Nothing but the refusal: not current, no generation, not waiting or watched.
            assert {k: v for k, v in r.items() if k != 1} == \
                {k: v for k, v in plain.items() if k != 1}, (form, r, plain)
        # A set naming it: the same words.
        send(F_SET_PULL, fint(1, 100) + fbytes(2, b"model/private"))
        r = peer_frames(s, F_SET_PULL_REPLY)
        assert r[1] == 100 and r[2] == zigzag(-errno.EACCES) and r[3] == plain[3], r
        assert d.stats()["remote_watched_names"] == 0
        assert d.stats()["remote_pull_leases"] == 0

        # A peer waiting on a name not yet published is told when it is, but
        # not the generation of a version it may not read (its tombstone
        # makes it 2, not a guessable 1).
        c.put("model/later", np.ones(2, np.float32), mode=0o644)
        c.unlink("model/later")
        send(F_PULL, fint(1, 200) + fbytes(2, b"model/later") + fint(5, 1))
        r = peer_frames(s, F_PULL_REPLY)
        assert r[1] == 200 and r.get(21) == 1 and r.get(20) == 1, r  # waiting, watched
        assert c.put("model/later", np.ones(2, np.float32), mode=0o600) == 2
        r = peer_frames(s, F_CHANGED)
        assert r[1] == b"model/later" and read_varint(r[2], 0)[0] == 0, r
        # And asking again is refused as above.
        send(F_PULL, fint(1, 201) + fbytes(2, b"model/later") + fint(5, 1))
        r = peer_frames(s, F_PULL_REPLY)
        assert r[2] == zigzag(-errno.EACCES) and 21 not in r, r
        assert d.alive()
        s.close()

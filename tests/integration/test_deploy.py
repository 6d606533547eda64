"""deploy/Containerfile and deploy/k8s/: the recipe's build stage run
outside a container (the files it copies are enough, and what it installs
needs only the runtime stage's libraries), the image built where a working
container tool exists, and the Kubernetes manifests parsed and checked for
the paths, ids and limits they must agree on."""
import os
import re
import shlex
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONTAINERFILE = os.path.join(ROOT, "deploy", "Containerfile")
SOCKET = "/run/tensord/tensord.sock"


def containerfile():
    """(stage lines, ...) of the Containerfile, continuation lines joined."""
    with open(CONTAINERFILE) as f:
        text = re.sub(r"\\\n", " ", f.read())
    stages = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            stages.append([])
        stages[-1].append(line)
    return stages


def instr(stage, name):
    return [line[len(name) + 1:] for line in stage if line.startswith(name + " ")]


def test_runtime_stage_is_small_and_unprivileged():
    build, runtime = containerfile()
    assert " AS build" in build[0] and "slim" in runtime[0]
    (run,) = instr(runtime, "RUN")
    installed = re.search(r"apt-get install -y --no-install-recommends ([^&]+)&&", run)
    assert installed and installed.group(1).split() == ["libuv1", "libprotobuf-c1", "libssl3",
                                                        "libucx0", "libzip4", "libjansson4"], run
    assert "--uid 10001" in run and "--gid 10001" in run
    assert instr(runtime, "USER") == ["10001:10001"]
    assert instr(runtime, "VOLUME") == ["/run/tensord"]
    assert instr(runtime, "EXPOSE") == ["7439/tcp"]  # the peer port (docs/remote.md)
    assert instr(runtime, "ENV") == ["TENSORD_SOCKET=" + SOCKET]
    assert '"--socket", "%s"' % SOCKET in instr(runtime, "ENTRYPOINT")[0]


def test_build_stage_builds_from_what_it_copies(tmp_path):
    """The build stage's COPY lines and make command, run here: nothing it
    needs is left out, and what it installs links only libc and the
    runtime stage's libraries (tensorctl's libzip and jansson among them)."""
    if os.environ.get("TENSORD_SANITIZED") == "1":
        pytest.skip("a plain build; nothing to repeat under the sanitizers")
    build, _ = containerfile()
    src = tmp_path / "src"
    src.mkdir()
    for args in instr(build, "COPY"):
        parts = args.split()
        for p in parts[:-1]:
            dst = src / (p if parts[-1] != "./" else os.path.basename(p))
            dst.parent.mkdir(parents=True, exist_ok=True)
            if os.path.isdir(os.path.join(ROOT, p)):
                shutil.copytree(os.path.join(ROOT, p), dst,
                                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
            else:
                shutil.copy(os.path.join(ROOT, p), dst)
    make = [r for r in instr(build, "RUN") if r.startswith("make ")][0]
    argv = shlex.split(make.replace('-j"$(nproc)"', "-j2").replace("/out", str(tmp_path / "out")))
    r = subprocess.run(argv, cwd=src, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # libc6 (ld.so, libc, libm) is in every Debian image.
    allowed = {"libuv.so.1", "libprotobuf-c.so.1", "libc.so.6", "libm.so.6",
               "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}
    tensorctl_too = {"libzip.so.4", "libjansson.so.4"}
    # peering's HMAC (libssl3) and remote attach's UCX (libucx0), docs/remote.md
    # and the state log's CRC-32 (zlib1g, Essential: in every Debian image), docs/restart.md
    tensord_too = {"libcrypto.so.3", "libucp.so.0", "libucs.so.0", "libz.so.1"}
    for binary in ["tensord", "tensorctl"]:
        path = tmp_path / "out" / "usr" / "bin" / binary
        dyn = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True,
                             check=True).stdout
        needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn))
        assert needed and needed <= allowed | (tensorctl_too if binary == "tensorctl"
                                               else tensord_too), \
            (binary, needed)


def working_container_tool():
    for tool in ("podman", "buildah", "docker"):
        path = shutil.which(tool)
        if not path:
            continue
        probe = [path, "info"] if tool != "buildah" else [path, "version"]
        r = subprocess.run(probe, capture_output=True, text=True, timeout=60)
        if r.returncode == 0:
            return tool, path
        reason = "%s is installed but not usable here: %s" % (
            tool, (r.stderr.strip().splitlines() or ["no output"])[-1])
        return None, reason
    return None, ("no podman, buildah or docker installed (not installed by setup.sh: "
                  "they need a container runtime and a registry this machine cannot reach)")


def test_container_image_builds():
    tool, path_or_reason = working_container_tool()
    if not tool:
        pytest.skip(path_or_reason)  # why no container tool can build here
    path = path_or_reason
    cmd = [path, "build" if tool != "buildah" else "bud", "-f", CONTAINERFILE,
           "-t", "tensord:test", ROOT]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0 and re.search(r"pull|resolv|registry|manifest unknown", r.stderr, re.I):
        pytest.skip("%s cannot pull debian:bookworm-slim here: %s" % (
            tool, r.stderr.strip().splitlines()[-1]))
    assert r.returncode == 0, r.stderr[-4000:]
    r = subprocess.run([path, "run", "--rm", "tensord:test", "--version"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("tensord "), r.stderr


def manifests():
    """Every document of deploy/k8s/, by "Kind/name" (each once)."""
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (deploy/setup.sh)")
    docs = {}
    for name in ("daemonset.yaml", "client-pod.yaml"):
        with open(os.path.join(ROOT, "deploy", "k8s", name)) as f:
            for d in yaml.safe_load_all(f):
                key = "%s/%s" % (d["kind"], d["metadata"]["name"])
                assert key not in docs, key
                docs[key] = d
    return docs


DAEMONS, HOLDER = "DaemonSet/tensord", "DaemonSet/tensord-holder"


def env_of(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def container(spec, name):
    (c,) = [c for c in spec["containers"] if c["name"] == name]
    return c


def pod_specs(docs):
    return docs[DAEMONS]["spec"]["template"]["spec"], docs["Pod/tensord-client-example"]["spec"]


def test_k8s_manifests_parse_and_are_well_formed():
    docs = manifests()
    assert set(docs) == {"Namespace/tensord", DAEMONS, HOLDER, "Pod/tensord-client-example",
                         "Service/tensord-peers", "NetworkPolicy/tensord-peers"}
    for ds in (docs[DAEMONS], docs[HOLDER]):
        assert ds["apiVersion"] == "apps/v1" and ds["metadata"]["namespace"] == "tensord"
        labels = ds["spec"]["template"]["metadata"]["labels"]
        assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
        for c in ds["spec"]["template"]["spec"]["containers"]:
            limits = c["resources"]["limits"]
            assert "memory" in limits and "cpu" in limits
            assert "livenessProbe" not in c     # a restart would drop every tensor
    # Neither DaemonSet's selector, nor the Service's or the policy's, takes the other's pods.
    holder_labels = docs[HOLDER]["spec"]["template"]["metadata"]["labels"]
    for sel in (docs[DAEMONS]["spec"]["selector"]["matchLabels"],
                docs["Service/tensord-peers"]["spec"]["selector"],
                docs["NetworkPolicy/tensord-peers"]["spec"]["podSelector"]["matchLabels"]):
        assert not sel.items() <= holder_labels.items(), sel
    daemon_labels = docs[DAEMONS]["spec"]["template"]["metadata"]["labels"]
    assert not docs[HOLDER]["spec"]["selector"]["matchLabels"].items() <= daemon_labels.items()


def test_k8s_daemons_roll_through_the_holder_and_the_holder_is_never_rolled():
    """docs/restart.md section 6, "Kubernetes": a rolling update starts the
    new pod next to the old one (maxSurge 1, maxUnavailable 0: the drained
    upgrade needs both daemons at once), and the holder, which keeps the
    store across it, is replaced only by hand."""
    docs = manifests()
    assert docs[DAEMONS]["spec"]["updateStrategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert docs[HOLDER]["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_k8s_readiness_is_this_pods_daemon():
    """Both pods of a rolling update answer on the node's one socket path
    (the old daemon until it drains): the probe asks the pod's own
    --metrics TCP port, which the daemon binds once it restored and
    listens (daemon/main.c), on every address of the pod's own network
    namespace, so that the kubelet reaches it; no pod is let in to it."""
    docs = manifests()
    spec = docs[DAEMONS]["spec"]["template"]["spec"]
    daemon = container(spec, "tensord")
    probe = daemon["readinessProbe"]
    assert "httpGet" in probe and "exec" not in probe
    assert probe["httpGet"]["path"] == "/metrics"
    (port,) = [p for p in daemon["ports"]
               if probe["httpGet"]["port"] in (p["name"], p["containerPort"])]
    assert option(daemon["args"], "--metrics") == "0.0.0.0:%d" % port["containerPort"]
    assert not spec.get("hostNetwork") and "hostPort" not in port
    (rule,) = docs["NetworkPolicy/tensord-peers"]["spec"]["ingress"]
    assert all(not (p["port"] <= port["containerPort"] <= p.get("endPort", p["port"]))
               for p in rule["ports"])


def test_k8s_daemon_and_client_agree_on_paths_and_ids():
    docs = manifests()
    daemon_spec, client_spec = pod_specs(docs)
    _, runtime = containerfile()
    uid = int(instr(runtime, "USER")[0].split(":")[0])
    for spec in (daemon_spec, client_spec):
        (vol,) = [v for v in spec["volumes"] if v.get("hostPath", {}).get("path") == "/run/tensord"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            (m,) = [m for m in c["volumeMounts"] if m["name"] == vol["name"]]
            assert m["mountPath"] == "/run/tensord"
    for c in [container(daemon_spec, "tensord")] + client_spec["containers"]:
        assert env_of(c)["TENSORD_SOCKET"] == SOCKET
    daemon = container(daemon_spec, "tensord")
    sc = daemon["securityContext"]
    assert sc["runAsNonRoot"] and sc["runAsUser"] == uid and sc["runAsGroup"] == uid
    assert sc["capabilities"]["drop"] == ["ALL"] and not sc["allowPrivilegeEscalation"]
    (init,) = daemon_spec["initContainers"]
    assert "chown %d:%d /run/tensord" % (uid, uid) in " ".join(init["command"])
    # Its chmods are of files it chowned (or a pod before it did): FOWNER.
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    # The socket is 0660 and group uid's: the client joins that group.
    assert daemon["args"][:2] == ["--mode", "0660"]
    assert uid in client_spec["securityContext"]["supplementalGroups"]
    assert client_spec["securityContext"]["runAsNonRoot"]


def test_k8s_holder_keeps_the_daemons_store():
    """docs/restart.md, section 6: the holder is a DaemonSet of its own
    running tensord --hold on a directory of a hostPath the daemons' pods
    mount too, as the daemon's uid, made 0700 and the uid's by its init
    container; the daemon names it with --holder. The holder's pod alone
    shares the host's pid namespace (it signals daemons of other pods),
    and leaves a drained daemon to the controller."""
    docs = manifests()
    hspec = docs[HOLDER]["spec"]["template"]["spec"]
    dspec = docs[DAEMONS]["spec"]["template"]["spec"]
    (holder,) = hspec["containers"]
    daemon = container(dspec, "tensord")
    assert [c["name"] for c in dspec["containers"]] == ["tensord"]
    assert holder["command"][1:3] == ["--hold", option(daemon["args"], "--holder")]
    hold_dir = holder["command"][2]
    _, runtime = containerfile()
    uid = int(instr(runtime, "USER")[0].split(":")[0])
    for spec, c in ((hspec, holder), (dspec, daemon)):
        (m,) = [m for m in c["volumeMounts"] if hold_dir.startswith(m["mountPath"] + "/")]
        (vol,) = [v for v in spec["volumes"] if v["name"] == m["name"]]
        assert vol["hostPath"]["path"] == m["mountPath"]
        assert c["securityContext"]["runAsUser"] == uid
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert not c["securityContext"]["allowPrivilegeEscalation"]
    host_dir = m["mountPath"]
    (init,) = hspec["initContainers"]
    script = " ".join(init["command"])
    assert "chown %d:%d %s" % (uid, uid, host_dir) in script
    assert "chmod 0700 %s" % host_dir in script
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    assert hspec["hostPID"] is True
    assert "hostPID" not in dspec and "shareProcessNamespace" not in dspec
    assert "shareProcessNamespace" not in hspec
    assert env_of(holder)["TENSORD_HOLD_STOP_DRAINED"] == "0"


def option(args, flag):
    """The value of flag in a container's args (each flag and value an item)."""
    assert args.count(flag) == 1, (flag, args)
    return args[args.index(flag) + 1]


def test_k8s_peering_parts_agree():
    """docs/remote.md, "Operators": the daemons listen on 7439 and find each
    other through a headless Service of their own pods, named by the node
    (downward API), with the secret a 0400 volume copied to the daemon's
    own file; a NetworkPolicy lets only those pods reach 7439 and UCX's
    pinned ports; the container declares the port."""
    docs = manifests()
    ds, svc, pol = docs[DAEMONS], docs["Service/tensord-peers"], docs["NetworkPolicy/tensord-peers"]
    spec = ds["spec"]["template"]["spec"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    daemon = container(spec, "tensord")
    args = daemon["args"]
    # The peer port, the same in the args, the container, the Service, the policy and the image.
    listen = option(args, "--peer-listen")
    assert listen.startswith(":")              # every address of the pod
    port = int(listen[1:])
    (cport,) = [p for p in daemon["ports"] if p["name"] == "peer"]
    assert cport["containerPort"] == port and cport["protocol"] == "TCP"
    _, runtime = containerfile()
    assert instr(runtime, "EXPOSE") == ["%d/tcp" % port]
    # --peers-dns names the headless Service, in the DaemonSet's namespace.
    ns = ds["metadata"]["namespace"]
    assert svc["metadata"]["namespace"] == pol["metadata"]["namespace"] == ns
    assert option(args, "--peers-dns") == "%s.%s.svc.cluster.local:%d" % (
        svc["metadata"]["name"], ns, port)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is False
    assert svc["spec"]["selector"] == labels
    (sport,) = svc["spec"]["ports"]
    assert sport["port"] == port and sport["targetPort"] in (port, cport["name"])
    # The node name from the downward API.
    assert option(args, "--node-name") == "$(NODE_NAME)"
    assert env_of(daemon)["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # The secret: a Secret volume of mode 0400, copied by the init container
    # (root, CHOWN only) to a memory volume the daemon mounts read-only.
    vols = {v["name"]: v for v in spec["volumes"]}
    (secret,) = [v for v in vols.values() if "secret" in v]
    assert secret["secret"]["defaultMode"] == 0o400
    key_path = option(args, "--peer-secret-file")
    (key_mount,) = [m for m in daemon["volumeMounts"] if key_path.startswith(m["mountPath"] + "/")]
    assert key_mount["readOnly"] and vols[key_mount["name"]]["emptyDir"]["medium"] == "Memory"
    (init,) = spec["initContainers"]
    init_mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    script = " ".join(init["command"])
    uid = int(instr(runtime, "USER")[0].split(":")[0])
    assert init_mounts[key_mount["name"]] == key_mount["mountPath"]
    assert init_mounts[secret["name"]] in script and key_path in script
    assert "chown %d:%d %s" % (uid, uid, key_path) in script and "chmod 0400 %s" % key_path in script
    # UCX's ports pinned, and only the DaemonSet's pods let in to them and to the peer port.
    lo, hi = (int(x) for x in env_of(daemon)["UCX_TCP_PORT_RANGE"].split("-"))
    assert pol["apiVersion"] == "networking.k8s.io/v1"
    assert pol["spec"]["podSelector"]["matchLabels"] == labels
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = pol["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": labels}}]
    ports = {(p["port"], p.get("endPort", p["port"])) for p in rule["ports"]}
    assert ports == {(port, port), (lo, hi)} and port not in range(lo, hi + 1)

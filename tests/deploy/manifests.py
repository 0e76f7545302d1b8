#!/usr/bin/python3
"""Checks of the Kubernetes manifests (deploy/kubernetes, deploy/batch).

usage: manifests.py SRC BUILD TMP CHECK
  CHECK  manifests  every YAML document parses; the topology ConfigMap
                    lists the StatefulSet's pods; probes, quorums, mounts,
                    memory; the embedded ini files parse with the programs;
                    kubectl --dry-run=client when a server answers
         secrets    make-secrets.sh: certificates naming the pods and
                    Services, tokens the programs accept
         reduce     the batch reduce script: merges and imports only a
                    complete, verified set of partials
         hardening  deploy/kubernetes: per group of copies a
                    PodDisruptionBudget with maxUnavailable = N - W and
                    required anti-affinity by kubernetes.io/hostname; the
                    NetworkPolicies (internal listener from the cluster's
                    own pods only, public port from clients); each
                    container non-root, read-only root, no capability,
                    seccomp RuntimeDefault, and its data on volumes

Runs with Debian's /usr/bin/python3 (python3-yaml).  Exit 0 pass, 1 fail.
"""
import configparser
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import yaml

SRC, BUILD, TMP, CHECK = [os.path.abspath(a) for a in sys.argv[1:4]] + sys.argv[4:5]
K8S = os.path.join(SRC, "deploy", "kubernetes")
BATCH = os.path.join(SRC, "deploy", "batch")
CLI = os.path.join(BUILD, "cli", "bloomgrid")
PROG = {"node": os.path.join(BUILD, "node", "bloomgrid-node"),
        "router": os.path.join(BUILD, "router", "bloomgrid-router"),
        "merger": os.path.join(BUILD, "merger", "bloomgrid-merger")}
# Settings that other parts of the tree add; a build without them yet
# checks the rest of the file and says which it left out.
PENDING = set()

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def finish():
    if failures:
        print("%d check(s) failed" % len(failures))
        sys.exit(1)
    print("all checks passed")
    sys.exit(0)


def load_docs():
    """(file, document) for every YAML document of both folders."""
    docs = []
    for d in (K8S, BATCH):
        for name in sorted(os.listdir(d)):
            if not name.endswith((".yaml", ".yml")):
                continue
            path = os.path.join(d, name)
            with open(path) as f:
                for doc in yaml.safe_load_all(f):
                    if doc is None:
                        continue
                    if not isinstance(doc, dict) or "kind" not in doc or \
                            "apiVersion" not in doc or "name" not in doc.get("metadata", {}):
                        fail("%s: a document without apiVersion, kind or metadata.name" % path)
                        continue
                    docs.append((path, doc))
    return docs


def by_kind(docs, kind):
    return {d["metadata"]["name"]: d for _, d in docs if d["kind"] == kind}


def ini(text):
    p = configparser.ConfigParser(inline_comment_prefixes=(";", "#"),
                                  comment_prefixes=(";", "#"), strict=True)
    p.read_string("[__top__]\n" + text)
    return p


def pod_specs(docs):
    """(name, pod spec) of every workload."""
    out = []
    for _, d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "Job"):
            out.append((d["kind"] + "/" + d["metadata"]["name"], d["spec"]["template"]["spec"]))
    return out


def mem_mib(q):
    m = re.fullmatch(r"(\d+)(Mi|Gi)", str(q))
    if not m:
        raise ValueError("memory %r: expected Mi or Gi" % q)
    return int(m.group(1)) * (1024 if m.group(2) == "Gi" else 1)


def known_settings(prog):
    out = subprocess.run([PROG[prog], "--help"], capture_output=True, text=True).stdout
    return {m.group(1).replace("-", "_") for m in re.finditer(r"^  --([a-z0-9-]+)", out, re.M)}


def parse_with_program(prog, name, text):
    """The program reads the file for real: a bad key or value stops it
    naming FILE:LINE before any flag is looked at; a good file gets as far
    as the unknown flag given after it."""
    known = known_settings(prog)
    keep, left = [], []
    for line in text.splitlines():
        key = line.split("=", 1)[0].strip()
        if "=" in line and key in PENDING and key not in known:
            left.append(key)
            continue
        keep.append(line)
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write("\n".join(keep) + "\n")
    r = subprocess.run([PROG[prog], "--config", path, "--zz-parsed"],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 2 or "unknown flag --zz-parsed" not in r.stderr:
        fail("%s: bloomgrid-%s refuses it: %s" % (name, prog, r.stderr.strip()))
    else:
        print("ok: %s parses with bloomgrid-%s%s" % (
            name, prog, " (not in this build yet, left out: %s)" % ", ".join(left) if left else ""))


def busy_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s, s.getsockname()[1]


def router_start_check(extra):
    """Runs the router up to its bind on a port held here: exit 1 (cannot
    listen) means the topology, TLS files and tokens passed; 2 names what
    did not."""
    s, port = busy_port()
    try:
        r = subprocess.run([PROG["router"], "--listen", "127.0.0.1:%d" % port] + extra,
                           capture_output=True, text=True, timeout=30)
    finally:
        s.close()
    return r


def check_manifests():
    docs = load_docs()
    # libinih reads lines of at most INI_MAX_LINE (200) bytes and cuts
    # longer ones: a cut copies line loses its last address.
    for path, d in docs:
        if d["kind"] == "ConfigMap":
            for k, v in d.get("data", {}).items():
                for no, line in enumerate(v.splitlines(), 1):
                    if k.endswith(".ini") and len(line) >= 200:
                        fail("%s: %s line %d has %d characters: ini lines are cut at 199"
                             % (path, k, no, len(line)))
    print("ok: %d YAML documents parse" % len(docs))
    cms = by_kind(docs, "ConfigMap")
    secrets_made = {"bloomgrid-tls", "bloomgrid-tokens", "bloomgrid-batch-token"}
    with open(os.path.join(K8S, "make-secrets.sh")) as f:
        script = f.read()
    for s in secrets_made:
        if "name: %s\\n" % s not in script:
            fail("make-secrets.sh does not make the Secret %s" % s)
    secrets = set(by_kind(docs, "Secret")) | secrets_made
    services = by_kind(docs, "Service")
    pvcs = by_kind(docs, "PersistentVolumeClaim")
    sts = by_kind(docs, "StatefulSet")
    deps = by_kind(docs, "Deployment")
    jobs = by_kind(docs, "Job")

    for path, d in docs:
        if d["kind"] != "Namespace" and d["metadata"].get("namespace") != "bloomgrid":
            fail("%s: %s/%s is not in namespace bloomgrid" % (path, d["kind"], d["metadata"]["name"]))

    # The topology: one group of the StatefulSet's pods.
    topo_text = cms["bloomgrid-topology"]["data"]["topology.ini"]
    topo = ini(topo_text)
    node = sts["bloomgrid-node"]
    svc = services[node["spec"]["serviceName"]]
    ns = node["metadata"]["namespace"]
    if svc["spec"].get("clusterIP") != "None":
        fail("Service %s is not headless" % svc["metadata"]["name"])
    if not svc["spec"].get("publishNotReadyAddresses"):
        fail("Service %s: a SYNCING copy (not ready) would not resolve" % svc["metadata"]["name"])
    if svc["spec"]["selector"] != node["spec"]["selector"]["matchLabels"]:
        fail("Service %s selects other pods than the StatefulSet" % svc["metadata"]["name"])
    groups = [s for s in topo.sections() if s != "__top__"]
    if len(groups) != 1 or not groups[0].startswith("group "):
        fail("topology: expected one [group NAME], found %s" % groups)
    g = topo[groups[0]]
    copies = g["copies"].split()
    n = node["spec"]["replicas"]
    want = ["bloomgrid-node-%d.%s.%s.svc:7401" % (i, svc["metadata"]["name"], ns)
            for i in range(n)]
    if copies != want:
        fail("topology copies %s are not the StatefulSet's pods %s" % (copies, want))
    if len(copies) != n:
        fail("StatefulSet replicas %d, topology copies %d" % (n, len(copies)))
    w = int(g.get("write_quorum", topo["__top__"].get("write_quorum", "0")))
    r = int(g.get("read_quorum", topo["__top__"].get("read_quorum", "0")))
    if not (1 <= w <= n and 1 <= r <= n and r + w > n):
        fail("quorums W=%d R=%d over N=%d: R+W must exceed N" % (w, r, n))
    else:
        print("ok: %d copies = StatefulSet pods, W=%d R=%d, R+W>N" % (n, w, r))

    # The node's advertise, after the kubelet's $(VAR) expansion, for each pod.
    c = node["spec"]["template"]["spec"]["containers"][0]
    args = c["args"]
    adv = args[args.index("--advertise") + 1]
    got = [adv.replace("$(POD_NAME)", "bloomgrid-node-%d" % i).replace("$(POD_NAMESPACE)", ns)
           for i in range(n)]
    if got != copies:
        fail("node --advertise %s gives %s, not the topology's copies" % (adv, got))
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c["env"]}
    if env.get("POD_NAME") != "metadata.name" or env.get("POD_NAMESPACE") != "metadata.namespace":
        fail("node: POD_NAME / POD_NAMESPACE are not the pod's name and namespace")
    claims = [t["metadata"]["name"] for t in node["spec"].get("volumeClaimTemplates", [])]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    if "data" not in claims or "data" not in mounts:
        fail("node: no volumeClaimTemplate mounted as its data")

    # Each program's ini: where the pod mounts it, what it names.
    cfg_of = {"node": ("bloomgrid-node-config", "node.ini", node),
              "router": ("bloomgrid-router-config", "router.ini", deps["bloomgrid-router"]),
              "merger": ("bloomgrid-merger-config", "merger.ini", deps["bloomgrid-merger"])}
    for prog, (cm, key, wl) in cfg_of.items():
        text = cms[cm]["data"][key]
        sec = ini(text)[prog]
        pod = wl["spec"]["template"]["spec"]
        ctr = pod["containers"][0]
        if ctr["image"] != "bloomgrid:latest" or ctr["args"][0] != prog:
            fail("%s: not the image's %s" % (wl["metadata"]["name"], prog))
        conf = ctr["args"][ctr["args"].index("--config") + 1]
        vols = {v["name"]: v for v in pod["volumes"]}
        for t in wl["spec"].get("volumeClaimTemplates", []):
            vols[t["metadata"]["name"]] = {"claimTemplate": t}
        mounted = {}
        for m in ctr["volumeMounts"]:
            v = vols.get(m["name"])
            if v is None:
                fail("%s: mount %s has no volume" % (prog, m["name"]))
                continue
            mounted[m["mountPath"]] = v
        # Every file the ini (or --config) names lies in a mount that holds it.
        files = [conf] + [sec[k] for k in ("tls_cert", "tls_key", "tls_ca", "tokens_file",
                                             "topology", "sources") if k in sec]
        for f in files:
            d, base = os.path.split(f)
            v = mounted.get(d)
            if v is None:
                fail("%s: %s is in no mounted volume" % (prog, f))
            elif "configMap" in v:
                if base not in cms[v["configMap"]["name"]]["data"]:
                    fail("%s: ConfigMap %s has no %s" % (prog, v["configMap"]["name"], base))
            elif "secret" in v:
                items = [i["path"] for i in v["secret"].get("items", [])]
                if items and base not in items:
                    fail("%s: Secret %s does not project %s" % (prog, v["secret"]["secretName"], base))
        if "sources" in sec:
            src = ini(cms[cm]["data"][os.path.basename(sec["sources"])])
            for s in src.sections():
                for line in src[s].get("datacenter", "").splitlines():
                    t = line.split()[1]
                    if os.path.dirname(t) not in mounted:
                        fail("merger sources: %s is in no mounted volume" % t)
        data_key = "data_dir" if prog == "node" else "state_dir" if prog == "merger" else None
        if data_key:
            v = mounted.get(os.path.dirname(sec[data_key]), {})
            if not set(v) & {"claimTemplate", "persistentVolumeClaim"}:
                fail("%s: %s %s is not on its claim" % (prog, data_key, sec[data_key]))
        # Probes: the kubelet's gRPC probes on health_listen.
        if "health_listen" not in sec:
            fail("%s: %s sets no health_listen: the probes have no port" % (prog, key))
            continue
        hport = int(sec["health_listen"].rsplit(":", 1)[1])
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            p = ctr.get(probe)
            if p is None:
                if probe != "startupProbe":
                    fail("%s: no %s" % (prog, probe))
                continue
            if set(p) & {"httpGet", "tcpSocket", "exec"} or "grpc" not in p:
                fail("%s: %s is not a gRPC probe" % (prog, probe))
                continue
            if p["grpc"]["port"] != hport:
                fail("%s: %s on port %s, health_listen is %d" % (prog, probe, p["grpc"]["port"], hport))
            service = p["grpc"].get("service", "")
            if probe != "readinessProbe" and service != "":
                fail("%s: %s asks %r: liveness is service \"\"" % (prog, probe, service))
            if probe == "readinessProbe" and prog != "merger" and service != "bloomgrid.v1.BloomGrid":
                fail("%s: readiness asks %r, not bloomgrid.v1.BloomGrid" % (prog, service))
        print("ok: %s probes on health_listen port %d" % (prog, hport))
        # Metrics: the port the ini serves is the pod's "metrics" port and
        # the one its scrape annotations name, over HTTPS (the process has
        # a certificate and metrics_tls leaves auto or says on).
        if "metrics_listen" not in sec:
            fail("%s: %s sets no metrics_listen" % (prog, key))
        else:
            mport = int(sec["metrics_listen"].rsplit(":", 1)[1])
            ports = {p.get("name"): p["containerPort"] for p in ctr.get("ports", [])}
            ann = wl["spec"]["template"]["metadata"].get("annotations", {})
            if ports.get("metrics") != mport:
                fail("%s: container port \"metrics\" %s, metrics_listen port %d"
                     % (prog, ports.get("metrics"), mport))
            if ann.get("prometheus.io/port") != str(mport) or ann.get("prometheus.io/scrape") != "true":
                fail("%s: scrape annotations %r do not name port %d" % (prog, ann, mport))
            https = "tls_cert" in sec and sec.get("metrics_tls", "auto") in ("auto", "on")
            if not https or ann.get("prometheus.io/scheme") != "https":
                fail("%s: metrics are not HTTPS (tls_cert %r, metrics_tls %r, scheme %r)"
                     % (prog, sec.get("tls_cert"), sec.get("metrics_tls", "auto"),
                        ann.get("prometheus.io/scheme")))
            else:
                print("ok: %s metrics on port %d, HTTPS, annotated for scraping" % (prog, mport))
        parse_with_program(prog, key, text)
        if prog == "node":
            # The request and limit are the budget plus push plus 1 GiB.
            want_mib = int(sec["max_memory_mb"]) + int(sec.get("max_push_mb", "256")) + 1024
            res = ctr["resources"]
            for k in ("requests", "limits"):
                got_mib = mem_mib(res[k]["memory"])
                if got_mib != want_mib:
                    fail("node: %s.memory %dMi, the formula gives %dMi" % (k, got_mib, want_mib))
            print("ok: node memory %dMi = max_memory_mb + max_push_mb + 1024" % want_mib)

    # Merger: one pod, never two.
    mg = deps["bloomgrid-merger"]["spec"]
    if mg["replicas"] != 1 or mg["strategy"]["type"] != "Recreate":
        fail("merger: not a single replica with strategy Recreate")
    if deps["bloomgrid-router"]["spec"]["replicas"] < 2:
        fail("router: fewer than 2 replicas")

    # Every volume of every pod exists: ConfigMaps, Secrets, claims.
    for name, pod in pod_specs(docs):
        for v in pod.get("volumes", []):
            if "configMap" in v and v["configMap"]["name"] not in cms:
                fail("%s: ConfigMap %s is defined nowhere" % (name, v["configMap"]["name"]))
            if "secret" in v and v["secret"]["secretName"] not in secrets:
                fail("%s: Secret %s is made nowhere" % (name, v["secret"]["secretName"]))
            if "persistentVolumeClaim" in v and v["persistentVolumeClaim"]["claimName"] not in pvcs:
                fail("%s: claim %s is defined nowhere" % (name, v["persistentVolumeClaim"]["claimName"]))
        for ctr in pod["containers"]:
            vols = {v["name"] for v in pod.get("volumes", [])}
            for m in ctr.get("volumeMounts", []):
                if m["name"] not in vols and not (name.startswith("StatefulSet/") and m["name"] in claims):
                    fail("%s: mount %s has no volume" % (name, m["name"]))
    for s in services.values():
        sel = s["spec"].get("selector")
        if not any(sel == w["spec"]["selector"]["matchLabels"]
                   for w in list(deps.values()) + list(sts.values())):
            fail("Service %s selects no workload" % s["metadata"]["name"])
    print("ok: every mounted ConfigMap, Secret and claim exists; every Service selects a workload")

    # The batch recipe: ordered map and reduce over a ReadWriteMany volume.
    mp, red = jobs["users-partials"], jobs["users-merge"]
    if mp["spec"].get("completionMode") != "Indexed":
        fail("map Job is not Indexed")
    renv = {e["name"]: e.get("value") for e in red["spec"]["template"]["spec"]["containers"][0]["env"]}
    menv = {e["name"]: e.get("value") for e in mp["spec"]["template"]["spec"]["containers"][0]["env"]}
    if int(renv["PARTS"]) != mp["spec"]["completions"]:
        fail("reduce PARTS %s, map completions %s" % (renv["PARTS"], mp["spec"]["completions"]))
    if renv["RUN"] != menv["RUN"]:
        fail("map and reduce write and read other runs: %s, %s" % (menv["RUN"], renv["RUN"]))
    host = renv["BLOOMGRID_SERVER"].split(".")[0]
    if host not in services or renv["BLOOMGRID_SERVER"].rsplit(":", 1)[1] != \
            str(services[host]["spec"]["ports"][0]["port"]):
        fail("reduce server %s is not the router Service" % renv["BLOOMGRID_SERVER"])
    if "ReadWriteMany" not in pvcs["bloomgrid-batch"]["spec"]["accessModes"]:
        fail("batch volume is not ReadWriteMany")
    # The reduce runs deploy/batch/reduce.sh as the image installs it.
    rcmd = red["spec"]["template"]["spec"]["containers"][0]["command"]
    with open(os.path.join(SRC, "Dockerfile")) as f:
        prefix = re.search(r"-DCMAKE_INSTALL_PREFIX=(\S+)", f.read()).group(1)
    with open(os.path.join(SRC, "deploy", "CMakeLists.txt")) as f:
        installs = re.search(r"install\(PROGRAMS[^)]*batch/reduce\.sh[^)]*"
                             r"DESTINATION \$\{CMAKE_INSTALL_DATADIR\}/bloomgrid/batch\)", f.read())
    if rcmd[-1] != prefix + "/share/bloomgrid/batch/reduce.sh" or not installs:
        fail("reduce Job runs %s; the image installs deploy/batch/reduce.sh as %s: %s" %
             (rcmd[-1], prefix + "/share/bloomgrid/batch/reduce.sh",
              "" if installs else "not installed by deploy/CMakeLists.txt"))
    print("ok: batch map/reduce agree on parts, run, router Service and an RWX volume")

    # The topology and the router's own checks of it.
    tpath = os.path.join(TMP, "topology.ini")
    with open(tpath, "w") as f:
        f.write(topo_text)
    r = router_start_check(["--topology", tpath])
    if r.returncode != 1:
        fail("bloomgrid-router refuses the topology (exit %d): %s" % (r.returncode, r.stderr.strip()))
    else:
        print("ok: bloomgrid-router loads the topology")

    # kubectl, when it has a server to ask (a client dry run still reads
    # the server's API list).
    kubectl = shutil.which("kubectl")
    if not kubectl:
        print("SKIP: kubectl dry run: no kubectl on PATH")
    elif subprocess.run([kubectl, "version", "--request-timeout=5s"], capture_output=True,
                        timeout=60).returncode != 0:
        print("SKIP: kubectl dry run: no Kubernetes API server answers")
    else:
        for d in (K8S, BATCH):
            r = subprocess.run([kubectl, "apply", "--dry-run=client", "-f", d],
                               capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                fail("kubectl apply --dry-run=client -f %s: %s" % (d, r.stderr.strip()))
            else:
                print("ok: kubectl apply --dry-run=client -f %s" % d)


def selects(sel, labels):
    """Does a label selector (matchLabels, matchExpressions) select a pod
    with these labels?  An empty selector selects every pod."""
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or []:
        k, op, vals = e["key"], e["operator"], e.get("values", [])
        if op == "In" and labels.get(k) not in vals:
            return False
        if op == "NotIn" and labels.get(k) in vals:
            return False
        if op == "Exists" and k not in labels:
            return False
        if op == "DoesNotExist" and k in labels:
            return False
    return True


def check_hardening():
    docs = [(p, d) for p, d in load_docs() if os.path.dirname(p) == K8S]
    cms = by_kind(docs, "ConfigMap")
    topo = ini(cms["bloomgrid-topology"]["data"]["topology.ini"])
    top = topo["__top__"]
    pdbs = by_kind(docs, "PodDisruptionBudget")
    policies = by_kind(docs, "NetworkPolicy")
    workloads = [d for _, d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    prog_of = {"bloomgrid-node": "node", "bloomgrid-router": "router",
               "bloomgrid-merger": "merger"}
    ns = "bloomgrid"

    # ---- the containers ----
    for w in workloads:
        name = "%s/%s" % (w["kind"], w["metadata"]["name"])
        pod = w["spec"]["template"]["spec"]
        psc = pod.get("securityContext", {})
        before = len(failures)
        if pod.get("automountServiceAccountToken") is not False:
            fail("%s: automountServiceAccountToken is not false" % name)
        for c in pod["containers"] + pod.get("initContainers", []):
            csc = c.get("securityContext", {})
            eff = dict(psc, **csc)
            if eff.get("runAsNonRoot") is not True or eff.get("runAsUser", 0) == 0:
                fail("%s/%s: runAsNonRoot %r, runAsUser %r" % (name, c["name"],
                     eff.get("runAsNonRoot"), eff.get("runAsUser")))
            if (eff.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
                fail("%s/%s: seccompProfile %r, not RuntimeDefault" %
                     (name, c["name"], eff.get("seccompProfile")))
            if csc.get("readOnlyRootFilesystem") is not True:
                fail("%s/%s: readOnlyRootFilesystem is not true" % (name, c["name"]))
            if csc.get("allowPrivilegeEscalation") is not False or csc.get("privileged"):
                fail("%s/%s: allowPrivilegeEscalation %r, privileged %r" % (
                     name, c["name"], csc.get("allowPrivilegeEscalation"), csc.get("privileged")))
            caps = csc.get("capabilities") or {}
            if caps.get("drop") != ["ALL"] or caps.get("add"):
                fail("%s/%s: capabilities %r, expected drop [ALL] and no add" %
                     (name, c["name"], caps))
            # A read-only root: every directory the program writes is a
            # writable volume (its claim or an emptyDir), /tmp included.
            vols = {v["name"]: v for v in pod.get("volumes", [])}
            for t in w["spec"].get("volumeClaimTemplates", []):
                vols[t["metadata"]["name"]] = {"claimTemplate": t}
            writable = [m["mountPath"] for m in c.get("volumeMounts", [])
                        if not m.get("readOnly") and
                        set(vols.get(m["name"], {})) & {"claimTemplate",
                                                          "persistentVolumeClaim", "emptyDir"}]
            prog = prog_of[w["metadata"]["name"]]
            sec = ini(cms["bloomgrid-%s-config" % prog]["data"][prog + ".ini"])[prog]
            need = ["/tmp"] + [sec[k] for k in ("data_dir", "state_dir") if k in sec]
            for d in need:
                if not any(d == m or d.startswith(m.rstrip("/") + "/") for m in writable):
                    fail("%s/%s: %s is on the read-only root (writable mounts: %s)" %
                         (name, c["name"], d, writable))
        if len(failures) == before:
            print("ok: %s: non-root (uid %s), read-only root with %s on volumes, no "
                  "capability, seccomp RuntimeDefault" % (name, psc.get("runAsUser"),
                  ", ".join(need)))

    # ---- each group of copies: a StatefulSet, its budget, its spread ----
    node_sets = [w for w in workloads if w["metadata"]["name"].startswith("bloomgrid-node")]
    for sts in node_sets:
        name = "StatefulSet/%s" % sts["metadata"]["name"]
        labels = sts["spec"]["template"]["metadata"]["labels"]
        group = labels.get("bloomgrid.io/group")
        if not group or "group " + group not in topo.sections():
            fail("%s: pods carry no bloomgrid.io/group naming a topology group (%r)"
                 % (name, group))
            continue
        g = topo["group " + group]
        n = len(g["copies"].split())
        w = int(g.get("write_quorum", top.get("write_quorum", str(n))))
        if sts["spec"]["replicas"] != n:
            fail("%s: %d replicas, group %s has %d copies" % (name, sts["spec"]["replicas"],
                                                              group, n))
        # The group's pods, as a pod of another group would be labelled.
        other = dict(labels, **{"bloomgrid.io/group": group + "-other"})
        mine = [p for p in pdbs.values() if selects(p["spec"]["selector"], labels)]
        if len(mine) != 1:
            fail("%s: %d PodDisruptionBudgets select the copies of group %s"
                 % (name, len(mine), group))
        else:
            spec = mine[0]["spec"]
            if selects(spec["selector"], other):
                fail("PodDisruptionBudget %s selects the copies of other groups too"
                     % mine[0]["metadata"]["name"])
            if "minAvailable" in spec or spec.get("maxUnavailable") != n - w:
                fail("PodDisruptionBudget %s: maxUnavailable %r (minAvailable %r), "
                     "expected N - W = %d - %d = %d" % (mine[0]["metadata"]["name"],
                     spec.get("maxUnavailable"), spec.get("minAvailable"), n, w, n - w))
            else:
                print("ok: group %s: PodDisruptionBudget %s, maxUnavailable %d = N - W = %d - %d"
                      % (group, mine[0]["metadata"]["name"], n - w, n, w))
        aff = sts["spec"]["template"]["spec"].get("affinity", {}).get("podAntiAffinity", {})
        terms = [t for t in aff.get("requiredDuringSchedulingIgnoredDuringExecution", [])
                 if t.get("topologyKey") == "kubernetes.io/hostname"
                 and selects(t["labelSelector"], labels)
                 and not selects(t["labelSelector"], other)
                 and not t.get("namespaces") and not t.get("namespaceSelector")]
        if not terms:
            fail("%s: no required anti-affinity by kubernetes.io/hostname between the "
                 "copies of group %s (%r)" % (name, group, aff))
        else:
            print("ok: group %s: copies on distinct machines (required anti-affinity)" % group)

    # ---- NetworkPolicies ----
    def pod_labels(prog):
        w = [x for x in workloads if x["metadata"]["name"] == "bloomgrid-" + prog][0]
        return w["spec"]["template"]["metadata"]["labels"]

    def port_of(prog, key):
        sec = ini(cms["bloomgrid-%s-config" % prog]["data"][prog + ".ini"])[prog]
        return int(sec[key].rsplit(":", 1)[1]) if key in sec else None

    def rules_for(prog, port):
        """The ingress rules of every policy selecting prog's pods that
        admit port, and whether any policy selects them for ingress."""
        labels = pod_labels(prog)
        selected, rules = False, []
        for p in policies.values():
            if p["metadata"].get("namespace") != ns or \
                    not selects(p["spec"]["podSelector"], labels):
                continue
            if "Ingress" in p["spec"].get("policyTypes", ["Ingress"]):
                selected = True
            for r in p["spec"].get("ingress", []):
                ports = r.get("ports")
                if not ports or any(x.get("port") == port for x in ports):
                    rules.append(r)
        return selected, rules

    cluster = [pod_labels(p) for p in ("node", "router", "merger")]
    for prog in ("node", "router", "merger"):
        sel, _ = rules_for(prog, 0)
        if not sel:
            fail("no NetworkPolicy selects the %s pods for ingress" % prog)
        # No rule admits every port.
        for p in policies.values():
            if selects(p["spec"]["podSelector"], pod_labels(prog)):
                for r in p["spec"].get("ingress", []):
                    if not r.get("ports"):
                        fail("NetworkPolicy %s admits every port of the %s pods"
                             % (p["metadata"]["name"], prog))
    internal = port_of("node", "internal_listen")
    _, rules = rules_for("node", internal)
    peers = [f for r in rules for f in r.get("from", [None])]
    before = len(failures)
    if not rules:
        fail("no NetworkPolicy rule admits the nodes' internal port %d" % internal)
    # Only pod selectors of this namespace, and none that selects a pod
    # that is not one of the cluster's processes (a client of this
    # namespace, the batch Job's pods).
    stranger = {"app.kubernetes.io/name": "some-client", "app.kubernetes.io/part-of": "bloomgrid"}
    for f in peers:
        if f is None or set(f) != {"podSelector"} or selects(f["podSelector"], stranger):
            fail("the nodes' internal port %d is admitted from %r: only the cluster's "
                 "own pods may reach it" % (internal, f))
    for labels in cluster:
        if not any(f and "podSelector" in f and selects(f["podSelector"], labels) for f in peers):
            fail("the nodes' internal port %d does not admit the pods %r" % (internal, labels))
    if len(failures) == before:
        print("ok: nodes' internal port %d: admitted from node, router and merger pods only"
              % internal)
    _, rules = rules_for("node", port_of("node", "listen"))
    if rules:
        fail("the nodes' public port (on loopback) is admitted: %r" % rules)
    rport = port_of("router", "listen")
    _, rules = rules_for("router", rport)
    if not any(not r.get("from") for r in rules):
        fail("the routers' public port %d is not admitted from clients (any source): %r"
             % (rport, rules))
    else:
        print("ok: routers' public port %d: admitted from clients" % rport)
    for prog in ("node", "router", "merger"):
        mport = port_of(prog, "metrics_listen")
        _, rules = rules_for(prog, mport)
        if not rules or any(not r.get("from") for r in rules):
            fail("%s metrics port %d: admitted from %r (expected the monitoring namespace)"
                 % (prog, mport, [r.get("from") for r in rules]))
    print("ok: metrics ports admitted from the monitoring namespace only")


def check_secrets():
    out = os.path.join(TMP, "secrets")
    shutil.rmtree(out, ignore_errors=True)
    r = subprocess.run(["sh", os.path.join(K8S, "make-secrets.sh"), out],
                       env=dict(os.environ, BLOOMGRID=CLI), capture_output=True, text=True)
    if r.returncode != 0:
        fail("make-secrets.sh: exit %d: %s" % (r.returncode, r.stderr))
        return
    with open(os.path.join(out, "secrets.yaml")) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    names = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    want = {"bloomgrid-tls": {"ca.pem", "node.pem", "node.key", "router.pem", "router.key",
                              "merger.pem", "merger.key"},
            "bloomgrid-tokens": {"tokens"}, "bloomgrid-batch-token": {"token"}}
    for n, keys in want.items():
        if n not in names or set(names[n]["data"]) != keys:
            fail("secrets.yaml: Secret %s should hold %s" % (n, sorted(keys)))
    if any("ca.key" in d.get("data", {}) for d in docs):
        fail("secrets.yaml holds the CA's key")

    # The SANs name every address the topology lists, and the Services.
    with open(os.path.join(K8S, "config.yaml")) as f:
        topo = ini(next(d for d in yaml.safe_load_all(f)
                        if d["metadata"]["name"] == "bloomgrid-topology")["data"]["topology.ini"])
    hosts = [a.rsplit(":", 1)[0] for s in topo.sections() if s != "__top__"
             for a in topo[s]["copies"].split()]

    def sans(cert):
        t = subprocess.run(["openssl", "x509", "-in", os.path.join(out, cert), "-noout",
                            "-ext", "subjectAltName"], capture_output=True, text=True).stdout
        return set(re.findall(r"DNS:([^,\s]+)", t))

    for cert, need in (("node.pem", hosts),
                       ("router.pem", ["bloomgrid-router", "bloomgrid-router.bloomgrid.svc.cluster.local"]),
                       ("merger.pem", ["bloomgrid-merger.bloomgrid.svc.cluster.local"])):
        v = subprocess.run(["openssl", "verify", "-CAfile", os.path.join(out, "ca.pem"),
                            os.path.join(out, cert)], capture_output=True, text=True)
        if v.returncode != 0:
            fail("%s is not signed by ca.pem: %s" % (cert, v.stdout + v.stderr))
        missing = set(need) - sans(cert)
        if missing:
            fail("%s does not name %s" % (cert, sorted(missing)))
    print("ok: certificates of the CA naming %d node addresses and the Services" % len(hosts))

    # The programs take the files: key matches certificate, tokens parse.
    tpath = os.path.join(TMP, "topology-secrets.ini")
    with open(tpath, "w") as f:
        f.write("version = 1\n[group g0]\ncopies = 127.0.0.1:7401\n")
    r = router_start_check(["--topology", tpath, "--tls-cert", os.path.join(out, "router.pem"),
                            "--tls-key", os.path.join(out, "router.key"),
                            "--tls-ca", os.path.join(out, "ca.pem"),
                            "--tokens-file", os.path.join(out, "tokens")])
    if r.returncode != 1:
        fail("bloomgrid-router refuses the made files (exit %d): %s" % (r.returncode, r.stderr.strip()))
    else:
        print("ok: bloomgrid-router accepts the router's TLS files and the tokens file")
    for tok in ("ops.token", "batch.token"):
        with open(os.path.join(out, tok)) as f:
            if not re.fullmatch(r"bgt_[0-9a-f]{64}\s*", f.read()):
                fail("%s does not hold a token" % tok)
        if os.stat(os.path.join(out, tok)).st_mode & 0o077:
            fail("%s is readable by others" % tok)


def check_reduce():
    rpath = os.path.join(BATCH, "reduce.sh")
    work = os.path.join(TMP, "reduce")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    # The real tool, except that `import` (a router's call) is recorded.
    fake = os.path.join(work, "bloomgrid")
    log = os.path.join(work, "imports")
    with open(fake, "w") as f:
        f.write('#!/bin/sh\nfor a; do [ "$a" = import ] && { echo "$*" >> %s; exit 0; }; done\n'
                'exec %s "$@"\n' % (log, CLI))
    os.chmod(fake, 0o755)

    def unique(i):
        return ["key-%d-%d" % (i, k) for k in range(50 + i)]

    def inspect(path):
        r = subprocess.run([CLI, "inspect", path, "--json"], capture_output=True, text=True)
        return json.loads(r.stdout)

    def run(name, parts, setup, split=unique, tmpl_args=("-n", "10000", "-p", "1%"), jq=None):
        shared = os.path.join(work, name)
        os.makedirs(os.path.join(shared, "input"))
        tmpl = os.path.join(shared, "template.bundle")
        subprocess.run([CLI, "build", tmpl] + list(tmpl_args), input="",
                       text=True, check=True, capture_output=True)
        pdir = os.path.join(shared, "runs", "r1", "parts")
        os.makedirs(pdir)
        for i in range(parts):
            path = os.path.join(shared, "input", "split-%d" % i)
            with open(path, "w") as f:
                f.write("".join(k + "\n" for k in split(i)))
            subprocess.run([CLI, "build", os.path.join(pdir, "part-%d.bundle" % i), "--like", tmpl,
                            path], check=True, capture_output=True)
        setup(shared, pdir)
        if os.path.exists(log):
            os.unlink(log)
        env = dict(os.environ, RUN="r1", PARTS=str(parts), FILTER="users", SHARED=shared,
                   WAIT_S="0", BLOOMGRID=fake)
        if jq is not None:
            env["JQ"] = jq
        r = subprocess.run(["sh", rpath], env=env, capture_output=True, text=True, timeout=120)
        imported = open(log).read() if os.path.exists(log) else ""
        return r, imported, shared

    def accepted(name, what, split=unique, tmpl_args=("-n", "10000", "-p", "1%"), jq=None,
                 check_parts=None):
        """A complete set: merged, its keys added the splits' lines, imported once."""
        r, imp, shared = run(name, 4, lambda s, p: None, split, tmpl_args, jq)
        g = os.path.join(shared, "runs", "r1", "global.bundle")
        lines = sum(len(split(i)) for i in range(4))
        if r.returncode != 0 or "users" not in imp or not os.path.exists(g):
            fail("reduce of %s: not imported (exit %d): %s" % (what, r.returncode, r.stderr))
            return
        if "4 partials, %d keys, imported into users" % lines not in r.stdout:
            fail("reduce of %s says %r, not %d keys" % (what, r.stdout, lines))
        got = inspect(g).get("keys_added")
        if got != lines:
            fail("reduce of %s: the merge holds %s keys added, the splits %d lines"
                 % (what, got, lines))
            return
        if check_parts:
            check_parts(shared)
        print("ok: reduce of %s merges and imports it (%d keys added): %s"
              % (what, got, r.stdout.strip()))

    # Unique keys, through jq and through python3's json.
    accepted("complete", "a complete set")
    accepted("python", "a complete set read with python3 (no jq)", jq="")

    # A key repeated inside a split ("a, b, a") and keys in every split:
    # each partial set fewer bits than its split has lines.
    def dups(i):
        return ["dup-%d" % (k % 25) for k in range(60 + i)]

    def fewer_inserts(shared):
        for i in range(4):
            d = inspect(os.path.join(shared, "runs", "r1", "parts", "part-%d.bundle" % i))
            if not (d["inserts"] <= 25 < d["keys_added"] == len(dups(i))):
                fail("partial %d of repeated keys: %d inserts, %s keys added"
                     % (i, d["inserts"], d["keys_added"]))
    accepted("duplicates", "splits with keys repeated inside and across them", dups,
             check_parts=fewer_inserts)

    # Splits far past the template's capacity: many keys find their bits
    # already set (false positives at add time), so inserts < keys.
    def big(i):
        return ["fp-%d-%d" % (i, k) for k in range(3000)]

    def false_positives(shared):
        for i in range(4):
            d = inspect(os.path.join(shared, "runs", "r1", "parts", "part-%d.bundle" % i))
            if not d["inserts"] < d["keys_added"] == 3000:
                fail("partial %d past capacity: %d inserts, %s keys added: no false positive"
                     % (i, d["inserts"], d["keys_added"]))
    accepted("fp", "splits large enough to meet false positives", big, ("-n", "300", "-p", "0.2"),
             check_parts=false_positives)

    def refused(name, setup, what, want):
        r, imp, shared = run(name, 4, setup)
        g = os.path.join(shared, "runs", "r1", "global.bundle")
        if r.returncode == 0 or imp or os.path.exists(g) or not re.search(want, r.stderr):
            fail("reduce with %s: exit %d, import %r, merged file %s: %s" %
                 (what, r.returncode, imp, os.path.exists(g), r.stderr.strip()))
        else:
            print("ok: reduce with %s refuses, nothing merged or imported: %s" %
                  (what, r.stderr.strip()))

    refused("missing", lambda s, p: os.unlink(os.path.join(p, "part-2.bundle")), "a partial missing",
            r"indexes: 2")

    def short(s, p):
        with open(os.path.join(s, "input", "split-1"), "a") as f:
            f.write("one-more\n")
    refused("short", short, "a partial short of its split's keys",
            r"part-1.bundle: built from 51 keys, its mapper read 52")

    def other(s, p):
        subprocess.run([CLI, "build", os.path.join(p, "part-3.bundle"), "--force", "-n", "10000",
                        "-p", "1%", os.path.join(s, "input", "split-3")], check=True,
                       capture_output=True)
    refused("other", other, "a partial of another filter", r"part-3.bundle: not a partial of")

    def corrupt(s, p):
        path = os.path.join(p, "part-0.bundle")
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0xff]))
    refused("corrupt", corrupt, "a corrupt partial", r"part-0.bundle: unreadable or corrupt")

    # A partial of file format 1 (an older bloomgrid's) records no count of
    # keys: refused when its split gives one.  The template and every
    # partial are the legacy node's blocked filter.
    v1 = os.path.join(SRC, "tests", "fixtures", "legacy-node-dir", "blk",
                      "snapshot-0000000000000001.bf")

    def old_format(s, p):
        shutil.copyfile(v1, os.path.join(s, "template.bundle"))
        for i in range(4):
            shutil.copyfile(v1, os.path.join(p, "part-%d.bundle" % i))
    refused("format1", old_format, "partials of file format 1", r"part-0.bundle records no count "
            r"of keys added \(a filter file of format version 1")


os.makedirs(TMP, exist_ok=True)
try:
    {"manifests": check_manifests, "secrets": check_secrets, "reduce": check_reduce,
     "hardening": check_hardening}[CHECK]()
except (KeyError, StopIteration, IndexError, ValueError) as e:
    # A manifest without a field or document these checks read.
    import traceback
    where = traceback.extract_tb(e.__traceback__)[-1]
    fail("a field or document is missing (%s %r, checked at manifests.py:%d: %s)"
         % (type(e).__name__, e.args[0] if e.args else "", where.lineno, where.line))
finish()

"""`spotrun-head CLUSTER --private-ip IP`: what runs on a head VM (control plane mode 'head').

Started over SSH by `spotrun up` (spotrun.client.head) after it shipped the cluster record, the
cluster's SSH key and the provider credentials into the head's secrets dir. Idempotent, so a
re-run of `up` is safe:
1. installs the record (with the workdir at the copy uploaded to this VM) and the key under
   this VM's $SPOTRUN_HOME, so the controller finds them as on any machine;
2. starts etcd on 0.0.0.0:PORT, advertised at the private IP the workers dial, unless it runs;
3. starts the controller daemon with the provider credentials in its environment, unless it runs.
Both outlive this process; it exits once they are up.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from spotrun import log
from spotrun.controller.bootstrap import REMOTE_SECRETS, REMOTE_WORKDIR
from spotrun.errors import SpotrunError
from spotrun.paths import cluster_dir, spotrun_home
from spotrun.state.clusterfile import ClusterFile

_log = log.get("head_node")


def install_record(cluster: str, secrets: Path) -> ClusterFile:
    """The shipped cluster record and key, installed for this VM's controller."""
    shipped = ClusterFile.from_json((secrets / "cluster.json").read_text())
    record = replace(shipped, workdir=str(Path(REMOTE_WORKDIR).expanduser()))
    if record.name != cluster:
        raise SpotrunError(f"the shipped record is for cluster {record.name!r}, not {cluster!r}")
    record.save()
    for name in ("id_ed25519", "id_ed25519.pub"):
        target = cluster_dir(cluster) / name
        shutil.copyfile(secrets / name, target)
        os.chmod(target, 0o600)
    return record


def provider_env(secrets: Path) -> dict[str, str]:
    env = json.loads((secrets / "provider-env.json").read_text())
    return {k: os.path.expanduser(v) if v.startswith("~/") else v for k, v in env.items()}


def ensure_etcd(port: int, private_ip: str) -> str:
    from spotrun.state import etcd_server

    endpoint = f"http://127.0.0.1:{port}"
    if etcd_server.healthy(endpoint):
        return endpoint
    root = spotrun_home() / "head-etcd"
    etcd_server.EtcdProcess(
        root / "data",
        port,
        port + 1,
        log_path=root / "etcd.log",
        detach=True,
        listen_host="0.0.0.0",
        advertise_host=private_ip,
    ).start()
    return endpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spotrun-head", description=__doc__.split("\n")[0])
    parser.add_argument("cluster")
    parser.add_argument("--private-ip", required=True, help="the address workers dial")
    parser.add_argument("--port", type=int, default=2379, help="etcd client port (peer: PORT+1)")
    args = parser.parse_args(argv)
    log.setup(1)
    secrets = Path(REMOTE_SECRETS).expanduser()
    try:
        install_record(args.cluster, secrets)
        os.environ.update(provider_env(secrets))
        endpoint = ensure_etcd(args.port, args.private_ip)
        from spotrun.controller.daemon import start_daemon

        pid = start_daemon(args.cluster)
    except (SpotrunError, OSError, ValueError) as exc:
        sys.stderr.write(f"spotrun-head: error: {exc}\n")
        return getattr(exc, "exit_code", 1)
    _log.info("head ready", extra=log.kv(cluster=args.cluster, etcd=endpoint, controller_pid=pid))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

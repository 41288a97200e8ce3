"""An external etcd that demands TLS client certificates: `spotrun up` ships the recipe's TLS files
to every VM, and the agent, the launcher, the rendezvous and the trainer all connect with them.

The etcd here accepts no client without a certificate signed by the test's CA, so a job that
trains to its last step proves every process on the VMs spoke TLS with the shipped files.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_recipe import SHARED_STEPS_ENV, local_recipe
from test_training_e2e import SCRIPTS, Job, steps_run

from spotrun.errors import ControlPlaneError
from spotrun.state import clusterfile, etcd_server
from spotrun.state.store import connect

pytestmark = pytest.mark.slow


def _write_pki(directory: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def issue(name: str, issuer_key, issuer_name, *, ca: bool = False, usage=None, san=None):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer_name or subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if usage:
            builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        cert = builder.sign(issuer_key or key, hashes.SHA256())
        return key, cert

    def save(stem: str, key, cert) -> None:
        (directory / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (directory / f"{stem}-key.pem").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )

    ca_key, ca_cert = issue("spotrun-test-ca", None, None, ca=True)
    save("ca", ca_key, ca_cert)
    save(
        "server",
        *issue(
            "127.0.0.1",
            ca_key,
            ca_cert.subject,
            usage=[ExtendedKeyUsageOID.SERVER_AUTH],
            san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        ),
    )
    save("client", *issue("spotrun-client", ca_key, ca_cert.subject, usage=[ExtendedKeyUsageOID.CLIENT_AUTH]))


@pytest.fixture
def tls_etcd(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A real etcd on loopback that requires client certificates from the test CA."""
    pki = tmp_path / "recipe" / "tls"
    _write_pki(pki)
    port, peer = etcd_server.free_port(), etcd_server.free_port()
    binary, _ = etcd_server.checked_binary()
    log = (tmp_path / "etcd.log").open("wb")
    proc = subprocess.Popen(
        [
            str(binary),
            "--name",
            "tls",
            "--data-dir",
            str(tmp_path / "etcd-data"),
            "--listen-client-urls",
            f"https://127.0.0.1:{port}",
            "--advertise-client-urls",
            f"https://127.0.0.1:{port}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-cluster",
            f"tls=http://127.0.0.1:{peer}",
            "--cert-file",
            str(pki / "server.pem"),
            "--key-file",
            str(pki / "server-key.pem"),
            "--client-cert-auth",
            "--trusted-ca-file",
            str(pki / "ca.pem"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                connect(
                    [f"https://127.0.0.1:{port}"],
                    ca=str(pki / "ca.pem"),
                    cert=str(pki / "client.pem"),
                    key=str(pki / "client-key.pem"),
                    timeout=1,
                ).close()
                break
            except ControlPlaneError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "etcd.log").read_text()[-2000:]
                time.sleep(0.2)
        yield port, pki
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def test_vms_reach_a_tls_etcd_with_the_shipped_certificates(
    tls_etcd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spotrun.client.down import down

    port, pki = tls_etcd
    home = tmp_path / "home"
    monkeypatch.setenv("SPOTRUN_HOME", str(home))
    with pytest.raises(ControlPlaneError):  # only the CA: the server wants a client certificate
        connect([f"https://127.0.0.1:{port}"], ca=str(pki / "ca.pem"), timeout=2)
    recipe_dir = pki.parent
    (recipe_dir / "work").mkdir()
    shutil.copy(SCRIPTS / "steps.py", recipe_dir / "work" / "steps.py")
    recipe = recipe_dir / "tls.yaml"
    recipe.write_text(
        local_recipe(
            "tls-e2e",
            target=2,
            max_nodes=3,
            run=steps_run(60, 0.01),
            env=SHARED_STEPS_ENV,
            checkpoint={"every_steps": 20, "keep": 2},
            control_plane={
                "mode": "external",
                "endpoints": [f"https://127.0.0.1:{port}"],
                "tls": {"ca": "tls/ca.pem", "cert": "tls/client.pem", "key": "tls/client-key.pem"},
            },
        )
    )
    job = Job(home, "tls-e2e", recipe)
    try:
        job.up(controller=False)
        job.wait(lambda: job.finished(60), what="step 60 over a TLS etcd")
        assert job.at_world(2) and job.duplicates() == []
        shipped = sorted((home / "local" / "vms").glob("*/home/.spotrun/secrets/etcd-*.pem"))
        assert [p.name for p in shipped] == ["etcd-ca.pem", "etcd-cert.pem", "etcd-key.pem"] * 2
        assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in shipped)
        assert shipped[2].read_bytes() == (pki / "client-key.pem").read_bytes()
    finally:
        if "tls-e2e" in clusterfile.names():
            down("tls-e2e", purge=True)

"""Host keys spotrun generates for a cloud VM, and the cloud-init user data that installs them.

spotrun makes each VM's SSH host key itself (ed25519) and hands the private half to cloud-init,
so the public half is known before the VM boots and SSH can pin it (never trust on first use).
The price: the private host key sits in the VM's user data, readable by whoever may read the
instance's attributes in the cloud account; it protects against a network attacker, not against
the account's own admins. Used by the aws, gcp and azure providers; imports only `cryptography`
(inside the function).
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class HostKey:
    """An ed25519 host key: `private` in OpenSSH PEM form, `public` as "ssh-ed25519 BASE64"."""

    private: str
    public: str


def new_host_key() -> HostKey:
    """A fresh ed25519 host key (no ssh-keygen needed; `cryptography` ships with paramiko)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return HostKey(private=private, public=public)


def user_data(host_key: HostKey, authorized_key: str, *, cluster: str, ssh_user: str) -> str:
    """`#cloud-config` that installs `host_key` as the only SSH host key and authorizes
    `authorized_key` for `ssh_user`. JSON is valid YAML, so the body is JSON (no YAML library).

    The node agent is installed afterwards by spotrun's SSH bootstrap, which pins this key.
    """
    config = {
        "ssh_deletekeys": True,  # drop the image's keys ...
        "ssh_genkeytypes": [],  # ... and generate none: ours is the only host key
        "ssh_keys": {"ed25519_private": host_key.private, "ed25519_public": host_key.public},
        "users": [
            "default",
            {
                "name": ssh_user,
                "ssh_authorized_keys": [authorized_key.strip()],
                "sudo": "ALL=(ALL) NOPASSWD:ALL",
                "shell": "/bin/bash",
            },
        ],
        "write_files": [{"path": "/etc/spotrun/cluster", "content": cluster + "\n", "permissions": "0644"}],
    }
    return "#cloud-config\n" + json.dumps(config, indent=1) + "\n"

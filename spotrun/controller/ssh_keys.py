"""SSH key pairs spotrun generates (ed25519, OpenSSH format) with ssh-keygen."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from spotrun.errors import SpotrunError


def ensure_keypair(path: Path, comment: str) -> str:
    """Create `path` and `path.pub` unless both exist; return the public key line. Idempotent."""
    pub = Path(f"{path}.pub")
    if not (path.is_file() and pub.is_file()):
        if shutil.which("ssh-keygen") is None:
            raise SpotrunError("ssh-keygen is not installed", hint="apt-get install openssh-client")
        path.unlink(missing_ok=True)
        pub.unlink(missing_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
            check=True,
            capture_output=True,
        )
    return pub.read_text().strip()

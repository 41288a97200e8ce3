#!/usr/bin/env bash
# Install spotrun and what it needs. Idempotent: run it again to repair or update.
#
#   ./install.sh          user install: venv in $SPOTRUN_HOME/venv (default ~/.spotrun/venv),
#                         `spotrun` linked into /usr/local/bin (root) or ~/.local/bin
#   ./install.sh --dev    development install: editable into ./.venv with the test extras
#
# As root it installs the system packages (etcd-server, openssh-server, ...) with apt-get.
# Without root it checks for them and prints the exact command to run.
# SPOTRUN_TORCH overrides the torch requirement (default: torch==2.13.0, the CPU build;
# set SPOTRUN_TORCH=torch on a GPU machine to get the CUDA build).
set -euo pipefail

MODE=user
for arg in "$@"; do
  case "$arg" in
    --dev) MODE=dev ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown option '$arg' (use --dev or --help)" >&2; exit 2 ;;
  esac
done

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TORCH_REQ="${SPOTRUN_TORCH:-torch==2.13.0}"
say() { printf 'install.sh: %s\n' "$*" >&2; }

# --- system packages -------------------------------------------------------------------
# binary -> Debian package that provides it
declare -A NEEDS=([etcd]=etcd-server [sshd]=openssh-server [ssh-keygen]=openssh-client
                  [unshare]=util-linux [python3]=python3)
[ "$MODE" = dev ] && NEEDS[tmux]=tmux
missing=()
for bin in "${!NEEDS[@]}"; do
  command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || missing+=("${NEEDS[$bin]}")
done
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)

if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    say "installing system packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    say "missing system packages: ${missing[*]}"
    say "run:  sudo apt-get install -y ${missing[*]}   (then run ./install.sh again)"
    exit 1
  fi
fi
python3 - <<'PY' || { say "spotrun needs Python >= 3.10"; exit 1; }
import sys; sys.exit(sys.version_info < (3, 10))
PY

# --- python environment ----------------------------------------------------------------
if [ "$MODE" = dev ]; then
  VENV="$REPO/.venv"
else
  VENV="${SPOTRUN_HOME:-$HOME/.spotrun}/venv"
fi
if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtualenv $VENV"
  python3 -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
say "installing $TORCH_REQ"
"${PIP[@]}" install "$TORCH_REQ"
if [ "$MODE" = dev ]; then
  say "installing spotrun (editable) with test extras"
  "${PIP[@]}" install -e "$REPO[test]"
else
  say "installing spotrun"
  "${PIP[@]}" install "$REPO"
fi

# --- put `spotrun` on PATH -------------------------------------------------------------
if [ "$(id -u)" -eq 0 ]; then BIN_DIR=/usr/local/bin; else BIN_DIR="$HOME/.local/bin"; fi
mkdir -p "$BIN_DIR"
ln -sf "$VENV/bin/spotrun" "$BIN_DIR/spotrun"
"$BIN_DIR/spotrun" --version >/dev/null
say "ready: $BIN_DIR/spotrun -> $VENV/bin/spotrun"
case ":$PATH:" in
  *":$BIN_DIR:"*) ;;
  *) say "note: $BIN_DIR is not on your PATH; add it:  export PATH=\"$BIN_DIR:\$PATH\"" ;;
esac

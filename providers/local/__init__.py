"""The local provider: real sshd VMs on loopback with emulated cloud metadata endpoints."""

"""The control plane's logic: the reconcile loop, the pure plan, provisioning, bootstrap, chaos,
the daemon and the head VM's entry point. Runs on the user's machine or on the head VM."""

"""Cluster state: the only package that talks to etcd (connection, leases, watches, the key
schema), the typed records stored there, the ledger arithmetic and the local cluster records."""

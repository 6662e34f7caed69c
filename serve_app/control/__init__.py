"""Control-plane services that ingress replicas share (key change notices, limits, ledger)."""

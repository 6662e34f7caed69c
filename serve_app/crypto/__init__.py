"""The crypto RPC proxy: `/crypto/rpc/{network}` forwards JSON-RPC calls to the operator's
blockchain nodes (networks.py: configs/crypto_rpc.yaml; methods.py: what is forwarded and at
which tier; service.py: limits, billing per credit, the forwarding itself)."""

"""What both ends agree on: the wire format and its checks (wire.py), addresses
(address.py), CURVE keys (auth.py), VSGD's coordinate samples (sampling.py) and the
transmission plan's format (plan.py). docs/protocol.md is the normative text."""

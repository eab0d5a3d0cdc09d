"""What both ends agree on: the wire format and its checks (wire.py, checks.py), addresses
(address.py), CURVE on the sockets (auth.py; its key files are minips.provision's), VSGD's
coordinate samples (sampling.py), a shard's slice of a parameter (slices.py; the partition
that places them is minips.group's) and what a group's shards and clients agree on
(group.py). A transmission plan's format is minips.transmission.plan. docs/protocol.md is
the normative text."""

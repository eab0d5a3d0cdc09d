"""What both ends agree on: the wire format and what it may carry (wire.py, formats.py;
the checks of a peer's frames are minips/guard/wire_checks.py), CURVE on
the sockets (auth.py; its key files are minips.provision's) and VSGD's coordinate samples
(sampling.py; a shard's part of them is minips.group's). A transmission plan's format is
minips.transmission.plan. docs/protocol.md is the normative text."""

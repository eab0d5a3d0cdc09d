"""What guards a socket before it is used: the addresses a server binds and a client
connects to, checked and explained in one line (addresses.py), and the CURVE keys that
secure it, with the allow-list and the operator check (curve.py). A leaf of the
operations: it imports only the core and minips/errors.py, so ops/, group/, run/, cli/
and provision/ all may use it. The core takes an address as given and keys as something
that secures its socket; whoever builds it checks the one and gives the other."""

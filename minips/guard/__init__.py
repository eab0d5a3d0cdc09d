"""What guards a socket before it is used: the addresses a server binds and a client
connects to, checked and explained in one line (addresses.py), and the CURVE keys that
secure it, with the allow-list and the operator check (curve.py); and the checks a
peer's frames must pass before anything in them is trusted (wire_checks.py). A leaf of the
operations: it imports only the core and minips/errors.py, so ops/, group/, run/, cli/
and provision/ all may use it. The core takes an address as given, keys as something that
secures its socket and a message as merely well-formed; whoever builds it checks them."""

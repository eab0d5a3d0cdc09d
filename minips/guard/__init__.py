"""What guards a socket before it is used: the addresses a server binds and a client
connects to, checked and explained in one line (addresses.py). A leaf of the operations:
it imports only the core and minips/errors.py, so ops/, group/, run/ and cli/ all may use
it. The core takes an address as given; whoever builds it checks it here first."""

"""The server's state: the parameter store and the worker registry."""

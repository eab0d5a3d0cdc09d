"""A server group: what a shard adds to a server, and the client's fan-out."""

"""A server group: the partition of a model over its shards, what a shard adds to a server,
and the client's fan-out."""

"""Shard balance: the bytes each shard of a server group holds, for every zoo model.

    python tools/partition_table.py [--servers 2,3,4,8]

The partition (minips/group/partition.py, docs/protocol.md 16.1) is exact, so these are
the bytes each shard stores and, under the plain plan, receives from every worker's step
and sends back with every pull. Prints per model and K: each shard's bytes, the mean, and
the largest shard over the mean.
"""

from __future__ import annotations

import argparse

from minips.group.partition import partition_of_model
from minips.nn import build_model
from minips.nn.zoo import MODEL_NAMES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="2,3,4,8")
    args = parser.parse_args()
    print("| model | K | bytes per shard | mean | largest / mean |")
    print("| --- | --- | --- | --- | --- |")
    for name in MODEL_NAMES:
        params = build_model(name).params
        for servers in (int(k) for k in args.servers.split(",")):
            shard_bytes = partition_of_model(params, servers).shard_bytes()
            mean = sum(shard_bytes) / servers
            listed = ", ".join(f"{b:,}" for b in shard_bytes)
            print(
                f"| {name} | {servers} | {listed} | {mean:,.0f} | {max(shard_bytes) / mean:.3f} |"
            )


if __name__ == "__main__":
    main()

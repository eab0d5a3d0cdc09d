"""Browser workers: a web gateway that serves a JavaScript worker page and relays its
WebSocket messages to a parameter server (docs/protocol.md §14, docs/model.md).

    from minips.classroom.web import start_gateway
    with start_gateway("tcp://127.0.0.1:5555", listen="127.0.0.1:0") as gateway:
        print("students open", gateway.url)

Needs the optional extra: pip install 'minips[web]'.
"""

__all__ = ["Gateway", "RunningGateway", "check_installed", "start_gateway"]


def __getattr__(name: str) -> object:
    """The gateway's names, imported when first used: `minips run` imports this package for
    its browser slots (slots.py), and every run would otherwise import websockets and
    asyncio too, browsers or not (PEP 562)."""
    if name in ("Gateway", "check_installed"):
        from minips.classroom.web import gateway

        return getattr(gateway, name)
    if name in ("RunningGateway", "start_gateway"):
        from minips.classroom.web import running

        return getattr(running, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

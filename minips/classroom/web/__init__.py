"""Browser workers: a web gateway that serves a JavaScript worker page and relays its
WebSocket messages to a parameter server (docs/protocol.md §14, docs/model.md).

    from minips.classroom.web import start_gateway
    with start_gateway("tcp://127.0.0.1:5555", listen="127.0.0.1:0") as gateway:
        print("students open", gateway.url)

Needs the optional extra: pip install 'minips[web]'.
"""

from minips.classroom.web.gateway import Gateway, check_installed
from minips.classroom.web.running import RunningGateway, start_gateway

__all__ = ["Gateway", "RunningGateway", "check_installed", "start_gateway"]

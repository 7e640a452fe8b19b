"""What a provider says of a hosted call while it runs, as the task's progress (issue 48).

huggingface_hub sends fal-ai's queued tasks (image-to-image, text-to-video, image-to-video, image-segmentation)
into fal's queue and polls the request's status itself, every 0.5 s, until it is COMPLETED. Each status answer,
seen by our HTTP client's response hook (`hubclient.install_hub_client`), becomes a progress report of the task:
`queued` with how many requests are ahead, then `running`. replicate is asked with `Prefer: wait`, one request
that blocks until the prediction ends: there is nothing to relay before its answer.

Only a number and the provider's name (the router path's first part, checked) reach the event; nothing of the
provider's logs or URLs.
"""

from __future__ import annotations

import re
from typing import Any

from .. import taskprogress
from ..modelhost.progress import QUEUED, RUNNING

# <router>/<provider>/<app...>/requests/<id>/status: fal's queue status, as huggingface_hub asks for it
QUEUE_STATUS = re.compile(r"^/(?P<provider>[a-z0-9][a-z0-9-]{0,39})/.+/requests/[^/]+/status$")
MAX_POSITION = 1_000_000  # a larger position is no number a person counts: said without it


def queue_event(status: Any, provider: str) -> dict[str, Any] | None:
    """The progress report for one answer of a queue's status poll; None for any other answer."""
    if not isinstance(status, dict):
        return None
    state = status.get("status")
    if state == "IN_QUEUE":
        position = status.get("queue_position")
        if isinstance(position, int) and not isinstance(position, bool) and 0 <= position <= MAX_POSITION:
            ahead = "next" if position == 0 else f"{position} ahead"
            return {"phase": QUEUED, "waiting": f"{ahead} in {provider}'s queue"}
        return {"phase": QUEUED, "waiting": f"in {provider}'s queue"}
    if state == "IN_PROGRESS":
        return {"phase": RUNNING, "waiting": f"at {provider}"}
    return None


def on_status(path: str, response: Any) -> None:
    """A router response of a hosted call (`path`: its path below the router): a queue's status, reported."""
    match = QUEUE_STATUS.match(path)
    if match is None or response.request.method != "GET" or response.status_code != 200:
        return
    response.read()  # a response hook sees the response before its body: the client reads it again from memory
    try:
        status = response.json()
    except ValueError:
        return
    event = queue_event(status, match["provider"])
    if event is not None:
        taskprogress.report(event)

"""What the handlers of one server share: the model, the options, the tick thread, the
metrics, and the count of session slots in use."""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from .webrtc.client_keys import ClientKeys

if TYPE_CHECKING:
    from personaplex_edge.runtime.api import Model
    from personaplex_edge.runtime.persona import Persona
    from personaplex_edge.runtime.sampling import SamplingParams

    from .hosts import HostRule
    from .params import Voices
    from .session import Session
    from .stats import ServerStats
    from .ticker import Ticker
    from .webrtc.call_stats import CallMetrics
    from .webrtc.ice import IceOptions


@dataclass
class ServerState:
    model: "Model"
    model_name: str
    sampling: "SamplingParams"  # each conversation's defaults
    persona: "Persona"
    voices: "Voices"
    top_k_max: tuple[int, int]  # (text, audio): the largest top-k of the model's graphs
    ticker: "Ticker"
    stats: "ServerStats"
    prefill_pool: ThreadPoolExecutor
    max_sessions: int
    max_backlog: int
    send_queue: int
    max_ahead_s: float | None  # how far a client's audio may run ahead of the clock
    hosts: "HostRule"  # the names the page and the WebSockets answer to
    auth_token: str | None = None
    allowed_origins: tuple[str, ...] = ()  # browser origins besides the server's own ("*": any)
    default_voice: str | None = None  # the name /api/voices shows as preselected
    slots_used: int = 0  # connections holding a slot: in prefill or in conversation
    stopping: bool = False
    sessions: set["Session"] = field(default_factory=set)
    # summaries of the sessions that ended (newest last): for the logs' readers and benchmarks
    history: deque = field(default_factory=lambda: deque(maxlen=1000))
    # WebRTC (webrtc/): the candidates and ICE servers of calls, the calls by id, their
    # metrics, and the unspent client keys
    ice: "IceOptions | None" = None
    calls: dict = field(default_factory=dict)
    call_metrics: "CallMetrics | None" = None
    client_keys: ClientKeys = field(default_factory=ClientKeys)

    @property
    def accepting(self) -> bool:
        return not self.stopping and self.slots_used < self.max_sessions


STATE = web.AppKey("personaplex_state", ServerState)

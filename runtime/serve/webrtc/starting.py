"""A call's starting session - a client key's, the offer form's - checked as the call will take
it, by the one function every way in uses: `POST /v1/realtime/client_secrets` and the beta's
`/v1/realtime/sessions` mint no key for a session its call would refuse, and a call refuses a
bad one (400, `invalid_session`) before it takes a slot or spends its key.

What a call refuses of its starting session is what its session.update would be refused:

    the shape and the formats          realtime_events.parse_session_update
    instructions over MAX_TEXT_PROMPT_CHARS
    a voice this server has not        (a voice of OpenAI's own passes: the bank's default
                                        speaks instead, as on the WebSocket)

A transcription asked of a model without a transcriber is no refusal: the call says so in an
`error` event after session.created and goes on (OpenAI's Agents SDK asks for it by default).
"""

from __future__ import annotations

from pathlib import Path

from ...pcm_frames import PCM16
from ..params import ParamError
from ..realtime import bank_voice, check_instructions
from ..realtime_events import SessionUpdate, SessionView, new_id, parse_session_update
from ..state import ServerState


def check_start(state: ServerState, session: dict) -> SessionUpdate:
    """The session's fields as a call reads them; EventError naming the first one a call
    would refuse."""
    update = parse_session_update({"type": "session.update", "session": session})
    check_instructions(update)
    if update.voice is not None and update.voice.strip():
        bank_voice(state, update)
    return update


def starting_view(state: ServerState, update: SessionUpdate) -> SessionView:
    """What the call's session.created will show of a start from `update` (a key's answer
    shows it too)."""
    transcriber = state.model.loaded.transcriber
    transcription = None
    if update.transcription and transcriber is not None:
        name = transcriber.source
        transcription = {"model": Path(name).name if name and Path(name).is_absolute()
                         else name}
    instructions = state.persona.text_prompt or "" if update.instructions is None \
        else update.instructions.strip()
    return SessionView(id=new_id("sess"), model=state.model_name, instructions=instructions,
                       voice=_shown_voice(state, update),
                       input_format=update.input_format or PCM16, transcription=transcription)


def _shown_voice(state: ServerState, update: SessionUpdate) -> str | None:
    if update.voice is None or not update.voice.strip():
        return state.default_voice
    try:
        return Path(state.voices.resolve(update.voice)).name
    except ParamError:  # one of OpenAI's: the bank's default speaks
        return state.default_voice

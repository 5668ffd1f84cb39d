"""The user's words from the transcriber's tokens (runtime/heard.py), on scripted token streams
whose words, times and turn ends are worked out by hand from the rules: a word is its pieces
from the one after an EPAD to the next PAD or EPAD (or a piece starting a new word); its start
and end are the frames of its first piece and of the one after its last, less the model's
delay (0.5 s); with VAD heads a turn ends 8 frames (0.5 s rounded up, plus one) after the 2 s
head passes 0.6, without them a second (12 frames) after the last piece."""

from __future__ import annotations

import pytest

from personaplex_edge.runtime.heard import HeardStream

PAD, EPAD = 3, 0
PIECES = {10: " hel", 11: "lo", 12: " world", 13: " again"}


def _stream(vad: bool) -> HeardStream:
    return HeardStream(lambda t: PIECES.get(t, ""), 0.08, 0.5, 7, vad=vad)


def _feed(stream, script):
    """script: (token, p_silence) per frame -> every event, in order."""
    events = []
    for token, p in script:
        events += stream.feed(token, p)
    return events


def test_words_and_a_vad_turn_end():
    script = ([(PAD, 1.0)] * 10  # silence before anything is said: no turn to end
              + [(EPAD, 0.0), (10, 0.0), (11, 0.0), (PAD, 0.1),  # frames 10-13: "hello"
                 (EPAD, 0.1), (12, 0.1), (13, 0.2),  # 14-16: "world", "again" without EPAD
                 (PAD, 0.7)]  # frame 17: the 2 s head says the turn is over
              + [(PAD, 0.9)] * 10)
    events = _feed(_stream(vad=True), script)
    pieces = [e for e in events if e.kind == "piece"]
    assert [(e.text, e.frame) for e in pieces] == [(" hel", 11), ("lo", 12), (" world", 15),
                                                    (" again", 16)]
    words = [e for e in events if e.kind == "word"]
    assert [(e.text, e.frame) for e in words] == [("hello", 13), ("world", 16), ("again", 17)]
    assert [t for e in words for t in (e.start, e.end)] == pytest.approx(
        [0.38, 0.54, 0.70, 0.78, 0.78, 0.86])
    turns = [e for e in events if e.kind == "turn"]
    assert len(turns) == 1
    assert (turns[0].text, turns[0].frame, turns[0].item) == ("hello world again", 25, 1)
    assert (turns[0].start, turns[0].end) == pytest.approx((0.38, 0.86))
    assert {e.item for e in events} == {1}


def test_a_word_written_after_the_vad_still_joins_its_turn_and_items_count_on():
    stream = _stream(vad=True)
    events = _feed(stream, [(EPAD, 0.0), (10, 0.0), (PAD, 0.9)]  # "hel" at 1, VAD at 2
                   + [(PAD, 0.9)] * 3 + [(EPAD, 0.9), (12, 0.9)]  # " world" at 7, in the flush
                   + [(PAD, 0.9)] * 4)  # the turn ends at frame 2 + 8 = 10
    turns = [e for e in events if e.kind == "turn"]
    assert [(t.text, t.frame) for t in turns] == [("hel world", 10)]
    events = _feed(stream, [(EPAD, 0.0), (13, 0.0), (PAD, 0.0)])
    assert [e.item for e in events] == [2, 2]  # the next turn's piece and word


def test_without_vad_a_turn_ends_a_second_after_the_last_piece():
    events = _feed(_stream(vad=False), [(EPAD, None), (10, None), (11, None)]  # pieces 1, 2
                   + [(PAD, None)] * 13)
    turns = [e for e in events if e.kind == "turn"]
    assert [(t.text, t.frame) for t in turns] == [("hello", 14)]  # 2 + 12


def test_padding_alone_makes_nothing():
    assert _feed(_stream(vad=True), [(PAD, 0.99), (EPAD, 0.99)] * 20) == []

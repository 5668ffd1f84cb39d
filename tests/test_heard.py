"""The user's words from the transcriber's tokens (runtime/words/heard.py), on scripted token
streams whose words, times and turn ends are worked out by hand from the rules: a word is its
pieces from the one after an EPAD to the next EPAD (PADs between them included, as Kyutai's
timestamping reads them), or to a piece starting a new word, or to its turn's end; its start and
end are the frames of its first piece and of the one after its last, less the model's delay (0.5
s); with VAD heads a turn ends 8 frames (0.5 s rounded up, plus one) after the 2 s head passes
0.6 or after close_turn, without them a second (12 frames) after the last piece, and never
inside a word; a turn's piece events joined are its text."""

from __future__ import annotations

import pytest

from personaplex_edge.runtime.words.heard import HeardStream
from personaplex_edge.streams import TEXT_EPAD as EPAD
from personaplex_edge.streams import TEXT_PAD as PAD

PIECES = {10: " hel", 11: "lo", 12: " world", 13: " again", 14: " wor", 15: "ld", 16: " "}


class _Text:
    """The transcriber tokenizer's part a stream reads."""

    epad = EPAD

    def piece(self, token):
        return PIECES.get(token, "")


def _stream(vad: bool) -> HeardStream:
    return HeardStream(_Text(), 0.08, 0.5, 7, vad=vad)


def _feed(stream, script):
    """script: (token, p_silence) per frame -> every event, in order."""
    events = []
    for token, p in script:
        events += stream.feed(token, p)
    return events


def _kinds(events, kind):
    return [e for e in events if e.kind == kind]


def test_words_and_a_vad_turn_end():
    script = ([(PAD, 1.0)] * 10  # silence before anything is said: no turn to end
              + [(EPAD, 0.0), (10, 0.0), (11, 0.0), (PAD, 0.1),  # frames 10-13: "hello"
                 (EPAD, 0.1), (12, 0.1), (13, 0.2),  # 14-16: "world", "again" without EPAD
                 (PAD, 0.7)]  # frame 17: the 2 s head says the turn is over
              + [(PAD, 0.9)] * 10)
    events = _feed(_stream(vad=True), script)
    # what each piece adds to the turn's text: no space before the turn's first
    assert [(e.text, e.frame) for e in _kinds(events, "piece")] == [
        ("hel", 11), ("lo", 12), (" world", 15), (" again", 16)]
    # a word is done at the next EPAD, the next word's piece, or its turn's end
    words = _kinds(events, "word")
    assert [(e.text, e.frame) for e in words] == [("hello", 14), ("world", 16), ("again", 25)]
    assert [t for e in words for t in (e.start, e.end)] == pytest.approx(
        [0.38, 0.54, 0.70, 0.78, 0.78, 0.86])
    turns = _kinds(events, "turn")
    assert len(turns) == 1
    assert (turns[0].text, turns[0].frame, turns[0].item) == ("hello world again", 25, 1)
    assert (turns[0].start, turns[0].end) == pytest.approx((0.38, 0.86))
    assert {e.item for e in events} == {1}


def test_a_word_written_after_the_vad_still_joins_its_turn_and_items_count_on():
    stream = _stream(vad=True)
    events = _feed(stream, [(EPAD, 0.0), (10, 0.0), (PAD, 0.9)]  # "hel" at 1, VAD at 2
                   + [(PAD, 0.9)] * 3 + [(EPAD, 0.9), (12, 0.9)]  # " world" at 7, in the flush
                   + [(PAD, 0.9)] * 4)  # the turn ends at frame 2 + 8 = 10
    turns = _kinds(events, "turn")
    assert [(t.text, t.frame) for t in turns] == [("hel world", 10)]
    events = _feed(stream, [(EPAD, 0.0), (13, 0.0), (PAD, 0.0)])
    assert [e.item for e in events] == [2]  # the next turn's piece (its word is not done yet)


def test_without_vad_a_turn_ends_a_second_after_the_last_piece():
    events = _feed(_stream(vad=False), [(EPAD, None), (10, None), (11, None)]  # pieces 1, 2
                   + [(PAD, None)] * 13)
    turns = _kinds(events, "turn")
    assert [(t.text, t.frame) for t in turns] == [("hello", 14)]  # 2 + 12


def test_padding_alone_makes_nothing():
    assert _feed(_stream(vad=True), [(PAD, 0.99), (EPAD, 0.99)] * 20) == []


def test_a_pad_inside_a_word_does_not_split_it():
    """EPAD " wor" PAD "ld": one word, as Kyutai's timestamping reads everything between two
    EPADs; the pieces joined, the word and the turn all read "world"."""
    events = _feed(_stream(vad=False), [(PAD, None)] * 10
                   + [(EPAD, None), (14, None), (PAD, None), (15, None)] + [(PAD, None)] * 12)
    assert [(w.text, w.start, w.end) for w in _kinds(events, "word")] == [
        ("world", pytest.approx(0.38), pytest.approx(0.62))]  # frames 11 .. 14 (13 + 1)
    assert [t.text for t in _kinds(events, "turn")] == ["world"]
    assert "".join(e.text for e in _kinds(events, "piece")) == "world"


def test_a_turn_due_inside_a_word_ends_after_it():
    """The VAD's turn end falls on the frame of " wor": the turn waits for "ld" and ends at
    the next frame that does not go on with the word; the word after is the next turn's."""
    stream = _stream(vad=True)
    script = ([(EPAD, 0.0), (10, 0.0), (11, 0.0), (PAD, 0.9)]  # "hello"; VAD at 3: due at 11
              + [(PAD, 0.9)] * 6 + [(EPAD, 0.9), (14, 0.9), (15, 0.9)]  # " wor" at 11, "ld"
              + [(12, 0.9), (PAD, 0.9)])  # " world" at 13: a new word, the next turn's
    events = _feed(stream, script)
    turns = _kinds(events, "turn")
    assert [(t.text, t.frame, t.item) for t in turns] == [("hello world", 13, 1)]
    assert [(e.text, e.item) for e in _kinds(events, "piece")] == [
        ("hel", 1), ("lo", 1), (" wor", 1), ("ld", 1), ("world", 2)]


def test_a_close_before_the_first_piece_ends_the_turn_once_its_words_are_written():
    """Push-to-talk: "hello" said, the button released before its text (0.5 s behind) is
    written; "again" said right after. The turn ends 8 frames after the release with the
    words written by then; "again" is the next turn."""
    stream = _stream(vad=False)
    events = _feed(stream, [(PAD, None)] * 3)
    stream.close_turn()  # after frame 2: nothing written yet
    events += _feed(stream, [(PAD, None)] * 3 + [(EPAD, None), (10, None), (11, None),
                                                 (PAD, None)]  # "hello" at 7, 8: due at 10
                    + [(PAD, None), (EPAD, None), (13, None), (PAD, None)])  # " again" at 12
    turns = _kinds(events, "turn")
    assert [(t.text, t.frame, t.item) for t in turns] == [("hello", 10, 1)]
    assert [(e.text, e.item) for e in _kinds(events, "piece")][-1] == ("again", 2)


def test_a_close_with_nothing_said_ends_nothing_and_is_spent():
    stream = _stream(vad=False)
    stream.close_turn()
    events = _feed(stream, [(PAD, None)] * 10 + [(EPAD, None), (10, None), (11, None)])
    assert not _kinds(events, "turn")
    assert stream.end_turn()[-1].text == "hello"  # the close did not carry over


def test_end_turn_ends_it_now_with_its_open_word():
    stream = _stream(vad=True)
    _feed(stream, [(EPAD, 0.0), (10, 0.0), (11, 0.0)])
    events = stream.end_turn()
    assert [(e.kind, e.text, e.item) for e in events] == [("word", "hello", 1),
                                                          ("turn", "hello", 1)]
    assert stream.end_turn() == []


@pytest.mark.parametrize("script", [
    [EPAD, 10, 11, PAD, EPAD, 12, 13, PAD],  # words with and without their EPAD
    [EPAD, 16, 11, PAD, EPAD, 14, PAD, PAD, 15],  # a bare word marker, a PAD inside a word
    [10, EPAD, 14, EPAD, 15, 16, EPAD, 16, PAD],  # a word of nothing but a marker
])
def test_a_turns_pieces_joined_are_its_text(script):
    events = _feed(_stream(vad=False), [(t, None) for t in script] + [(PAD, None)] * 12)
    [turn] = _kinds(events, "turn")
    assert "".join(e.text for e in _kinds(events, "piece")) == turn.text
    assert turn.text == " ".join(w.text for w in _kinds(events, "word"))
    assert not turn.text.startswith(" ") and "  " not in turn.text

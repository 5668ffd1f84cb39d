"""The words' channel: what the model says and what it hears, beside the audio.

    text            the text tokenizer, pieces and their per-frame records (Transcript)
    say             words an app makes the model say (a SAY's state machine over the text
                    stream), say_message: their wire form on stdio and /api/chat
    transcriber     Kyutai's STT step beside the model's on the same Mimi codes
    heard           the user's words it writes: pieces, timed words, turn ends;
                    heard_message: their wire form
    message_kind    the first byte of each framed message (moshi's protocol and stdio)

The core loop (runtime/lockstep.py, conversation.py) steps these; the front ends carry their
messages.
"""

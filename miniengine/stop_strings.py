"""Stop strings: text that ends a completion, with vLLM's semantics.

A stop string is text, not a token: it can end inside a token (the token " x)\\n" completes the stop string ")"),
or span several.  So the engine stops on token ids (end-of-text, ``stop_token_ids``) itself, and the layer that
decodes text (``LLM``) looks for stop strings in each completion's decoded output after every step:

* the completion's text ends just before the stop string, or just after it with ``include_stop_str_in_output``;
  its token_ids keep every token it generated, the one that completed the stop string included;
* the completion ends then (finish_reason "stop", stop_reason the string) and its KV memory is freed;
* of several stop strings, the one whose first occurrence ends earliest in the text wins (at the same end, the
  longer one: it starts earlier, so less text is kept);
* while streaming, the last ``max(len(s) for s in stop) - 1`` characters are held back: they could still turn out
  to be the start of a stop string that the next token completes, and text once sent cannot be taken back.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class StopMatch:
    stop: str
    start: int  # where the stop string begins in the text
    end: int    # just after it


def find_stop(text: str, stops) -> StopMatch | None:
    """The earliest-ending occurrence of any of ``stops`` in ``text``, or None."""
    best = None
    for stop in stops:
        start = text.find(stop)
        if start >= 0:
            match = StopMatch(stop, start, start + len(stop))
            if best is None or (match.end, match.start) < (best.end, best.start):
                best = match
    return best


def stopped_text(text: str, match: StopMatch, include_stop_str_in_output: bool) -> str:
    """The completion's final text once ``match`` ended it."""
    return text[: match.end if include_stop_str_in_output else match.start]


def held_back(stops) -> int:
    """Characters a stream keeps back from a running completion's end: a stop string's length less one."""
    return max((len(s) for s in stops), default=1) - 1


def sendable(text: str, stops, finished: bool) -> str:
    """The prefix of a completion's text that a stream may send now.  A finished completion's text is final.  A
    running one's last characters are held back, and so is a trailing incomplete character (U+FFFD: one character
    can span several byte-level tokens, and the next token completes it)."""
    if finished:
        return text
    text = text.rstrip("\ufffd")
    keep = held_back(stops)
    return text[: max(0, len(text) - keep)]  # (a text shorter than what is held back sends nothing yet)


class StopStringRules:
    """The functions above as one object: the StopStrings plug point's default (EngineConfig.stop_strings=None).
    A student's own (Lab 10) is any object with find_stop and sendable of these signatures."""

    find_stop = staticmethod(find_stop)
    sendable = staticmethod(sendable)

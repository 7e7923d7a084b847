"""One choice of a completion response: its text so far, what a stream has sent of it, its logprobs.

A stream may send only text that cannot change: while a choice runs, a trailing incomplete character and the
last ``max(len(stop)) - 1`` characters are held back (miniengine/stop_strings.py, ``sendable``).  Tokens and their
logprobs are sent as they come; the text that goes with them may follow a chunk later.

Logprobs use the legacy completions format: ``tokens`` (each token's text), ``token_logprobs`` (the chosen
token's), ``top_logprobs`` (the k most likely, and the chosen one: k or k + 1 entries) and ``text_offset`` (where
each token's text starts in the choice's text).
"""
from __future__ import annotations

from miniengine.outputs import CompletionOutput
from miniengine.stop_strings import StopStringRules


class Choice:
    def __init__(self, tokenizer, index: int, echo_ids: list[int] | None, params, tokens_as_ids: bool = False,
                 stops=StopStringRules()):
        self.tokenizer, self.index, self.params, self.tokens_as_ids = tokenizer, index, params, tokens_as_ids
        self.stops = stops  # what holds text back: the LLM's stop strings (EngineConfig.stop_strings, a plug point)
        self.prefix = "" if echo_ids is None else tokenizer.decode(echo_ids)  # echo: the prompt comes first
        self.out: CompletionOutput | None = None
        self.sent_text = ""
        self.sent_tokens = 0
        self.sent_finish = False
        self._pieces: list[str] = []  # each output token's own text, for logprobs

    def update(self, completion: CompletionOutput) -> None:
        self.out = completion

    @property
    def num_tokens(self) -> int:
        return 0 if self.out is None else len(self.out.token_ids)

    @property
    def finished(self) -> bool:
        return self.out is not None and self.out.finish_reason is not None

    @property
    def text(self) -> str:
        return self.prefix + ("" if self.out is None else self.out.text)

    def final(self) -> dict:
        """The whole choice, for a response that is not streamed."""
        return self._choice(self.text, 0, None if self.out is None else self.out.finish_reason)

    def delta(self) -> dict | None:
        """A stream chunk's choice with what is new since the last one, or None when nothing is."""
        if self.out is None:
            return None
        body = self.out.text
        ready = self.prefix + self.stops.sendable(body, self.params.stop, self.finished)
        new_text = ready[len(self.sent_text):]
        first_token = self.sent_tokens
        finish = self.out.finish_reason if self.finished and not self.sent_finish else None
        if not new_text and first_token == self.num_tokens and finish is None:
            return None
        self.sent_text, self.sent_tokens = ready, self.num_tokens
        self.sent_finish = self.sent_finish or finish is not None
        return self._choice(new_text, first_token, finish)

    def _choice(self, text: str, first_token: int, finish_reason) -> dict:
        out = self.out
        return {"index": self.index, "text": text, "logprobs": self._logprobs(first_token),
                "finish_reason": finish_reason, "stop_reason": None if out is None else out.stop_reason}

    def _token_text(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.tokens_as_ids else self.tokenizer.decode([token_id])

    def _logprobs(self, first_token: int) -> dict | None:
        """Logprobs of the output tokens from ``first_token`` on (None unless the request asked for them)."""
        if self.params.logprobs is None or self.out is None or self.out.logprobs is None:
            return None
        ids = self.out.token_ids
        while len(self._pieces) < len(ids):
            self._pieces.append(self._token_text(ids[len(self._pieces)]))
        offset = len(self.prefix) + sum(len(p) for p in self._pieces[:first_token])
        result = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for i in range(first_token, len(ids)):
            entries = self.out.logprobs[i]
            top = {}
            for t, lp in sorted(entries.items(), key=lambda kv: -kv[1]):
                key = self._token_text(t)
                if key in top:  # two tokens with the same text (a partial UTF-8 character): keep both, by id
                    key = f"token_id:{t}"
                top[key] = lp
            result["tokens"].append(self._pieces[i])
            result["token_logprobs"].append(entries[ids[i]])
            result["top_logprobs"].append(top)
            result["text_offset"].append(offset)
            offset += len(self._pieces[i])
        return result

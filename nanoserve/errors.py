"""Errors that are part of the interface: a bad request is refused with the field it got wrong.

InvalidRequest is a ValueError whose message names the field and the bad value; `param` is the
field's name as a client sent it ("temperature", "prompt", "max_tokens", ...), so the HTTP server
can fill OpenAI's error body (`{"error": {"message", "type", "param", "code"}}`) without parsing
the message.
"""

from __future__ import annotations


class InvalidRequest(ValueError):
    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param

"""The one masking of secrets in text: every form in which libpq and SQLAlchemy accept a password.

Why one owner: a ledger URL reaches the sweep's first line, its "next:" commands, the stored config
snapshot (and so every export), and the drivers' connection errors. Each of those masks through
`redact`, so a form added here is masked everywhere. The forms: the URL's userinfo (`user:PASSWORD@host`,
up to the last `@`, since a raw `@` inside a password is what a user types), and the libpq parameters
`password=` and `passfile=` in a URL's query string or a keyword/value DSN
(https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-PARAMKEYWORDS). stdlib only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"
# `scheme://user:PASSWORD@`: any characters but white space, up to the last @ of the URL.
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:)(\S*)@")
# `password=...` / `passfile=...` in a query string (`?`, `&`) or a libpq DSN (`host=x password=y`).
_PARAM = re.compile(r"(?i)(?<![\w.-])(password|passfile)=([^&\s'\"]*)")


def secrets_in(text: str) -> set[str]:
    """The secrets written in `text` (userinfo passwords, password= and passfile= values)."""
    found = {m.group(2) for m in _USERINFO.finditer(text)} | {m.group(2) for m in _PARAM.finditer(text)}
    return {s for s in found if s}


def redact(text: str, known: Iterable[str | None] = ()) -> str:
    """`text` with every secret masked: the `known` ones wherever they appear (a driver may quote a password
    without its URL; Hydra quotes a bad override whole), then every form `secrets_in` finds."""
    for secret in sorted({s for s in known if s}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    text = _USERINFO.sub(lambda m: m.group(1) + (MASK if m.group(2) else "") + "@", text)
    return _PARAM.sub(lambda m: f"{m.group(1)}={MASK if m.group(2) else ''}", text)

"""Every form of a password libpq and SQLAlchemy accept is masked, by the one function that masks
(orchestrator/core/redact.py), and so by the ledger's `mask` / `scrub` and the CLI's `redact`."""

from __future__ import annotations

import pytest

from orchestrator.config import redact
from orchestrator.ledger.engine import mask, parse_url, scrub

FORMS = {
    "userinfo": ("postgresql+psycopg://orch:Us3r-Secret@db.example:5432/ledger", "Us3r-Secret"),
    "raw @ in the userinfo": ("postgresql+psycopg://orch:R@w-S3cret@db.example:5432/ledger", "R@w-S3cret"),
    "percent-encoded": ("postgresql+psycopg://orch:Pct%40Secret@db.example:5432/ledger", "Pct@Secret"),
    "query password=": ("postgresql+psycopg://orch@db.example:5432/ledger?password=Qu3ry-Secret", "Qu3ry-Secret"),
    "query passfile=": (
        "postgresql+psycopg://orch@db.example/ledger?sslmode=disable&passfile=/h/.pgpass-Pf",
        "/h/.pgpass-Pf",
    ),
}


def _parts(secret: str) -> list[str]:
    """The secret and each piece of it around an @ (the tail a wrong parse once put in the host)."""
    return [secret, *(p for p in secret.split("@") if len(p) > 2)]


@pytest.mark.parametrize("form", FORMS)
def test_mask_scrub_and_redact_hide_every_form(form):
    url, secret = FORMS[form]
    parsed = parse_url(url)
    assert parsed.host == "db.example"  # a raw @ ends the userinfo at the last @, as libpq reads it
    driver_error = f'connection to server failed: password authentication failed ("{secret}") for {url}'
    for text in (mask(url), scrub(driver_error, parsed), redact(f"error: cannot reach {url}", [f"ledger.url={url}"])):
        assert not any(p in text for p in _parts(secret)), (form, text)
        assert "***" in text


def test_a_dsn_in_libpq_keyword_form_is_masked_too():
    assert redact("host=db password=Kw-Secret user=orch") == "host=db password=*** user=orch"


def test_nothing_else_is_masked():
    assert (
        mask("postgresql+psycopg://orch@db.example:5432/ledger") == "postgresql+psycopg://orch@db.example:5432/ledger"
    )
    assert redact("step p50 1.23 s, passes=3") == "step p50 1.23 s, passes=3"

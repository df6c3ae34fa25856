"""Redaction: mask common secret shapes in output text before a program sees it.

The masks keep what a reader needs to recognise the thing (``sk-***``, ``Bearer ***``,
``password=***``, ``https://user:***@host``) and drop the secret. Masking is idempotent: a
masked text no longer matches, so applying it twice changes nothing, and a transform hook that
re-inserts a secret still has it masked (redaction always runs last).

The shapes are deliberately specific (a known prefix plus a long run of token characters, or a
key that *ends* in a secret word such as ``GITHUB_TOKEN=``) so ordinary output such as
``tokens: 5`` or ``skip-tests`` stays as it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["DEFAULT_RULES", "MASK", "Redactor", "Rule"]

MASK = "***"


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One secret shape: a pattern and what replaces a match (a template where ``\\g<name>``
    refers back, or a function of the match)."""

    name: str
    pattern: re.Pattern[str]
    replacement: str | Callable[[re.Match[str]], str]
    needles: tuple[str, ...] = ()
    """Substrings one of which every match contains: a text without any is skipped (a
    substring test is far cheaper than a regex scan)."""
    folded: bool = False
    """Case-insensitive: ``pattern`` (lower case) runs over the lower-cased text, whose spans
    then mask the original (the ``head`` group is kept, the rest masked). ``fallback`` (the
    same with IGNORECASE) serves a text whose lower-casing changes its length."""
    fallback: re.Pattern[str] | None = None


def _head_mask(text: str, match: re.Match[str]) -> str:
    """The ``head`` group of ``text`` kept, the rest of the match masked (quotes kept:
    ``"password": "***"``)."""
    head = text[match.start("head") : match.end("head")]
    value = text[match.end("head") : match.end()]
    quote = value[0] if len(value) >= 2 and value[0] in "'\"" and value[-1] == value[0] else ""
    return f"{head}{quote}{MASK}{quote}"


def _rule(
    name: str,
    pattern: str,
    replacement: str | Callable[[re.Match[str]], str],
    needles: tuple[str, ...] = (),
    *,
    fold: bool = False,
    flags: int = 0,
) -> Rule:
    # Case-insensitive matching without IGNORECASE (which costs the engine its literal-prefix
    # scan, 10-20x here): the lower-case pattern runs over the lower-cased text.
    return Rule(
        name=name,
        pattern=re.compile(pattern, flags),
        replacement=replacement,
        needles=needles,
        folded=fold,
        fallback=re.compile(pattern, flags | re.IGNORECASE) if fold else None,
    )


# Patterns start with their literal prefix (so the regex engine can scan for it) and check the
# word boundary *after* it with a look-behind: "task-..." is not an "sk-" key.
DEFAULT_RULES: tuple[Rule, ...] = (
    _rule(
        "private_key_block",
        r"-----BEGIN (?P<kind>[A-Z0-9 ]*)PRIVATE KEY-----.*?"
        r"(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
        f"-----BEGIN \\g<kind>PRIVATE KEY-----{MASK}-----END \\g<kind>PRIVATE KEY-----",
        ("PRIVATE KEY-----",),
        flags=re.DOTALL,
    ),
    # URLs with a password: scheme://user:password@host
    _rule(
        "url_password",
        r"(?P<head>://[^\s:/@'\"]*:)(?!\*\*\*@)[^\s/@'\"]+@",
        f"\\g<head>{MASK}@",
        ("://",),
    ),
    _rule(
        "bearer",
        r"(?P<head>bearer(?<![a-z0-9_]bearer)\s+)(?!\*\*\*)[a-z0-9._~+/=-]{8,}",
        MASK,
        ("bearer",),
        fold=True,
    ),
    _rule(
        "basic_auth",
        r"(?P<head>authorization:\s*basic\s+)(?!\*\*\*)[a-z0-9+/=]{8,}",
        MASK,
        ("authorization",),
        fold=True,
    ),
    # key=value / key: value / "key": "value" where the key *ends* in a secret word
    # (GITHUB_TOKEN=, db_password:, "client_secret": ...; not "tokens: 5").
    _rule(
        "assignment",
        r"(?P<head>(?:password|passwd|passphrase|pwd|secret|token|api[_-]?key|apikey"
        r"|access[_-]?key|private[_-]?key|auth[_-]?key|credentials?)[\"']?\s*[:=]\s*)"
        r"(?P<value>\"[^\"\n]+\"|'[^'\n]+'|[^\s'\",;&]+)",
        MASK,
        ("pass", "pwd", "secret", "token", "key", "credential"),
        fold=True,
    ),
    _rule(
        "openai_anthropic",
        r"sk-(?<![A-Za-z0-9_]sk-)(?:[A-Za-z]+-)?[A-Za-z0-9_-]{16,}",
        f"sk-{MASK}",
        ("sk-",),
    ),
    _rule(
        "stripe",
        r"(?P<p>[rs]k_(?<![A-Za-z0-9][rs]k_)(?:live|test)_)[A-Za-z0-9]{10,}",
        f"\\g<p>{MASK}",
        ("k_live_", "k_test_"),
    ),
    _rule(
        "github",
        r"(?P<p>gh[pousr]_)(?<![A-Za-z0-9]gh[pousr]_)[A-Za-z0-9]{20,}",
        f"\\g<p>{MASK}",
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    ),
    _rule(
        "github_pat",
        r"github_pat_(?<![A-Za-z0-9]github_pat_)[A-Za-z0-9_]{20,}",
        f"github_pat_{MASK}",
        ("github_pat_",),
    ),
    _rule(
        "gitlab",
        r"glpat-(?<![A-Za-z0-9]glpat-)[A-Za-z0-9_-]{20,}",
        f"glpat-{MASK}",
        ("glpat-",),
    ),
    _rule(
        "aws_key_id",
        r"(?P<p>AKIA|ASIA)(?<![A-Za-z0-9]AKIA)(?<![A-Za-z0-9]ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])",
        f"\\g<p>{MASK}",
        ("AKIA", "ASIA"),
    ),
    _rule(
        "slack",
        r"(?P<p>xox[abposr]-)(?<![A-Za-z0-9]xox[abposr]-)[A-Za-z0-9-]{10,}",
        f"\\g<p>{MASK}",
        ("xox",),
    ),
    _rule(
        "google_api_key",
        r"AIza(?<![A-Za-z0-9]AIza)[0-9A-Za-z_-]{35}",
        f"AIza{MASK}",
        ("AIza",),
    ),
    _rule(
        "jwt",
        r"eyJ(?<![A-Za-z0-9_-]eyJ)[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
        f"eyJ{MASK}",
        ("eyJ",),
    ),
)
"""The built-in shapes, applied in this order."""


class Redactor:
    """Applies :data:`DEFAULT_RULES` (unless ``defaults`` is False) and extra patterns (each
    whole match becomes ``***``)."""

    def __init__(self, extra: Iterable[str] = (), *, defaults: bool = True) -> None:
        rules = list(DEFAULT_RULES) if defaults else []
        for index, text in enumerate(extra):
            rules.append(_rule(f"extra_{index}", text, MASK))
        self.rules: tuple[Rule, ...] = tuple(rules)

    def __call__(self, text: str) -> str:
        """``text`` with every secret shape masked."""
        if not text:
            return text
        lowered: str | None = None
        for rule in self.rules:
            if rule.folded and lowered is None:
                lowered = text.lower()
            if rule.needles:
                haystack = lowered if rule.folded and lowered is not None else text
                if not any(needle in haystack for needle in rule.needles):
                    continue
            if not rule.folded:
                text = rule.pattern.sub(rule.replacement, text)
                lowered = None
                continue
            assert lowered is not None
            if len(lowered) == len(text):
                text = _sub_spans(rule.pattern, text, lowered)
            elif rule.fallback is not None:
                text = rule.fallback.sub(lambda m: _head_mask(m.string, m), text)
            lowered = None
        return text


def _sub_spans(pattern: re.Pattern[str], text: str, lowered: str) -> str:
    """Mask in ``text`` what ``pattern`` finds in ``lowered`` (same length, same spans)."""
    pieces: list[str] = []
    last = 0
    for match in pattern.finditer(lowered):
        pieces.append(text[last : match.start()])
        pieces.append(_head_mask(text, match))
        last = match.end()
    if not pieces:
        return text
    pieces.append(text[last:])
    return "".join(pieces)

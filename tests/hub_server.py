"""A stand-in for the Hugging Face Hub on 127.0.0.1, for tests of the real download path.

It answers exactly what ``huggingface_hub`` 2.4's ``snapshot_download`` asks for, so that
``HF_ENDPOINT`` can point at it and the whole download (revision lookup, file listing,
metadata, plain HTTP transfer with ``Range`` resume, the cache layout) runs with no network:

* ``GET /api/models/{repo_id}/revision/{revision}`` (``HfApi.model_info``, used by
  ``repo_info`` when the revision is not a commit hash): ``id``, ``sha``, ``siblings``;
* ``GET /api/models/{repo_id}/tree/{revision}`` (``HfApi.list_repo_tree``, cached by
  ``snapshot_download`` under ``trees/{commit}.json``): one page, every file with its
  git blob id and size, LFS files with ``lfs: {oid: sha256, size, pointerSize}``;
* ``HEAD`` and ``GET /{repo_id}/resolve/{revision}/{filename}`` (``get_hf_file_metadata``,
  ``http_get``): ``X-Repo-Commit``; ``ETag`` the file's git blob id, or for an LFS file
  (weights) its SHA-256 with ``X-Linked-Etag`` / ``X-Linked-Size`` as the Hub sends them;
  ``Content-Length``; ``Range: bytes=N-`` (or ``N-M``) answered 206 with ``Content-Range``.

Errors carry the ``X-Error-Code`` that ``huggingface_hub.utils.hf_raise_for_status`` maps:
``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound`` (the latter with ``X-Repo-Commit``,
as the Hub sends it). No Xet header or ``xetHash`` is ever sent, so files come over plain
HTTP even where ``hf_xet`` is installed.

Repositories are ``{repo_id: {"commit": <40 hex>, "files": {name: bytes}}}`` (optionally
``"lfs": [names]``; by default weights, ``*.safetensors`` / ``*.bin`` / ``*.pt`` / ``*.h5`` /
``*.onnx``, are LFS files); ``server.repos`` is read on every request, so a test can move a
repository to a new commit while the server runs. Fault injection:

* ``cut_after[filename] = n``: the next GET of that file announces the full length, sends
  ``n`` bytes and drops the connection (one time; later GETs are served normally);
* ``fail_gets[filename] = k``: the next ``k`` GETs of that file are answered 503;
* ``corrupt[filename] = True``: the bytes served differ (same length) from the SHA-256 that
  the ETag and the file listing claim.

Every request is logged in ``server.requests`` as ``Request(method, path, range)``.
Sockets time out (``TIMEOUT`` seconds) on the server side, so no test hangs on a dead client.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, NamedTuple, Optional
from urllib.parse import quote, unquote, urlsplit

from huggingface_hub import constants

TIMEOUT = 10.0
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".h5", ".onnx", ".msgpack")
_API = re.compile(r"^/api/models/(?P<repo>.+?)/(?P<kind>revision|tree)/(?P<rev>[^/]+)(?:/(?P<sub>.*))?$")
_UPLOAD = re.compile(r"^/api/models/(?P<repo>.+?)/(?P<kind>preupload|commit)/(?P<rev>[^/]+)$")
_RESOLVE = re.compile(r"^/(?P<repo>.+?)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class Request(NamedTuple):
    method: str
    path: str  # as sent, with its query string
    range: Optional[str]  # the Range header, or None


def git_blob_id(data: bytes) -> str:
    """The git object id of a blob: what the Hub gives as the ETag of a non-LFS file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    """The git-lfs pointer file that git stores for an LFS file."""
    return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\n"
            f"size {len(data)}\n").encode()


def commit_id(seed: str) -> str:
    """A made-up 40-hex commit id."""
    return hashlib.sha1(seed.encode()).hexdigest()


def _card_errors(content: str) -> List[str]:
    """What the Hub would reject in a model card's YAML front matter (the checks a stand-in can
    make: parseable, a mapping, a model-index of named entries whose results have a task type
    and numeric metrics)."""
    import yaml  # huggingface_hub depends on PyYAML

    if not content.startswith("---\n") or "\n---" not in content[4:]:
        return []  # no front matter: nothing to validate
    try:
        front = yaml.safe_load(content[4:content.index("\n---", 4)])
    except yaml.YAMLError as err:
        return [f"YAML: {err}"]
    if not isinstance(front, dict):
        return ["the metadata is not a mapping"]
    errors = []
    for entry in front.get("model-index") or []:
        if not isinstance(entry, dict) or not entry.get("name"):
            errors.append("model-index entries need a name")
            continue
        for result in entry.get("results") or []:
            if not (isinstance(result.get("task"), dict) and result["task"].get("type")):
                errors.append("model-index results need task.type")
            for metric in result.get("metrics") or []:
                if not isinstance(metric.get("value"), (int, float)) or not metric.get("type"):
                    errors.append(f"metric {metric!r} needs a type and a numeric value")
    return errors


class HubServer:
    """The fake Hub; a context manager (``with HubServer(repos) as hub: hub.url``)."""

    def __init__(self, repos: Optional[Dict[str, dict]] = None):
        self.repos: Dict[str, dict] = dict(repos or {})
        self.cut_after: Dict[str, int] = {}
        self.fail_gets: Dict[str, int] = {}
        self.corrupt: Dict[str, bool] = {}
        self.requests: List[Request] = []
        self._lock = threading.Lock()
        self._httpd: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    # -- life cycle -----------------------------------------------------------------------

    def start(self) -> "HubServer":
        handler = type("Handler", (_Handler,), {"hub": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.timeout = TIMEOUT
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening (connections still open are served until they close or time out)."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=TIMEOUT)
            self._httpd = None

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    # -- repositories and the log -----------------------------------------------------------

    def add(self, repo_id: str, files: Dict[str, bytes], commit: Optional[str] = None) -> str:
        """Serve ``files`` as ``repo_id`` at ``commit`` (made up from the contents if None)."""
        commit = commit or commit_id(repo_id + "".join(f"{k}:{git_blob_id(v)}" for k, v in sorted(files.items())))
        self.repos[repo_id] = {"commit": commit, "files": dict(files)}
        return commit

    def file_requests(self, filename: str, method: Optional[str] = None) -> List[Request]:
        """The logged requests for ``/…/resolve/…/filename`` (of one method, or all)."""
        tail = "/" + quote(filename)
        return [r for r in self.requests if "/resolve/" in r.path and urlsplit(r.path).path.endswith(tail)
                and (method is None or r.method == method)]

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    def _log(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def _take(self, knob: Dict, filename: str):
        """Pop a one-time fault (cut_after) or count down a repeated one (fail_gets)."""
        with self._lock:
            if knob is self.cut_after:
                return knob.pop(filename, None)
            left = knob.get(filename, 0)
            if left > 0:
                knob[filename] = left - 1
                return True
            return False


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"  # keep-alive, as the Hub and huggingface_hub's pooled client use it
    timeout = TIMEOUT  # socket timeout of each connection
    server_version = "fake-hub"

    def log_message(self, format, *args):  # quiet: the test reads hub.requests
        pass

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        self._serve(head=False)

    def do_POST(self):
        """The upload side, as ``HfApi.create_repo`` and ``upload_folder`` (without Xet) use it:
        ``/api/repos/create``, ``/api/models/{repo}/preupload/{rev}`` (every file "regular":
        its bytes come inside the commit) and ``/api/models/{repo}/commit/{rev}`` (NDJSON)."""
        self.hub._log(Request(self.command, self.path, None))
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = urlsplit(self.path).path
        if path == "/api/validate-yaml":  # a README.md's front matter, checked before its commit
            errors = _card_errors(json.loads(body)["content"])
            return self._json(400 if errors else 200, {"errors": [{"message": e} for e in errors], "warnings": []})
        if path == "/api/repos/create":
            spec = json.loads(body)
            repo_id = f"{spec['organization']}/{spec['name']}" if spec.get("organization") else spec["name"]
            if repo_id in self.hub.repos:
                return self._error(409, None, "You already created this model repo", False)
            self.hub.repos[repo_id] = {"commit": commit_id(repo_id + ":empty"), "files": {}, "private": spec.get("visibility") == "private"}
            return self._json(200, {"url": f"{self.hub.url}/{repo_id}", "name": repo_id})
        m = _UPLOAD.match(path)
        if not m:
            return self._error(404, None, "Not Found", False)
        repo, _ = self._repo_at(unquote(m["repo"]), unquote(m["rev"]), False)
        if repo is None:
            return
        if m["kind"] == "preupload":
            files = json.loads(body)["files"]
            return self._json(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                                              for f in files]})
        lines = [json.loads(line) for line in body.decode("utf-8").splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            return self._error(400, None, "a commit starts with its header", False)
        files = dict(repo["files"])
        for line in lines[1:]:
            if line["key"] != "file" or line["value"].get("encoding") != "base64":
                return self._error(400, None, f"unsupported commit operation {line['key']}", False)
            files[line["value"]["path"]] = base64.b64decode(line["value"]["content"])
        repo_id = unquote(m["repo"])
        commit = commit_id(repo_id + "".join(f"{k}:{git_blob_id(v)}" for k, v in sorted(files.items())))
        repo.update(files=files, commit=commit, message=lines[0]["value"].get("summary"))
        return self._json(200, {"commitUrl": f"{self.hub.url}/{repo_id}/commit/{commit}", "commitOid": commit,
                                "pullRequestUrl": None})

    # -- routing ------------------------------------------------------------------------------

    def _serve(self, head: bool) -> None:
        self.hub._log(Request(self.command, self.path, self.headers.get("Range")))
        path = urlsplit(self.path).path
        m = _API.match(path)
        if m and not head:
            repo, commit = self._repo_at(unquote(m["repo"]), unquote(m["rev"]), head)
            if repo is None:
                return
            if m["kind"] == "revision":
                return self._json(200, self._model_info(unquote(m["repo"]), repo))
            return self._json(200, self._tree(repo))
        m = _RESOLVE.match(path)
        if m:
            repo, commit = self._repo_at(unquote(m["repo"]), unquote(m["rev"]), head)
            if repo is None:
                return
            return self._file(repo, unquote(m["file"]), head)
        self._error(404, None, "Not Found", head)

    def _repo_at(self, repo_id: str, revision: str, head: bool):
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found", head)
            return None, None
        if revision not in ("main", repo["commit"]):
            self._error(404, "RevisionNotFound", "Invalid rev id: " + revision, head)
            return None, None
        return repo, repo["commit"]

    # -- answers -----------------------------------------------------------------------------

    @staticmethod
    def _is_lfs(repo: dict, name: str) -> bool:
        return name in repo["lfs"] if "lfs" in repo else name.endswith(_LFS_SUFFIXES)

    def _model_info(self, repo_id: str, repo: dict) -> dict:
        return {"_id": commit_id(repo_id)[:24], "id": repo_id, "modelId": repo_id, "sha": repo["commit"],
                "private": False, "gated": False, "disabled": False, "tags": [], "downloads": 0, "likes": 0,
                "lastModified": "2024-01-01T00:00:00.000Z", "createdAt": "2024-01-01T00:00:00.000Z",
                "siblings": [{"rfilename": name} for name in sorted(repo["files"])]}

    def _tree(self, repo: dict) -> list:
        entries = []
        for name, data in sorted(repo["files"].items()):
            if self._is_lfs(repo, name):
                pointer = lfs_pointer(data)
                entries.append({"type": "file", "oid": git_blob_id(pointer), "size": len(data), "path": name,
                                "lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                                        "pointerSize": len(pointer)}})
            else:
                entries.append({"type": "file", "oid": git_blob_id(data), "size": len(data), "path": name})
        return entries

    def _file(self, repo: dict, name: str, head: bool) -> None:
        data = repo["files"].get(name)
        if data is None:
            return self._error(404, "EntryNotFound", f"{name} does not exist", head, {"X-Repo-Commit": repo["commit"]})
        headers = {"X-Repo-Commit": repo["commit"], "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if self._is_lfs(repo, name):
            sha256 = hashlib.sha256(data).hexdigest()
            headers.update({"ETag": f'"{sha256}"', "X-Linked-Etag": f'"{sha256}"', "X-Linked-Size": str(len(data))})
        else:
            headers["ETag"] = f'"{git_blob_id(data)}"'
        if head:
            return self._send(200, headers, b"", length=len(data), head=True)

        if self.hub.corrupt.get(name):
            data = bytearray(data)
            data[len(data) // 2] ^= 0xFF  # same length, another SHA-256
            data = bytes(data)
        status, body = 200, data
        asked = self.headers.get("Range")
        if asked:
            m = _RANGE.match(asked.strip())
            if not m:
                return self._error(416, None, "Bad Range", head, {"Content-Range": f"bytes */{len(data)}"})
            start = int(m[1])
            end = min(int(m[2]), len(data) - 1) if m[2] else len(data) - 1
            if start >= len(data) or start > end:
                return self._error(416, None, "Range Not Satisfiable", head, {"Content-Range": f"bytes */{len(data)}"})
            status, body = 206, data[start:end + 1]
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"

        cut = self.hub._take(self.hub.cut_after, name)
        if cut is not None:  # announce it all, send a part, drop the connection
            self._send(status, headers, body[:cut], length=len(body))
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if self.hub._take(self.hub.fail_gets, name):
            return self._error(503, None, "Service Unavailable", head)
        self._send(status, headers, body)

    def _json(self, status: int, payload) -> None:
        self._send(status, {"Content-Type": "application/json; charset=utf-8"}, json.dumps(payload).encode())

    def _error(self, status: int, code: Optional[str], message: str, head: bool, extra: Optional[dict] = None):
        headers = {"Content-Type": "application/json; charset=utf-8", "X-Error-Message": message, **(extra or {})}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, headers, json.dumps({"error": message}).encode(), head=head)

    def _send(self, status: int, headers: dict, body: bytes, length: Optional[int] = None, head: bool = False):
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if not head and body:
            self.wfile.write(body)
        self.wfile.flush()


def use_hub(monkeypatch, url: str, home) -> None:
    """Point ``huggingface_hub`` at ``url`` with its cache under ``home`` (``home/hub``), online,
    with no token, no Xet and no telemetry, for one test (``monkeypatch`` undoes it all).

    ``huggingface_hub`` reads its settings from the environment once, at import
    (``constants.ENDPOINT``, the URL template built from it, ``HF_HUB_OFFLINE``, ...): both the
    variables and those constants are set.
    """
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    for name in ("HF_HUB_DISABLE_XET", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_DISABLE_IMPLICIT_TOKEN"):
        monkeypatch.setenv(name, "1")
        monkeypatch.setattr(constants, name, True)
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))


def go_offline(monkeypatch) -> None:
    """``HF_HUB_OFFLINE=1``, in the environment and in ``huggingface_hub.constants``."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

"""A Hugging Face hub in memory, behind huggingface_hub's lowest HTTP seam.

huggingface_hub makes every request through one shared client from its client factory
(`set_client_factory`, public API); the stand-in client carries the library's own request hook
(offline mode, request ids) and a transport that answers from here instead of the network. All
of the library above it runs as it is: its cache layout, its metadata and error handling, its
upload protocol. The hub's side follows its documented HTTP API, as far as the library uses it:

    HEAD/GET  /{repo}/resolve/{revision}/{path}        file metadata and content
    GET       /api/models/{repo}/revision/{revision}   repository info
    GET       /api/models/{repo}/tree/{revision}        the file listing
    POST      /api/repos/create                         a new repository
    POST      /api/models/{repo}/preupload/{revision}   regular or LFS, per file
    POST      /{repo}.git/info/lfs/objects/batch        where to PUT each LFS object
    PUT       /lfs/{oid}                                an LFS object's bytes
    POST      /api/models/{repo}/commit/{revision}      the commit (NDJSON)
    POST      /api/validate-yaml                        a README's metadata (the hub's rules
                                                        for license: other)

Errors carry the hub's X-Error-Code (GatedRepo, RepoNotFound, RevisionNotFound, EntryNotFound),
which the library turns into its typed exceptions. `requests` logs (method, path) of each call.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

ENDPOINT = "https://huggingface.co"
LFS_FROM_BYTES = 1024  # files from this size go through LFS (the hub's rule is ~10 MB)


@dataclass
class Repo:
    commits: list[tuple[str, dict[str, bytes]]] = field(default_factory=list)  # (oid, files)
    gated: bool = False
    private: bool = False
    messages: list[str] = field(default_factory=list)

    def files_at(self, revision: str) -> tuple[str, dict[str, bytes]] | None:
        if not self.commits:
            return None
        if revision == "main":
            return self.commits[-1]
        return next((c for c in self.commits if c[0] == revision), None)

    def commit(self, files: dict[str, bytes], message: str = "") -> str:
        merged = dict(self.commits[-1][1]) if self.commits else {}
        merged.update(files)
        oid = hashlib.sha1(json.dumps(sorted((p, hashlib.sha256(b).hexdigest())
                                             for p, b in merged.items())).encode()
                           + str(len(self.commits)).encode()).hexdigest()
        self.commits.append((oid, merged))
        self.messages.append(message)
        return oid


def _json(httpx, data, status: int = 200, headers: dict | None = None):
    return httpx.Response(status, json=data, headers=headers or {})


def _error(httpx, status: int, code: str, message: str):
    return httpx.Response(status, headers={"X-Error-Code": code, "X-Error-Message": message},
                          json={"error": message})


class FakeHub:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}  # oid (sha256) -> bytes
        self.requests: list[tuple[str, str]] = []
        self.created: list[dict] = []  # the payloads of /api/repos/create

    # -- what a test sets up and reads back -------------------------------------------------------
    def publish_dir(self, repo: str, folder: Path, **flags) -> str:
        """A repository holding every file of `folder`; returns its commit."""
        files = {str(p.relative_to(folder)): p.read_bytes()
                 for p in sorted(folder.rglob("*")) if p.is_file()}
        self.repos[repo] = Repo(**flags)
        return self.repos[repo].commit(files, "initial")

    def downloads(self) -> list[str]:
        """Paths of the file contents sent (GET on resolve)."""
        return [path for method, path in self.requests
                if method == "GET" and "/resolve/" in path]

    @classmethod
    def for_test(cls, monkeypatch, tmp_path: Path) -> "FakeHub":
        """A hub installed for one test, with everything around it of the test's own: an empty
        huggingface_hub cache and per-user cache in `tmp_path`, no token (HF_TOKEN unset, no
        saved one), online whatever HF_HUB_OFFLINE says, and uploads over plain HTTP (LFS) as HF_HUB_DISABLE_XET=1 chooses - the
        Xet transfer runs in hf_xet's own native client, below this seam. Those settings are
        read once, at import, so they are set on huggingface_hub.constants."""
        from huggingface_hub import constants

        hub = cls()
        hub.install(monkeypatch)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # a machine that set it: online
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setenv("PERSONAPLEX_CACHE", str(tmp_path / "user-cache"))
        return hub

    # -- the HTTP side --------------------------------------------------------------------------
    def install(self, monkeypatch) -> None:
        """Routes huggingface_hub's HTTP client here (until the test ends)."""
        import huggingface_hub
        from huggingface_hub.utils import _http

        httpx = _httpx_module()

        def factory():
            return httpx.Client(transport=httpx.MockTransport(self.handle),
                                event_hooks={"request": [_http.hf_request_event_hook]},
                                follow_redirects=True, timeout=None)

        huggingface_hub.set_client_factory(factory)
        monkeypatch.setattr(_http, "_GLOBAL_CLIENT", None)
        # restored at teardown: the next test (or the library) builds its own client again
        monkeypatch.setattr(_http, "_GLOBAL_CLIENT_FACTORY", factory)

    def handle(self, request):
        httpx = _httpx_module()
        path = unquote(request.url.path)
        self.requests.append((request.method, path))
        authorised = request.headers.get("authorization", "").startswith("Bearer ")
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(revision|tree|preupload|commit)/(.+?)", path)
        if m:
            repo_id, what, rev = m.groups()
            return getattr(self, f"_{what}")(httpx, request, repo_id, rev.split("/")[0],
                                             authorised)
        if request.method == "POST" and path == "/api/repos/create":
            return self._create(httpx, json.loads(request.content))
        if request.method == "POST" and path == "/api/validate-yaml":
            return self._validate_yaml(httpx, json.loads(request.content)["content"])
        m = re.fullmatch(r"/([^/]+/[^/]+)\.git/info/lfs/objects/batch", path)
        if m:
            return self._lfs_batch(httpx, json.loads(request.content))
        m = re.fullmatch(r"/lfs/([0-9a-f]{64})", path)
        if m and request.method == "PUT":
            data = request.read()
            if hashlib.sha256(data).hexdigest() != m[1]:
                return httpx.Response(400, json={"error": "content does not match its oid"})
            self.lfs[m[1]] = data
            return httpx.Response(200)
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            return self._resolve(httpx, request, *m.groups(), authorised)
        return _error(httpx, 404, "NotFound", f"the fake hub has no route {path}")

    def _repo(self, httpx, repo_id: str, authorised: bool):
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and not authorised):
            return None, _error(httpx, 404, "RepoNotFound", "Repository not found")
        if repo.gated and not authorised:
            return None, _error(httpx, 401, "GatedRepo", "Access to this model is restricted")
        return repo, None

    def _at(self, httpx, repo_id, rev, authorised):
        repo, err = self._repo(httpx, repo_id, authorised)
        if err is not None:
            return None, err
        found = repo.files_at(rev)
        if found is None:
            return None, _error(httpx, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return found, None

    def _resolve(self, httpx, request, repo_id, rev, file, authorised):
        found, err = self._at(httpx, repo_id, rev, authorised)
        if err is not None:
            return err
        commit, files = found
        if file not in files:
            return _error(httpx, 404, "EntryNotFound", f"{file} does not exist")
        data = files[file]
        headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                   "Content-Length": str(len(data))}
        return httpx.Response(200, headers=headers,
                              content=b"" if request.method == "HEAD" else data)

    def _revision(self, httpx, request, repo_id, rev, authorised):
        found, err = self._at(httpx, repo_id, rev, authorised)
        if err is not None:
            return err
        commit, files = found
        return _json(httpx, {"id": repo_id, "sha": commit, "private": False,
                             "siblings": [{"rfilename": p} for p in files]})

    def _tree(self, httpx, request, repo_id, rev, authorised):
        found, err = self._at(httpx, repo_id, rev, authorised)
        if err is not None:
            return err
        _, files = found
        return _json(httpx, [{"type": "file", "path": p, "size": len(b),
                              "oid": hashlib.sha1(b).hexdigest()} for p, b in files.items()])

    def _create(self, httpx, payload):
        self.created.append(payload)
        repo_id = f"{payload['organization']}/{payload['name']}"
        if repo_id in self.repos:
            return _error(httpx, 409, "RepoExists", "You already created this model repo")
        self.repos[repo_id] = Repo(private=payload.get("visibility") == "private")
        return _json(httpx, {"url": f"{ENDPOINT}/{repo_id}", "name": repo_id})

    def _validate_yaml(self, httpx, content: str):
        import yaml

        errors = []
        meta = yaml.safe_load(content.split("---")[1]) if content.startswith("---\n") else None
        if not isinstance(meta, dict):
            errors.append("no YAML metadata block at the top of README.md")
        elif meta.get("license") == "other" and not (meta.get("license_name")
                                                      and meta.get("license_link")):
            errors.append('"license: other" needs license_name and license_link')
        if errors:
            return httpx.Response(400, json={"errors": [{"message": m} for m in errors]})
        return _json(httpx, {"warnings": []})

    def _preupload(self, httpx, request, repo_id, rev, authorised):
        if not authorised:
            return _error(httpx, 401, "RepoNotFound", "Invalid credentials")
        files = json.loads(request.content)["files"]
        return _json(httpx, {"files": [
            {"path": f["path"], "uploadMode": "lfs" if f["size"] >= LFS_FROM_BYTES else "regular",
             "shouldIgnore": False} for f in files]})

    def _lfs_batch(self, httpx, payload):
        objects = []
        for o in payload["objects"]:
            entry = {"oid": o["oid"], "size": o["size"]}
            if o["oid"] not in self.lfs:
                entry["actions"] = {"upload": {"href": f"{ENDPOINT}/lfs/{o['oid']}"}}
            objects.append(entry)
        return _json(httpx, {"transfer": "basic", "objects": objects})

    def _commit(self, httpx, request, repo_id, rev, authorised):
        repo, err = self._repo(httpx, repo_id, authorised)
        if err is not None:
            return err
        files, summary = {}, ""
        for line in request.content.splitlines():
            item = json.loads(line)
            value = item["value"]
            if item["key"] == "header":
                summary = value["summary"]
            elif item["key"] == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif item["key"] == "lfsFile":
                if value["oid"] not in self.lfs:
                    return httpx.Response(422, json={"error": f"LFS object {value['oid']} "
                                                              "was never uploaded"})
                files[value["path"]] = self.lfs[value["oid"]]
        oid = repo.commit(files, summary)
        return _json(httpx, {"commitUrl": f"{ENDPOINT}/{repo_id}/commit/{oid}",
                             "commitOid": oid, "pullRequestUrl": None})


def _httpx_module():
    """The httpx the installed huggingface_hub is built on (httpx before 2.x, httpx2 after)."""
    from huggingface_hub.utils import _http

    return getattr(_http, "httpx2", None) or _http.httpx

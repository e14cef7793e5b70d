"""Resolve an image tag to its manifest digest through the OCI distribution API (container
image registries; the model registry of trained weights is training/registry.py).

`HEAD /v2/<repository>/manifests/<tag>` with the manifest media types in `Accept`; the answer's
`Docker-Content-Digest` is the digest (`sha256:…`) that Kubernetes pulls by when a Job names
`repository@sha256:…`. Where a registry sends no digest on HEAD, the manifest is fetched and
hashed (the digest of a manifest is the sha256 of its bytes). Registries that want a token
answer 401 with `WWW-Authenticate: Bearer realm=…,service=…,scope=…`; the token is fetched
(with basic credentials, if given) and the request repeated. Standard library only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
DOCKER_HUB = "registry-1.docker.io"


class RegistryError(Exception):
    """The digest could not be resolved; the message says why, for a person."""


@dataclass(frozen=True)
class ImageName:
    registry: str  # host[:port]
    repository: str
    tag: str

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}:{self.tag}"


def parse_image(reference: str) -> ImageName:
    """`host:port/team/yolo:v8n` → (host:port, team/yolo, v8n); Docker Hub when no host."""
    if "@" in reference:
        raise RegistryError(f"{reference} is already pinned to a digest")
    first, _, rest = reference.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, rest
    else:
        registry, path = DOCKER_HUB, reference
        if "/" not in path:
            path = f"library/{path}"
    repository, _, tag = path.rpartition(":") if ":" in path.rsplit("/", 1)[-1] else (path, "", "latest")
    if not repository or not re.match(r"^[a-z0-9]+([._/-][a-z0-9]+)*$", repository):
        raise RegistryError(f"{reference}: bad repository name {repository!r}")
    return ImageName(registry, repository, tag or "latest")


def resolve_digest(
    reference: str,
    *,
    plain_http: bool = False,
    username: str = "",
    password: str = "",
    timeout_s: float = 10.0,
) -> str:
    """The manifest digest `reference` (repository:tag) points to now."""
    image = parse_image(reference)
    scheme = "http" if plain_http else "https"
    url = f"{scheme}://{image.registry}/v2/{image.repository}/manifests/{urllib.parse.quote(image.tag)}"
    headers = {"Accept": ", ".join(MANIFEST_TYPES)}
    if username:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
    for method in ("HEAD", "GET"):
        status, answer_headers, body = _request(method, url, headers, timeout_s)
        if status == 401:
            headers["Authorization"] = _authorize(answer_headers, username, password, timeout_s, image)
            status, answer_headers, body = _request(method, url, headers, timeout_s)
        if status == 404:
            raise RegistryError(f"{image}: no such manifest (is the tag pushed?)")
        if status == 401 or status == 403:
            raise RegistryError(f"{image}: the registry refused access ({status}); give credentials")
        if status != 200:
            raise RegistryError(f"{image}: the registry answered {status}")
        digest = answer_headers.get("docker-content-digest", "")
        if DIGEST.match(digest):
            return digest
        if method == "GET":
            return "sha256:" + hashlib.sha256(body).hexdigest()
    raise RegistryError(f"{image}: no digest in the registry's answer")  # pragma: no cover


def _request(method: str, url: str, headers: dict[str, str], timeout_s: float) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method, headers=headers)  # noqa: S310 (http/https only)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, b""
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise RegistryError(f"{url}: the registry is unreachable ({reason})") from error


def _authorize(headers: dict[str, str], username: str, password: str, timeout_s: float, image: ImageName) -> str:
    challenge = headers.get("www-authenticate", "")
    scheme, _, params = challenge.partition(" ")
    if scheme.lower() == "basic":
        if not username:
            raise RegistryError(f"{image}: the registry wants a user name and password")
        return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
    if scheme.lower() != "bearer":
        raise RegistryError(f"{image}: unsupported authentication {challenge!r}")
    fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
    realm = fields.pop("realm", "")
    if not realm.startswith(("https://", "http://")):
        raise RegistryError(f"{image}: bad token realm {realm!r}")
    fields.setdefault("scope", f"repository:{image.repository}:pull")
    token_headers = {}
    if username:
        token_headers["Authorization"] = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
    status, _, body = _request("GET", f"{realm}?{urllib.parse.urlencode(fields)}", token_headers, timeout_s)
    if status != 200:
        raise RegistryError(f"{image}: the token service answered {status}")
    try:
        answer = json.loads(body)
        token = answer.get("token") or answer["access_token"]
    except (ValueError, KeyError, AttributeError) as error:
        raise RegistryError(f"{image}: the token service sent no token") from error
    return f"Bearer {token}"

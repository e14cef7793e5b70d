"""A thin client over the REST API. Every non-2xx answer becomes an ApiError carrying the
server's `{"code", "detail"}` so the command line can print the sentence the server wrote."""

from pathlib import Path
from typing import Any

import httpx

from gpubook_cli import __version__


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str, body: Any = None) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.body = status, code, detail, body


class Unreachable(Exception):
    pass


class Client:
    def __init__(self, url: str, token: str | None, *, timeout: float = 30.0) -> None:
        headers = {"Accept": "application/json", "User-Agent": f"gpubook-cli/{__version__}"}
        if token:
            headers["Authorization"] = f"Token {token}"
        self.url = url
        self._http = httpx.Client(base_url=f"{url}/api/v1/", headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path.lstrip("/"), **kwargs)
        except httpx.HTTPError as error:
            raise Unreachable(f"cannot reach {self.url}: {error}") from error
        if response.is_success:
            return response.json() if response.content else None
        raise self._error(response)

    @staticmethod
    def _error(response: httpx.Response) -> ApiError:
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and "detail" in body:
            return ApiError(response.status_code, str(body.get("code", "error")), str(body["detail"]), body)
        return ApiError(response.status_code, "http_error", f"HTTP {response.status_code} from {response.url}", body)

    def download(self, path: str, target: Path, **params: Any) -> int:
        """Stream a file answer into `target` (written under a temporary name, then renamed);
        returns its size in bytes."""
        partial = target.with_name(target.name + ".partial")
        try:
            with self._http.stream("GET", path.lstrip("/"), params=params) as response:
                if not response.is_success:
                    response.read()
                    raise self._error(response)
                with partial.open("wb") as handle:
                    for chunk in response.iter_bytes():
                        handle.write(chunk)
        except httpx.HTTPError as error:
            raise Unreachable(f"cannot reach {self.url}: {error}") from error
        partial.replace(target)
        return target.stat().st_size

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, json: Any = None) -> Any:
        return self.request("POST", path, json=json if json is not None else {})

    def get_all(self, path: str, **params: Any) -> list[dict]:
        """Every item of a paginated list (LimitOffsetPagination), following `next`."""
        page = self.get(path, **params)
        if isinstance(page, list):
            return page
        items = list(page["results"])
        while page.get("next"):
            try:
                response = self._http.get(page["next"])
            except httpx.HTTPError as error:
                raise Unreachable(f"cannot reach {self.url}: {error}") from error
            response.raise_for_status()
            page = response.json()
            items += page["results"]
        return items

"""Container health check for the web process: GET /healthz on this container, as a request
from the proxy would arrive (an allowed Host, X-Forwarded-Proto: https), without curl in the
image and without loading Django. Exit 0 when it answers 200."""

import http.client
import os
import sys


def main() -> int:
    host = (os.environ.get("ALLOWED_HOSTS") or "localhost").split(",")[0].strip().lstrip(".")
    if host in {"", "*"}:
        host = "localhost"
    port = int(os.environ.get("GPUBOOK_HEALTH_PORT", "8000"))
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/healthz", headers={"Host": host, "X-Forwarded-Proto": "https"})
        status = connection.getresponse().status
    except OSError as error:
        print(f"healthz: {error}", file=sys.stderr)
        return 1
    print(f"healthz: {status}")
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())

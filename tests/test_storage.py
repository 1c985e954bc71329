"""gs:// access through waypost.stores.gcs: transient errors are retried with
backoff, and the errors a user can act on are one line."""

from __future__ import annotations

import http.server
import threading
import urllib.error
import urllib.request

import pytest

from waypost import stores
from waypost.stores import gcs


class FlakyProxy(http.server.ThreadingHTTPServer):
    """Forwards to the emulator, but answers the first ``failures`` requests
    with 503 (what GCS says when it is overloaded)."""

    def __init__(self, upstream: str, failures: int):
        self.upstream, self.failures, self.seen = upstream, failures, 0
        super().__init__(("127.0.0.1", 0), ProxyHandler)


class ProxyHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        server: FlakyProxy = self.server  # type: ignore[assignment]
        server.seen += 1
        if server.seen <= server.failures:
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        try:
            with urllib.request.urlopen(server.upstream + self.path) as upstream:
                status, headers, body = upstream.status, upstream.headers, upstream.read()
        except urllib.error.HTTPError as exc:
            status, headers, body = exc.code, exc.headers, exc.read()
        self.send_response(status)
        for key in ("Content-Type",):
            if headers.get(key):
                self.send_header(key, headers[key])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky(gcs_emulator, monkeypatch):
    proxy = FlakyProxy(gcs_emulator, failures=0)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{proxy.server_address[1]}")
    stores.reset()
    yield proxy
    proxy.shutdown()
    stores.reset()


def test_transient_errors_are_retried(gcs_emulator, bucket, flaky):
    import gcsfs.core
    direct = gcsfs.core.GCSFileSystem(endpoint_url=gcs_emulator, token="anon", skip_instance_cache=True)
    direct.pipe_file(f"{bucket[len('gs://'):]}/x/_manifest.json", b'{"state": "SUCCESS", "attempts": []}')
    flaky.failures = 2
    assert gcs.filesystem(bucket)[0].cat_file(f"{bucket[5:]}/x/_manifest.json") == b'{"state": "SUCCESS", "attempts": []}'
    assert flaky.seen >= 3  # two 503s, then the answer


def test_errors_a_user_can_act_on_are_one_line():
    denied = gcs.explain(PermissionError("403 Forbidden: caller does not have gcs.objects.list"), "gs://b/p")
    assert str(denied) == ("gs://b/p: permission denied; check the credentials "
                           "(GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth application-default login`)")
    assert str(gcs.explain(FileNotFoundError("b/nope/o"), "gs://nope/p")) == "gs://nope/p: not found (no such bucket?)"

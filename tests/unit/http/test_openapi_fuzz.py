"""Schemathesis against our own OpenAPI document: every route and method, with generated
bodies, queries and paths, authenticated with an admin key (it may use every route), through
a real HTTP server (uvicorn on loopback) in front of the in-process gateway. No answer may be
a 500 (503 is fine: no model deployment runs here), and every answer must match the schema
the document gives for its status. Bounded: a few examples per operation."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import response_schema_conformance
from schemathesis.core.failures import Failure

from serve_app.accounts.provisioning import bootstrap
from serve_app.gateway import create_prefixed_app
from serve_app.services import GatewayServices
from serve_app.settings import Settings

ADMIN_KEY = "fuzz-admin-key-0123456789abcdef"
EXAMPLES = 10  # per operation and mode (valid, invalid input): about 800 requests in all


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[str, GatewayServices]]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("fuzz"), admin_api_key=ADMIN_KEY,
                        initial_credit_usd=10, rate_limit_backend="local")
    bootstrap(settings)
    port = _free_port()
    services = GatewayServices.build(settings)
    config = uvicorn.Config(create_prefixed_app(services),
                            host="127.0.0.1", port=port, log_level="error", lifespan="on")
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}/api/v1"
    deadline = time.monotonic() + 120  # a server starting on a busy machine
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/models", timeout=30).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield base, services
    running.should_exit = True
    thread.join(timeout=10)


def no_server_error(ctx, response, case) -> bool | None:
    """500 is a bug; 503 (no deployment here) and 502/504 from a dead upstream are not."""
    if response.status_code == 500:
        raise Failure(operation=case.operation.label, title="Server error",
                      message=f"500: {response.text[:300]}", code=500)
    return None


def test_no_route_answers_500_or_outside_its_schema(server: tuple[str, GatewayServices]):
    # Operations are walked here rather than with schemathesis' pytest plugin, which does not
    # load under this pytest; each runs Hypothesis' examples the same way.
    server, services = server
    schema = schemathesis.openapi.from_url(f"{server}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 40
    failures: list[str] = []
    statuses: Counter[int] = Counter()
    for hour, (operation, mode) in enumerate(itertools.product(operations, GenerationMode)):
        # Each operation an hour later on the limiter's clock: the key's failed-request budget
        # (50 a minute, as the spec says) would otherwise answer 429 to most of the fuzzing.
        services.limits.clock = lambda later=3600.0 * (hour + 1): time.time() + later

        @given(case=operation.as_strategy(mode))
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case) -> None:
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {ADMIN_KEY}"}
            response = case.call(base_url=server, timeout=30)
            statuses[response.status_code] += 1
            case.validate_response(response,
                                   checks=[no_server_error, response_schema_conformance])

        try:
            check()
        except Unsatisfiable:  # no invalid input exists for an operation without inputs
            continue
        except Exception as exc:  # collect every operation's failure, then report them all
            failures.append(f"{operation.label} ({mode.value}): {str(exc)[:600]}")
    assert not failures, "\n\n".join(failures)
    # it did reach the routes: answers of every kind, most of them refusals of bad input
    assert statuses.total() > 400 and statuses[200] > 40 and statuses[400] > 100, statuses

"""Which answers a service waits out at start (services retry infrastructure setup with backoff):
a cluster without quorum answers the stream create with a **400** whose ``err_code`` is 10005 (no suitable peers),
and that must be retried like a timeout, while a genuine bad request is not."""

from __future__ import annotations

import pytest
from nats.errors import NoRespondersError, TimeoutError
from nats.js.errors import APIError, BadRequestError, ServiceUnavailableError

from reel.shared.nats.infra import setup_retryable


def _api(cls: type[APIError], code: int, err_code: int, description: str) -> APIError:
    return cls(code=code, err_code=err_code, description=description)


@pytest.mark.parametrize("exc", [
    _api(BadRequestError, 400, 10005, "no suitable peers for placement"),
    _api(ServiceUnavailableError, 503, 10008, "JetStream system temporarily unavailable"),
    _api(APIError, 500, 10009, "JetStream cluster not leader"),
    TimeoutError(), NoRespondersError(),
], ids=repr)
def test_a_cluster_that_is_not_ready_yet_is_waited_out(exc: BaseException) -> None:
    assert setup_retryable(exc)


@pytest.mark.parametrize("exc", [
    _api(BadRequestError, 400, 10052, "replicas > 1 not supported in non-clustered mode"),
    _api(BadRequestError, 400, 10058, "stream name already in use with a different configuration"),
    ValueError("bad config"),
], ids=repr)
def test_a_real_refusal_is_raised_at_once(exc: BaseException) -> None:
    assert not setup_retryable(exc)


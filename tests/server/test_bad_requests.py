"""The torch backend refuses every bad request of tests/helpers/bad_requests.py with a 400 naming the field, reads
a JSON body without Content-Type as JSON, and keeps serving (issue 55)."""

from __future__ import annotations

import pytest

from tests.helpers.bad_requests import (
    BAD_REQUESTS,
    check_json_without_content_type,
    check_refused,
    check_still_serves,
)
from tests.helpers.server_harness import ServerThread, shared_tiny_model_dir

CASES = [c for c in BAD_REQUESTS if not c.sglang_only]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServerThread(shared_tiny_model_dir(tmp_path_factory), speculative_algorithm="HISTOSPEC") as srv:
        yield srv


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_request_is_refused_naming_the_field(server, case) -> None:
    check_refused(server.url, case)


def test_json_body_without_content_type_is_read_as_json(server) -> None:
    check_json_without_content_type(server.url)


def test_still_serves_after_bad_requests(server) -> None:
    for case in CASES:
        check_refused(server.url, case)
    check_still_serves(server.url)

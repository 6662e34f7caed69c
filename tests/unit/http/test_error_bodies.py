"""One error body builder pair: a JSON answer's body and a started stream's error, from the same
`ApiError` (errors.py), rendered by serve_app/http/render.py."""

import json

from serve_app.errors import ApiError, error_body, invalid_request, stream_error_body
from serve_app.http.render import error_response


def test_json_error_answer_is_the_standard_error_with_status_and_headers():
    err = ApiError(429, "Too many", code="RATE_LIMIT_EXCEEDED", headers={"Retry-After": "1"})
    answer = error_response(err)
    assert answer.status_code == 429
    assert answer.headers["retry-after"] == "1"
    assert json.loads(answer.body) == {"error": "Too many", "code": "RATE_LIMIT_EXCEEDED"}


def test_detailed_error_body_keeps_its_details():
    assert error_body(invalid_request("bad", "model"))["details"] == {
        "_errors": [], "model": {"_errors": ["bad"]}}


def test_chat_stream_error_is_the_chat_convention_error_object_with_the_code_beside():
    err = ApiError(503, "busy", code="MODEL_AT_CAPACITY")
    assert error_body(err) == {"error": "busy", "code": "MODEL_AT_CAPACITY"}  # answered as JSON
    assert stream_error_body(err, "chat") == {  # once the stream has started
        "error": {"message": "busy", "type": "server_error", "code": "MODEL_AT_CAPACITY"},
        "code": "MODEL_AT_CAPACITY"}
    limited = ApiError(429, "slow down", code="RATE_LIMIT_EXCEEDED")
    assert stream_error_body(limited, "chat")["error"]["type"] == "rate_limit_error"


def test_responses_stream_error_is_the_responses_api_error_object():
    err = ApiError(500, "engine failed", code="INFERENCE_FAILED")
    assert stream_error_body(err, "responses") == {"code": "INFERENCE_FAILED",
                                                    "message": "engine failed"}

"""A SIGN-IN-WITH-X header is a known caller only once its signature checks out
(serve_app/caller_gate.py): a forged one that merely decodes gets no body read, the 1 MB cap
of a caller not known yet, and the 401 from the headers; a real one keeps its large body and
its nonce for the route to use, once."""

from __future__ import annotations

import base64
import json

from serve_app.caller_gate import ANONYMOUS_BODY_BYTES
from tests.unit.conftest import Gateway
from tests.unit.http.test_body_before_caller import Upload, call, run
from tests.unit.wallets.wallet_gateway import CHAT_URL, TOP_UP
from tests.wallets import Wallet, signed_in

CHAT = "/api/v1/chat/completions"
FIVE_MB = 5 * 1024 * 1024


def forged(header: str) -> str:
    """`header` with its signature replaced: it decodes, names the wallet, and proves nothing."""
    payload = json.loads(base64.b64decode(header))
    payload["signature"] = "0x" + "00" * 65
    return base64.b64encode(json.dumps(payload).encode()).decode()


def nested_arrays(size: int) -> bytes:
    """`[[],[],...]` of about `size` bytes: millions of lists for a parser to build."""
    return b"[" + b"[]," * (size // 3) + b"[]]"


def test_a_forged_wallet_header_is_refused_before_a_byte_of_the_body_is_read(gw: Gateway):
    header = forged(signed_in(gw.client, Wallet(), CHAT_URL)["SIGN-IN-WITH-X"])

    async def scenario(app):
        for headers in ({"content-type": "application/json", "content-length": str(FIVE_MB)},
                        {"transfer-encoding": "chunked"}):  # and no Content-Type at all
            upload = Upload([nested_arrays(FIVE_MB)], hold=True)
            status, _, body = await call(app, "POST", CHAT, upload,
                                         {"sign-in-with-x": header, **headers})
            assert (status, body["code"]) == (401, "AUTHENTICATION_FAILED"), body
            assert "signature" in body["error"]
            assert upload.reads == 0, headers

    run(gw, scenario)


def test_a_forged_wallet_header_keeps_the_cap_of_a_caller_not_known_yet(gw: Gateway):
    header = forged(signed_in(gw.client, Wallet(), CHAT_URL)["SIGN-IN-WITH-X"])

    async def scenario(app):
        upload = Upload(hold=True)
        status, _, body = await call(app, "POST", TOP_UP, upload, {
            "sign-in-with-x": header, "content-type": "application/json",
            "content-length": str(2 * ANONYMOUS_BODY_BYTES)})
        assert (status, body["code"], upload.reads) == (413, "PAYLOAD_TOO_LARGE", 0)

    run(gw, scenario)


def test_a_signed_in_wallet_sends_a_large_body_and_uses_its_nonce_once(gw: Gateway):
    headers = signed_in(gw.client, Wallet(), CHAT_URL)
    padding = "a" * (2 * ANONYMOUS_BODY_BYTES)
    body = {"model": "no-such-model", "messages": [{"role": "user", "content": padding}]}

    first = gw.client.post(CHAT, headers=headers, json=body)
    again = gw.client.post(CHAT, headers=headers, json={"model": "no-such-model",
                                                        "messages": []})

    # Read and parsed: the route's own answer (the model is unknown), not a cap's.
    assert (first.status_code, first.json()["code"]) == (404, "MODEL_NOT_FOUND"), first.text
    assert again.status_code == 401 and "nonce" in again.json()["error"].lower(), again.text


def test_sign_ins_are_counted_per_ipv6_64_before_any_signature_is_checked(gw: Gateway):
    gw.services.wallets.sign_ins.per_minute = 2
    header = forged(signed_in(gw.client, Wallet(), CHAT_URL)["SIGN-IN-WITH-X"])

    async def scenario(app):
        statuses = []
        for host in ("2001:db8:5:5::1", "2001:db8:5:5::2", "2001:db8:5:5:ffff::3",
                     "2001:db8:5:6::1"):
            status, _, _ = await call(app, "POST", CHAT, Upload(hold=True), {
                "sign-in-with-x": header, "content-type": "application/json",
                "content-length": "100"}, client=host)
            statuses.append(status)
        # The third address of the same /64 is refused before its signature is checked;
        # the next /64 is another client.
        assert statuses == [401, 401, 429, 401]

    run(gw, scenario)

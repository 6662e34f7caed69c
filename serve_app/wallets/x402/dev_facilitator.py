"""A development x402 facilitator that MOVES NO MONEY.

It answers the facilitator API (`POST /verify`, `POST /settle`, `GET /supported`) with the
checks the gateway itself runs (the payment matches the requirement it is sent, then
verify_evm / verify_solana), and "settles" by recording the payment: `transaction` is a
deterministic fake id (`0x` + sha256 of the payment id on EVM, base58 of its sha512 on
Solana), and a payment already settled is refused (`errorReason: "already_settled"`) as the
chain refuses a used EIP-3009 nonce or a duplicate transaction. Nothing is checked against a
chain: balances, blockhashes and nonces used elsewhere are not seen.

For local runs and tests only; it binds loopback addresses only:

    python -m serve_app.wallets.x402.dev_facilitator --host 127.0.0.1 --port 8402

`start_in_thread()` runs it in a daemon thread (`X402_FACILITATOR_URL=dev`, tests).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import base58
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from solders.keypair import Keypair

from serve_app.net_guard import is_loopback

from .evm import verify_evm
from .payload import check_payload_matches, parse_payment_payload
from .requirements import (
    ASSETS,
    BASE_NETWORK,
    NETWORK_V1_NAMES,
    SCHEME_EXACT,
    SOLANA_NETWORK,
    VerifiedPayment,
    X402PaymentError,
    parse_base_units,
    same_address,
)
from .solana import decode_transaction, verify_solana

logger = logging.getLogger("serve_app.x402.dev_facilitator")

# The fee payer the development facilitator advertises unless told another one: a key
# derived from a fixed seed (it never signs anything).
DEV_SOLANA_FEE_PAYER = str(
    Keypair.from_seed(hashlib.sha256(b"x402 development facilitator").digest()).pubkey())

MAX_REQUEST_BYTES = 64 * 1024

WARNING = ("x402 DEVELOPMENT FACILITATOR: it checks signatures but MOVES NO MONEY; every "
           "payment it 'settles' is fake. Never point a production gateway at it.")


class _Refusal(Exception):
    def __init__(self, reason: str, message: str, payer: str | None = None) -> None:
        super().__init__(message)
        self.reason, self.message, self.payer = reason, message, payer


def fake_transaction(payment: VerifiedPayment) -> str:
    """The deterministic transaction id a settled payment gets."""
    seed = payment.payment_id.encode()
    if payment.network == SOLANA_NETWORK:
        return base58.b58encode(hashlib.sha512(seed).digest()).decode()
    return "0x" + hashlib.sha256(seed).hexdigest()


def _check_requirement(requirement: object, fee_payers: frozenset[str]) -> dict[str, Any]:
    """A requirement of a kind this facilitator supports (USDC, exact, our fee payer)."""
    if not isinstance(requirement, dict):
        raise _Refusal("invalid_payment_requirements", "paymentRequirements must be an object")
    for key in ("scheme", "network", "asset", "amount", "payTo"):
        if not isinstance(requirement.get(key), str):
            raise _Refusal("invalid_payment_requirements", f"paymentRequirements.{key}")
    timeout = requirement.get("maxTimeoutSeconds")
    if type(timeout) is not int or timeout <= 0:
        raise _Refusal("invalid_payment_requirements", "paymentRequirements.maxTimeoutSeconds")
    extra = requirement.get("extra") or {}
    if not isinstance(extra, dict):
        raise _Refusal("invalid_payment_requirements", "paymentRequirements.extra")
    network = requirement["network"]
    if requirement["scheme"] != SCHEME_EXACT or network not in ASSETS:
        raise _Refusal("unsupported_scheme", f"unsupported kind {requirement['scheme']} "
                                             f"on {network}")
    if not same_address(network, requirement["asset"], ASSETS[network]):
        raise _Refusal("unsupported_asset", "only USDC is supported")
    if parse_base_units(requirement["amount"]) is None:
        raise _Refusal("invalid_payment_requirements", "paymentRequirements.amount")
    if network == SOLANA_NETWORK and extra.get("feePayer") not in fee_payers:
        raise _Refusal("fee_payer_not_managed_by_facilitator",
                       "the fee payer is not this facilitator's")
    return requirement


def create_app(*, solana_fee_payer: str | None = None,
               clock: Callable[[], float] = time.time) -> FastAPI:
    """The development facilitator. `solana_fee_payer`: the fee payer it manages
    (default DEV_SOLANA_FEE_PAYER)."""
    fee_payer = solana_fee_payer or DEV_SOLANA_FEE_PAYER
    fee_payers = frozenset({fee_payer})
    settled: dict[str, str] = {}  # payment id (or Solana message hash) -> fake transaction
    lock = threading.Lock()
    app = FastAPI(title="x402 development facilitator (moves no money)", docs_url=None,
                  redoc_url=None, openapi_url=None)
    app.state.settled = settled

    async def read(request: Request) -> tuple[VerifiedPayment, list[str]]:
        """The verified payment of a verify/settle request and the keys naming it (its
        payment id and, on Solana, its message: the chain refuses the same message twice
        whichever signature of the payer it carries)."""
        raw = await request.body()
        if len(raw) > MAX_REQUEST_BYTES:
            raise _Refusal("invalid_request", "request too large")
        try:
            body = json.loads(raw)
        except ValueError:
            raise _Refusal("invalid_request", "body is not JSON") from None
        if not isinstance(body, dict):
            raise _Refusal("invalid_request", "body must be an object")
        requirement = _check_requirement(body.get("paymentRequirements"), fee_payers)
        try:
            payload = parse_payment_payload(body.get("paymentPayload"))
            check_payload_matches(payload, requirement)
            if requirement["network"] == BASE_NETWORK:
                verified = verify_evm(payload, requirement, clock())
            else:
                verified = verify_solana(payload, requirement)
        except X402PaymentError as exc:
            raise _Refusal(exc.reason, exc.message) from None
        keys = [verified.payment_id]
        if verified.network == SOLANA_NETWORK:
            message = bytes(decode_transaction(payload.payload).message)
            keys.append("message:" + hashlib.sha256(message).hexdigest())
        return verified, keys

    def refusal_body(kind: str, exc: _Refusal, network: str | None) -> dict[str, Any]:
        if kind == "verify":
            return {"isValid": False, "invalidReason": exc.reason,
                    "invalidMessage": exc.message, "payer": exc.payer}
        return {"success": False, "errorReason": exc.reason, "errorMessage": exc.message,
                "payer": exc.payer, "transaction": "", "network": network or ""}

    @app.post("/verify")
    async def verify(request: Request) -> JSONResponse:
        try:
            verified, _ = await read(request)
        except _Refusal as exc:
            return JSONResponse(refusal_body("verify", exc, None))
        return JSONResponse({"isValid": True, "payer": verified.payer})

    @app.post("/settle")
    async def settle(request: Request) -> JSONResponse:
        try:
            verified, keys = await read(request)
        except _Refusal as exc:
            return JSONResponse(refusal_body("settle", exc, None))
        with lock:
            if any(key in settled for key in keys):
                exc = _Refusal("already_settled", "this payment was already settled",
                               verified.payer)
                return JSONResponse(refusal_body("settle", exc, verified.network))
            transaction = fake_transaction(verified)
            for key in keys:
                settled[key] = transaction
        logger.warning("x402 dev facilitator: fake settlement of %s base units from %s on %s "
                       "(no money moved)", verified.amount_base_units, verified.payer,
                       verified.network)
        return JSONResponse({"success": True, "payer": verified.payer,
                             "transaction": transaction, "network": verified.network,
                             "amount": str(verified.amount_base_units)})

    @app.get("/supported")
    async def supported() -> JSONResponse:
        kinds = []
        for version in (2, 1):
            for network in (BASE_NETWORK, SOLANA_NETWORK):
                kind: dict[str, Any] = {
                    "x402Version": version, "scheme": SCHEME_EXACT,
                    "network": network if version == 2 else NETWORK_V1_NAMES[network]}
                if network == SOLANA_NETWORK:
                    kind["extra"] = {"feePayer": fee_payer}
                kinds.append(kind)
        return JSONResponse({"kinds": kinds, "extensions": [],
                             "signers": {"eip155:*": [], "solana:*": [fee_payer]}})

    return app


def _bind(host: str, port: int) -> socket.socket:
    if not is_loopback(host):
        raise ValueError(f"the development facilitator binds loopback addresses only, not "
                         f"{host!r}")
    address = "127.0.0.1" if host == "localhost" else host
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError:
        sock.close()
        raise
    return sock


def start_in_thread(host: str = "127.0.0.1", port: int = 0, *,
                    solana_fee_payer: str | None = None,
                    timeout_s: float = 10.0) -> tuple[str, Callable[[], None]]:
    """Serve the development facilitator from a daemon thread on `host`:`port` (0: a free
    port). Returns its base URL and a function that stops it."""
    import uvicorn

    sock = _bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    config = uvicorn.Config(create_app(solana_fee_payer=solana_fee_payer), log_level="warning",
                            lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name="x402-dev-facilitator", daemon=True)
    logger.warning(WARNING)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError("the development facilitator did not start")
        time.sleep(0.01)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout_s)
        sock.close()

    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return f"http://{shown}:{bound_port}", stop


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m serve_app.wallets.x402.dev_facilitator",
        description="x402 development facilitator: checks payments, MOVES NO MONEY.")
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address")
    parser.add_argument("--port", type=int, default=8402)
    parser.add_argument("--solana-fee-payer", default=None,
                        help=f"the Solana fee payer it manages (default {DEV_SOLANA_FEE_PAYER})")
    args = parser.parse_args(None if argv is None else list(argv))
    if not is_loopback(args.host):
        parser.error(f"refusing to bind {args.host!r}: the development facilitator moves no "
                     f"money and binds loopback addresses only")
    import uvicorn

    logging.basicConfig(level=logging.INFO)
    banner = "!" * 78
    for line in (banner, WARNING, banner):
        logger.warning(line)
    uvicorn.run(create_app(solana_fee_payer=args.solana_fee_payer), host=args.host,
                port=args.port, log_level="info")


if __name__ == "__main__":
    main()

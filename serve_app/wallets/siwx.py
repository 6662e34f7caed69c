"""SIGN-IN-WITH-X: wallet callers prove who they are with a signed sign-in message.

The header `SIGN-IN-WITH-X` (legacy `X-Sign-In-With-X`) holds base64 of a JSON object. Two
shapes are accepted:

- the published one, `{address, message, signature, timestamp, chainId, type?}`, where
  `message` is the signed text: an EIP-4361 (SIWE) message for EVM wallets, or the Solana
  sign-in message (CAIP-122 layout) for Solana wallets;
- the x402 protocol's own one (what an x402 client sends after a 402 that declares the
  `sign-in-with-x` extension): the message fields spelled out (`domain, uri, version, nonce,
  issuedAt, ...`) and no `message`. The text the wallet signed is rebuilt from the fields
  in the standard layout and then checked exactly like a published payload.

Only Base (eip155:8453, EIP-191 personal_sign) and Solana mainnet (ed25519) are accepted.
Nonce replay is not checked here: the caller stores `SignIn.nonce` until `SignIn.expires_at`.
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import base58
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_utils import to_checksum_address
from nacl.exceptions import CryptoError
from nacl.signing import VerifyKey

from serve_app.wallets.siwx_message import (  # noqa: F401 (re-exported)
    BASE_CHAIN_ID,
    CHALLENGE_LIFETIME,
    DEFAULT_LIFETIME,
    EVM_ADDRESS_RE,
    EXTENSION_KEY,
    HEADER_NAME,
    LEGACY_HEADER_NAME,
    MAX_CLOCK_SKEW,
    MAX_HEADER_BYTES,
    MAX_LIFETIME,
    NONCE_RE,
    SOLANA_MAINNET_CHAIN_ID,
    STATEMENT,
    SUPPORTED_CHAINS,
    BadMessage,
    Family,
    SignedMessage,
    SiwxPayload,
    b64decode,
    decode_header,
    message_chain_id,
    normalize_chain_id,
    parse_message,
    parse_time,
    refused,
    unsupported_chain,
)


@dataclass(frozen=True)
class SignIn:
    """A verified sign-in.

    `expires_at` is the last instant at which `verify` accepts this message (its expiration,
    or issuedAt + DEFAULT_LIFETIME, plus MAX_CLOCK_SKEW): a nonce store must remember
    `nonce` at least until then.
    """

    address: str
    chain_id: str
    family: Family
    nonce: str
    issued_at: datetime
    expires_at: datetime


# --- verification ------------------------------------------------------------------------


def verify(payload: SiwxPayload, *, accepted_domains: frozenset[str], request_host: str,
           now: datetime) -> SignIn:
    """Check the message and its signature; any failure is a 401 naming what is wrong.

    The message's domain must be one of `accepted_domains` (lower-case host[:port]) or, when
    that set is empty, the request's own host.
    """
    now = _as_utc(now)
    chain_id = normalize_chain_id(payload.chain_id)
    if chain_id not in SUPPORTED_CHAINS:
        raise unsupported_chain(chain_id)
    family: Family = "evm" if chain_id.startswith("eip155:") else "solana"
    expected_type = SUPPORTED_CHAINS[chain_id]
    if payload.type is not None and payload.type != expected_type:
        raise refused(f"signature type {payload.type[:40]!r} is not supported on {chain_id}; "
                       f"use {expected_type!r}")

    try:
        message = parse_message(payload.message)
    except BadMessage as exc:
        raise refused(f"the message is not a valid sign-in message ({exc})") from None
    if message.family != family:
        account = "an Ethereum" if message.family == "evm" else "a Solana"
        raise refused(f"the message is {account} sign-in message but chainId is {chain_id}")
    message_chain = message_chain_id(message)
    if message_chain != chain_id:
        raise refused(f"the message's Chain ID ({message_chain[:80]}) does not match chainId "
                       f"{chain_id}")

    _check_domain_and_uri(message, accepted_domains, request_host)
    if message.version != "1":
        raise refused(f"Version {message.version[:20]!r} is not supported; use '1'")
    if not NONCE_RE.fullmatch(message.nonce):
        raise refused("the Nonce must be 8 to 64 letters or digits")
    issued_at, expires_at = _check_times(message, now)

    verify_signature = _verify_evm if family == "evm" else _verify_solana
    address = verify_signature(payload, message)
    return SignIn(address=address, chain_id=chain_id, family=family, nonce=message.nonce,
                  issued_at=issued_at, expires_at=expires_at)


def _as_utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _check_domain_and_uri(message: SignedMessage, accepted_domains: frozenset[str],
                          request_host: str) -> None:
    domain = message.domain.lower()
    if accepted_domains:
        if domain not in {d.lower() for d in accepted_domains}:
            raise refused(f"the message is for domain {message.domain[:100]!r}, which this "
                           "server does not accept")
    elif domain != request_host.lower():
        raise refused(f"the message is for domain {message.domain[:100]!r}, not "
                       f"{request_host[:100]!r}")
    if message.scheme is not None and message.scheme.lower() not in ("http", "https"):
        raise refused(f"scheme {message.scheme[:20]!r} in the message is not http or https")
    try:
        uri = urlsplit(message.uri)
    except ValueError:
        raise refused(f"URI {message.uri[:100]!r} is not a valid URL") from None
    if uri.scheme.lower() not in ("http", "https"):
        raise refused(f"URI {message.uri[:100]!r} is not an http or https URL")
    if uri.netloc.lower() != domain:
        raise refused(f"URI {message.uri[:100]!r} is not on the message's domain "
                       f"{message.domain[:100]!r}")


def _check_times(message: SignedMessage, now: datetime) -> tuple[datetime, datetime]:
    """(issuedAt, the last instant the message is accepted)."""
    issued_at = parse_time(message.issued_at, "Issued At")
    if issued_at > now + MAX_CLOCK_SKEW:
        raise refused(f"the message is issued in the future (Issued At {message.issued_at})")
    if now - issued_at > MAX_LIFETIME:
        raise refused(f"the message was issued more than {_minutes(MAX_LIFETIME)} minutes ago "
                       f"(Issued At {message.issued_at}); sign a new one")
    if message.expiration_time is not None:
        expires = parse_time(message.expiration_time, "Expiration Time")
        if expires <= issued_at:
            raise refused("the message's Expiration Time is not after its Issued At")
        if expires - issued_at > MAX_LIFETIME:
            raise refused("the message's lifetime (Expiration Time - Issued At) exceeds "
                           f"{_minutes(MAX_LIFETIME)} minutes")
    else:
        expires = issued_at + DEFAULT_LIFETIME
    deadline = expires + MAX_CLOCK_SKEW
    if now >= deadline:
        raise refused(f"the message expired at {_iso(expires)}; sign a new one")
    if message.not_before is not None:
        not_before = parse_time(message.not_before, "Not Before")
        if not_before > now + MAX_CLOCK_SKEW:
            raise refused(f"the message is not valid before {message.not_before}")
    return issued_at, deadline


def _minutes(span: timedelta) -> int:
    return int(span.total_seconds() // 60)


def _verify_evm(payload: SiwxPayload, message: SignedMessage) -> str:
    if not EVM_ADDRESS_RE.fullmatch(message.address):
        raise refused("the address in the message is not an EVM address")
    if message.address.lower() != payload.address.lower():
        raise refused(f"the message is signed in as {message.address}, not as the payload "
                       f"address {payload.address[:64]}")
    address = to_checksum_address(message.address)
    hex_sig = payload.signature.removeprefix("0x").removeprefix("0X")
    try:
        signature = bytes.fromhex(hex_sig)
    except ValueError:
        signature = b""
    if len(signature) != 65:
        raise refused("the signature is not a 65-byte hex string")
    try:
        signer = Account.recover_message(encode_defunct(text=payload.message),
                                         signature=signature)
    except Exception:  # eth-keys raises several types for unrecoverable signatures
        raise refused("the signature is not valid") from None
    if signer.lower() != address.lower():
        raise refused(f"the signature was not made by {address}")
    return address


def _verify_solana(payload: SiwxPayload, message: SignedMessage) -> str:
    if message.address != payload.address:
        raise refused(f"the message is signed in as {message.address[:64]}, not as the payload "
                       f"address {payload.address[:64]}")
    try:
        public_key = base58.b58decode(payload.address)
    except ValueError:
        public_key = b""
    if len(public_key) != 32:
        raise refused("the address is not a base58 Solana public key")
    candidates = _solana_signatures(payload.signature)
    if not candidates:
        raise refused("the signature is not a 64-byte base58 or base64 string")
    key = VerifyKey(public_key)
    data = payload.message.encode("utf-8")
    for signature in candidates:
        try:
            key.verify(data, signature)
            return payload.address
        except CryptoError:
            continue
    raise refused(f"the signature was not made by {payload.address}")


def _solana_signatures(text: str) -> list[bytes]:
    """Every 64-byte reading of `text`: base58 and base64 can both fit the same string."""
    readings = []
    with contextlib.suppress(ValueError):
        readings.append(base58.b58decode(text))
    decoded = b64decode(text)
    if decoded is not None:
        readings.append(decoded)
    return [sig for sig in dict.fromkeys(readings) if len(sig) == 64]


# --- challenges --------------------------------------------------------------------------


def _iso(moment: datetime) -> str:
    """ISO 8601 in UTC with milliseconds and Z, as JavaScript's toISOString writes it."""
    return _as_utc(moment).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def challenge(domain: str, uri: str, now: datetime) -> dict[str, Any]:
    """The `siwxChallenge` object of a 402: what to sign, with a fresh nonce."""
    return {
        "info": {
            "domain": domain,
            "uri": uri,
            "version": "1",
            "nonce": secrets.token_hex(8),
            "issuedAt": _iso(now),
            "expirationTime": _iso(_as_utc(now) + CHALLENGE_LIFETIME),
            "statement": STATEMENT,
        },
        "supportedChains": [{"chainId": chain_id, "type": sig_type}
                            for chain_id, sig_type in SUPPORTED_CHAINS.items()],
    }


# JSON Schema of the payload an x402 client sends back (the x402 extension declares one).
_PAYLOAD_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        **{name: {"type": "string"} for name in (
            "domain", "address", "statement", "version", "chainId", "type", "nonce",
            "requestId", "signature")},
        "uri": {"type": "string", "format": "uri"},
        **{name: {"type": "string", "format": "date-time"} for name in (
            "issuedAt", "expirationTime", "notBefore")},
        "resources": {"type": "array", "items": {"type": "string", "format": "uri"}},
    },
    "required": ["domain", "address", "uri", "version", "chainId", "type", "nonce", "issuedAt",
                 "signature"],
}


def discovery_extension(domain: str, uri: str, now: datetime) -> dict[str, Any]:
    """`{"sign-in-with-x": {...}}` for the `extensions` object of an x402 402 body.

    Same shape as the x402 server produces (info with `resources`, supportedChains, schema),
    built from a fresh `challenge`, so x402 clients sign in without paying.
    """
    base = challenge(domain, uri, now)
    return {EXTENSION_KEY: {
        "info": {**base["info"], "resources": [uri]},
        "supportedChains": base["supportedChains"],
        "schema": _PAYLOAD_SCHEMA,
    }}

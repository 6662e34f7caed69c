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

import base64
import binascii
import contextlib
import json
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from urllib.parse import urlsplit

import base58
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_utils import to_checksum_address
from nacl.exceptions import CryptoError
from nacl.signing import VerifyKey
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from serve_app.errors import ApiError

HEADER_NAME = "SIGN-IN-WITH-X"
LEGACY_HEADER_NAME = "X-Sign-In-With-X"
EXTENSION_KEY = "sign-in-with-x"

BASE_CHAIN_ID = "eip155:8453"
SOLANA_MAINNET_CHAIN_ID = "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp"
SUPPORTED_CHAINS: dict[str, Literal["eip191", "ed25519"]] = {
    BASE_CHAIN_ID: "eip191",
    SOLANA_MAINNET_CHAIN_ID: "ed25519",
}

MAX_HEADER_BYTES = 8 * 1024
MAX_CLOCK_SKEW = timedelta(seconds=60)
MAX_LIFETIME = timedelta(hours=1)
DEFAULT_LIFETIME = timedelta(minutes=10)
CHALLENGE_LIFETIME = timedelta(minutes=5)
STATEMENT = "Sign in to the inference API"

Family = Literal["evm", "solana"]

_NONCE_RE = re.compile(r"[A-Za-z0-9]{8,64}")
_EVM_ADDRESS_RE = re.compile(r"0x[0-9a-fA-F]{40}")
_RFC3339_RE = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})")
_HEADER_LINE_RE = re.compile(
    r"(?:(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://)?(?P<domain>[^\s/?#]+)"
    r" wants you to sign in with your (?P<account>Ethereum|Solana) account:")
# Solana's `Chain ID:` line: the CAIP-2 reference, the full CAIP-2 id, or the cluster name
# that Solana wallets' own sign-in standard uses.
_SOLANA_MAINNET_NAMES = frozenset({
    SOLANA_MAINNET_CHAIN_ID, SOLANA_MAINNET_CHAIN_ID.split(":", 1)[1], "mainnet", "solana:mainnet",
})
_FIELD_NAMES = {
    "URI": "uri", "Version": "version", "Chain ID": "chain", "Nonce": "nonce",
    "Issued At": "issued_at", "Expiration Time": "expiration_time", "Not Before": "not_before",
    "Request ID": "request_id",
}
_REQUIRED_FIELDS = ("URI", "Version", "Chain ID", "Nonce", "Issued At")


def _refused(reason: str) -> ApiError:
    return ApiError(401, f"Invalid SIGN-IN-WITH-X header: {reason}", code="AUTHENTICATION_FAILED")


class SiwxPayload(BaseModel):
    """The decoded header: who claims to sign in, the signed text and its signature."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    address: StrictStr = Field(min_length=1, max_length=128)
    message: StrictStr = Field(min_length=1, max_length=MAX_HEADER_BYTES)
    signature: StrictStr = Field(min_length=1, max_length=512)
    chain_id: StrictInt | StrictStr = Field(alias="chainId")
    type: StrictStr | None = None
    # Unsigned, so it proves nothing; the message's Issued At is what is checked.
    timestamp: StrictInt | float | None = None


class _X402Payload(BaseModel):
    """The x402 package's header shape: the message fields instead of the message text."""

    model_config = ConfigDict(populate_by_name=True)

    domain: StrictStr = Field(min_length=1, max_length=255)
    address: StrictStr = Field(min_length=1, max_length=128)
    uri: StrictStr = Field(min_length=1, max_length=2048)
    version: StrictStr
    chain_id: StrictStr = Field(alias="chainId")
    type: StrictStr | None = None
    nonce: StrictStr
    issued_at: StrictStr = Field(alias="issuedAt")
    statement: StrictStr | None = None
    expiration_time: StrictStr | None = Field(default=None, alias="expirationTime")
    not_before: StrictStr | None = Field(default=None, alias="notBefore")
    request_id: StrictStr | None = Field(default=None, alias="requestId")
    resources: list[StrictStr] | None = None
    signature: StrictStr = Field(min_length=1, max_length=512)


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


@dataclass(frozen=True)
class _Message:
    family: Family
    scheme: str | None
    domain: str
    address: str
    statement: str | None
    uri: str
    version: str
    chain: str
    nonce: str
    issued_at: str
    expiration_time: str | None
    not_before: str | None
    request_id: str | None
    resources: tuple[str, ...] | None


# --- header decoding ---------------------------------------------------------------------


def decode_header(value: str) -> SiwxPayload:
    """Decode the header value; anything malformed is a 401 naming what is wrong."""
    if len(value) > MAX_HEADER_BYTES:
        raise _refused(f"header is too large ({len(value)} bytes, limit {MAX_HEADER_BYTES})")
    raw = _b64decode(value.strip())
    if raw is None:
        raise _refused("not valid base64")
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _refused("not valid JSON") from None
    if not isinstance(obj, dict):
        raise _refused("the decoded JSON is not an object")
    if "message" not in obj and "domain" in obj:
        return _from_x402_payload(obj)
    try:
        return SiwxPayload.model_validate(obj)
    except ValidationError as exc:
        raise _refused(_describe(exc)) from None


def _b64decode(text: str) -> bytes | None:
    """Standard or URL-safe base64, padded or not; None when it is neither."""
    if not text:
        return None
    altchars = b"-_" if ("-" in text or "_" in text) else None
    padded = text + "=" * (-len(text) % 4)
    try:
        return base64.b64decode(padded, altchars=altchars, validate=True)
    except (binascii.Error, ValueError):
        return None


def _describe(exc: ValidationError) -> str:
    missing, invalid = [], []
    for err in exc.errors():
        loc = err.get("loc", ())
        name = str(loc[0]) if loc else "payload"
        (missing if err.get("type") == "missing" else invalid).append(name)
    parts = []
    if missing:
        parts.append("missing field(s): " + ", ".join(dict.fromkeys(missing)))
    if invalid:
        parts.append("invalid field(s): " + ", ".join(dict.fromkeys(invalid)))
    return "; ".join(parts)


def _from_x402_payload(obj: dict[str, Any]) -> SiwxPayload:
    try:
        fields = _X402Payload.model_validate(obj)
    except ValidationError as exc:
        raise _refused(_describe(exc)) from None
    texts = [fields.domain, fields.address, fields.uri, fields.version, fields.chain_id,
             fields.nonce, fields.issued_at, fields.statement or "", fields.expiration_time or "",
             fields.not_before or "", fields.request_id or "", *(fields.resources or [])]
    if any("\n" in text or "\r" in text for text in texts):
        raise _refused("a field contains a line break")
    chain_id = _normalize_chain_id(fields.chain_id)
    if chain_id.startswith("eip155:"):
        message = _format_evm_message(fields, chain_id.split(":", 1)[1])
    elif chain_id.startswith("solana:"):
        message = _format_solana_message(fields, chain_id.split(":", 1)[1])
    else:
        raise _unsupported_chain(chain_id)
    return SiwxPayload(address=fields.address, message=message, signature=fields.signature,
                       chain_id=fields.chain_id, type=fields.type)


def _format_evm_message(f: _X402Payload, chain: str) -> str:
    """The EIP-4361 text for these fields (the layout the x402 client signs)."""
    head = f"{f.domain} wants you to sign in with your Ethereum account:\n{f.address}\n\n"
    if f.statement is not None:
        head += f"{f.statement}\n"
    lines = [f"URI: {f.uri}", f"Version: {f.version}", f"Chain ID: {chain}",
             f"Nonce: {f.nonce}", f"Issued At: {f.issued_at}"]
    if f.expiration_time:
        lines.append(f"Expiration Time: {f.expiration_time}")
    if f.not_before:
        lines.append(f"Not Before: {f.not_before}")
    if f.request_id is not None:
        lines.append(f"Request ID: {f.request_id}")
    if f.resources is not None:
        lines.append("Resources:")
        lines.extend(f"- {resource}" for resource in f.resources)
    return head + "\n" + "\n".join(lines)


def _format_solana_message(f: _X402Payload, chain: str) -> str:
    """The Solana sign-in text for these fields (CAIP-122 layout, as the x402 client signs)."""
    lines = [f"{f.domain} wants you to sign in with your Solana account:", f.address, ""]
    if f.statement:
        lines += [f.statement, ""]
    lines += [f"URI: {f.uri}", f"Version: {f.version}", f"Chain ID: {chain}",
              f"Nonce: {f.nonce}", f"Issued At: {f.issued_at}"]
    if f.expiration_time:
        lines.append(f"Expiration Time: {f.expiration_time}")
    if f.not_before:
        lines.append(f"Not Before: {f.not_before}")
    if f.request_id:
        lines.append(f"Request ID: {f.request_id}")
    if f.resources:
        lines.append("Resources:")
        lines.extend(f"- {resource}" for resource in f.resources)
    return "\n".join(lines)


# --- message parsing ---------------------------------------------------------------------


class _BadMessage(Exception):
    pass


def _parse_message(text: str) -> _Message:
    """Parse an EIP-4361 or Solana sign-in message (same layout, different account word)."""
    lines = text.split("\n")
    while len(lines) > 1 and lines[-1] == "":
        lines.pop()
    if len(lines) < 4:
        raise _BadMessage("too short")
    header = _HEADER_LINE_RE.fullmatch(lines[0])
    if header is None:
        raise _BadMessage(
            "the first line must be '<domain> wants you to sign in with your Ethereum account:' "
            "(or '... Solana account:')")
    if lines[2] != "":
        raise _BadMessage("the address line must be followed by an empty line")
    uri_at = next((i for i, line in enumerate(lines) if line.startswith("URI: ")), None)
    if uri_at is None or uri_at < 3:
        raise _BadMessage("no URI line")
    statement_lines = [line for line in lines[3:uri_at] if line != ""]
    if len(statement_lines) > 1:
        raise _BadMessage("the statement must be a single line")

    values: dict[str, str] = {}
    resources: list[str] | None = None
    for line in lines[uri_at:]:
        if resources is not None:
            if not line.startswith("- "):
                raise _BadMessage(f"unexpected line after Resources: {line[:80]!r}")
            resources.append(line[2:])
            continue
        if line == "Resources:":
            resources = []
            continue
        key, sep, value = line.partition(": ")
        if not sep or key not in _FIELD_NAMES:
            raise _BadMessage(f"unexpected line {line[:80]!r}")
        if key in values:
            raise _BadMessage(f"{key} appears twice")
        values[key] = value
    for key in _REQUIRED_FIELDS:
        if key not in values:
            raise _BadMessage(f"no {key} line")
    return _Message(
        family="evm" if header["account"] == "Ethereum" else "solana",
        scheme=header["scheme"],
        domain=header["domain"],
        address=lines[1],
        statement=statement_lines[0] if statement_lines else None,
        uri=values["URI"],
        version=values["Version"],
        chain=values["Chain ID"],
        nonce=values["Nonce"],
        issued_at=values["Issued At"],
        expiration_time=values.get("Expiration Time"),
        not_before=values.get("Not Before"),
        request_id=values.get("Request ID"),
        resources=tuple(resources) if resources is not None else None,
    )


def _parse_time(value: str, field: str) -> datetime:
    if not _RFC3339_RE.fullmatch(value):
        raise _refused(f"{field} {value[:40]!r} is not an RFC 3339 timestamp with a time zone")
    try:
        return datetime.fromisoformat(value.upper()).astimezone(UTC)
    except (ValueError, OverflowError):
        raise _refused(f"{field} {value[:40]!r} is not a valid timestamp") from None


# --- chains ------------------------------------------------------------------------------


def _normalize_chain_id(chain_id: int | str) -> str:
    """`8453`, `"8453"` and `"eip155:8453"` are the same chain; the result is CAIP-2."""
    if isinstance(chain_id, int):
        return f"eip155:{chain_id}" if abs(chain_id) < 10**20 else "eip155:?"
    text = chain_id.strip()
    if (number := _decimal(text)) is not None:
        return f"eip155:{number}"
    namespace, sep, reference = text.partition(":")
    if namespace == "eip155" and (number := _decimal(reference)) is not None:
        return f"eip155:{number}"
    if namespace == "solana" and text in _SOLANA_MAINNET_NAMES:
        return SOLANA_MAINNET_CHAIN_ID
    return text if sep else f"unknown:{text}"


def _decimal(text: str) -> int | None:
    """An ASCII decimal of sensible length (a chain id), or None."""
    if 0 < len(text) <= 20 and text.isdecimal() and text.isascii():
        return int(text)
    return None


def _message_chain_id(message: _Message) -> str:
    if message.family == "evm":
        if (number := _decimal(message.chain)) is None:
            raise _refused(f"Chain ID {message.chain[:40]!r} in the message is not a number")
        return f"eip155:{number}"
    if message.chain in _SOLANA_MAINNET_NAMES:
        return SOLANA_MAINNET_CHAIN_ID
    chain = message.chain
    return chain if chain.startswith("solana:") else f"solana:{chain}"


def _unsupported_chain(chain_id: str) -> ApiError:
    return _refused(f"chain {chain_id[:80]!r} is not supported; use {BASE_CHAIN_ID} (Base) or "
                    f"{SOLANA_MAINNET_CHAIN_ID} (Solana mainnet)")


# --- verification ------------------------------------------------------------------------


def verify(payload: SiwxPayload, *, accepted_domains: frozenset[str], request_host: str,
           now: datetime) -> SignIn:
    """Check the message and its signature; any failure is a 401 naming what is wrong.

    The message's domain must be one of `accepted_domains` (lower-case host[:port]) or, when
    that set is empty, the request's own host.
    """
    now = _as_utc(now)
    chain_id = _normalize_chain_id(payload.chain_id)
    if chain_id not in SUPPORTED_CHAINS:
        raise _unsupported_chain(chain_id)
    family: Family = "evm" if chain_id.startswith("eip155:") else "solana"
    expected_type = SUPPORTED_CHAINS[chain_id]
    if payload.type is not None and payload.type != expected_type:
        raise _refused(f"signature type {payload.type[:40]!r} is not supported on {chain_id}; "
                       f"use {expected_type!r}")

    try:
        message = _parse_message(payload.message)
    except _BadMessage as exc:
        raise _refused(f"the message is not a valid sign-in message ({exc})") from None
    if message.family != family:
        account = "an Ethereum" if message.family == "evm" else "a Solana"
        raise _refused(f"the message is {account} sign-in message but chainId is {chain_id}")
    message_chain = _message_chain_id(message)
    if message_chain != chain_id:
        raise _refused(f"the message's Chain ID ({message_chain[:80]}) does not match chainId "
                       f"{chain_id}")

    _check_domain_and_uri(message, accepted_domains, request_host)
    if message.version != "1":
        raise _refused(f"Version {message.version[:20]!r} is not supported; use '1'")
    if not _NONCE_RE.fullmatch(message.nonce):
        raise _refused("the Nonce must be 8 to 64 letters or digits")
    issued_at, expires_at = _check_times(message, now)

    verify_signature = _verify_evm if family == "evm" else _verify_solana
    address = verify_signature(payload, message)
    return SignIn(address=address, chain_id=chain_id, family=family, nonce=message.nonce,
                  issued_at=issued_at, expires_at=expires_at)


def _as_utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _check_domain_and_uri(message: _Message, accepted_domains: frozenset[str],
                          request_host: str) -> None:
    domain = message.domain.lower()
    if accepted_domains:
        if domain not in {d.lower() for d in accepted_domains}:
            raise _refused(f"the message is for domain {message.domain[:100]!r}, which this "
                           "server does not accept")
    elif domain != request_host.lower():
        raise _refused(f"the message is for domain {message.domain[:100]!r}, not "
                       f"{request_host[:100]!r}")
    if message.scheme is not None and message.scheme.lower() not in ("http", "https"):
        raise _refused(f"scheme {message.scheme[:20]!r} in the message is not http or https")
    try:
        uri = urlsplit(message.uri)
    except ValueError:
        raise _refused(f"URI {message.uri[:100]!r} is not a valid URL") from None
    if uri.scheme.lower() not in ("http", "https"):
        raise _refused(f"URI {message.uri[:100]!r} is not an http or https URL")
    if uri.netloc.lower() != domain:
        raise _refused(f"URI {message.uri[:100]!r} is not on the message's domain "
                       f"{message.domain[:100]!r}")


def _check_times(message: _Message, now: datetime) -> tuple[datetime, datetime]:
    """(issuedAt, the last instant the message is accepted)."""
    issued_at = _parse_time(message.issued_at, "Issued At")
    if issued_at > now + MAX_CLOCK_SKEW:
        raise _refused(f"the message is issued in the future (Issued At {message.issued_at})")
    if now - issued_at > MAX_LIFETIME:
        raise _refused(f"the message was issued more than {_minutes(MAX_LIFETIME)} minutes ago "
                       f"(Issued At {message.issued_at}); sign a new one")
    if message.expiration_time is not None:
        expires = _parse_time(message.expiration_time, "Expiration Time")
        if expires <= issued_at:
            raise _refused("the message's Expiration Time is not after its Issued At")
        if expires - issued_at > MAX_LIFETIME:
            raise _refused("the message's lifetime (Expiration Time - Issued At) exceeds "
                           f"{_minutes(MAX_LIFETIME)} minutes")
    else:
        expires = issued_at + DEFAULT_LIFETIME
    deadline = expires + MAX_CLOCK_SKEW
    if now >= deadline:
        raise _refused(f"the message expired at {_iso(expires)}; sign a new one")
    if message.not_before is not None:
        not_before = _parse_time(message.not_before, "Not Before")
        if not_before > now + MAX_CLOCK_SKEW:
            raise _refused(f"the message is not valid before {message.not_before}")
    return issued_at, deadline


def _minutes(span: timedelta) -> int:
    return int(span.total_seconds() // 60)


def _verify_evm(payload: SiwxPayload, message: _Message) -> str:
    if not _EVM_ADDRESS_RE.fullmatch(message.address):
        raise _refused("the address in the message is not an EVM address")
    if message.address.lower() != payload.address.lower():
        raise _refused(f"the message is signed in as {message.address}, not as the payload "
                       f"address {payload.address[:64]}")
    address = to_checksum_address(message.address)
    hex_sig = payload.signature.removeprefix("0x").removeprefix("0X")
    try:
        signature = bytes.fromhex(hex_sig)
    except ValueError:
        signature = b""
    if len(signature) != 65:
        raise _refused("the signature is not a 65-byte hex string")
    try:
        signer = Account.recover_message(encode_defunct(text=payload.message),
                                         signature=signature)
    except Exception:  # eth-keys raises several types for unrecoverable signatures
        raise _refused("the signature is not valid") from None
    if signer.lower() != address.lower():
        raise _refused(f"the signature was not made by {address}")
    return address


def _verify_solana(payload: SiwxPayload, message: _Message) -> str:
    if message.address != payload.address:
        raise _refused(f"the message is signed in as {message.address[:64]}, not as the payload "
                       f"address {payload.address[:64]}")
    try:
        public_key = base58.b58decode(payload.address)
    except ValueError:
        public_key = b""
    if len(public_key) != 32:
        raise _refused("the address is not a base58 Solana public key")
    candidates = _solana_signatures(payload.signature)
    if not candidates:
        raise _refused("the signature is not a 64-byte base58 or base64 string")
    key = VerifyKey(public_key)
    data = payload.message.encode("utf-8")
    for signature in candidates:
        try:
            key.verify(data, signature)
            return payload.address
        except CryptoError:
            continue
    raise _refused(f"the signature was not made by {payload.address}")


def _solana_signatures(text: str) -> list[bytes]:
    """Every 64-byte reading of `text`: base58 and base64 can both fit the same string."""
    readings = []
    with contextlib.suppress(ValueError):
        readings.append(base58.b58decode(text))
    decoded = _b64decode(text)
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

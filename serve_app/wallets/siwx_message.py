"""SIGN-IN-WITH-X messages: the header decoded (the published shape, or the x402 shape
with its message rebuilt from the fields), the signed text parsed, the chain named.
siwx.py verifies what this module reads."""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

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

NONCE_RE = re.compile(r"[A-Za-z0-9]{8,64}")
EVM_ADDRESS_RE = re.compile(r"0x[0-9a-fA-F]{40}")
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


def refused(reason: str) -> ApiError:
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
class SignedMessage:
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
        raise refused(f"header is too large ({len(value)} bytes, limit {MAX_HEADER_BYTES})")
    raw = b64decode(value.strip())
    if raw is None:
        raise refused("not valid base64")
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise refused("not valid JSON") from None
    if not isinstance(obj, dict):
        raise refused("the decoded JSON is not an object")
    if "message" not in obj and "domain" in obj:
        return _from_x402_payload(obj)
    try:
        return SiwxPayload.model_validate(obj)
    except ValidationError as exc:
        raise refused(_describe(exc)) from None


def b64decode(text: str) -> bytes | None:
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
        raise refused(_describe(exc)) from None
    texts = [fields.domain, fields.address, fields.uri, fields.version, fields.chain_id,
             fields.nonce, fields.issued_at, fields.statement or "", fields.expiration_time or "",
             fields.not_before or "", fields.request_id or "", *(fields.resources or [])]
    if any("\n" in text or "\r" in text for text in texts):
        raise refused("a field contains a line break")
    chain_id = normalize_chain_id(fields.chain_id)
    if chain_id.startswith("eip155:"):
        message = _format_evm_message(fields, chain_id.split(":", 1)[1])
    elif chain_id.startswith("solana:"):
        message = _format_solana_message(fields, chain_id.split(":", 1)[1])
    else:
        raise unsupported_chain(chain_id)
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


class BadMessage(Exception):
    pass


def parse_message(text: str) -> SignedMessage:
    """Parse an EIP-4361 or Solana sign-in message (same layout, different account word)."""
    lines = text.split("\n")
    while len(lines) > 1 and lines[-1] == "":
        lines.pop()
    if len(lines) < 4:
        raise BadMessage("too short")
    header = _HEADER_LINE_RE.fullmatch(lines[0])
    if header is None:
        raise BadMessage(
            "the first line must be '<domain> wants you to sign in with your Ethereum account:' "
            "(or '... Solana account:')")
    if lines[2] != "":
        raise BadMessage("the address line must be followed by an empty line")
    uri_at = next((i for i, line in enumerate(lines) if line.startswith("URI: ")), None)
    if uri_at is None or uri_at < 3:
        raise BadMessage("no URI line")
    statement_lines = [line for line in lines[3:uri_at] if line != ""]
    if len(statement_lines) > 1:
        raise BadMessage("the statement must be a single line")

    values: dict[str, str] = {}
    resources: list[str] | None = None
    for line in lines[uri_at:]:
        if resources is not None:
            if not line.startswith("- "):
                raise BadMessage(f"unexpected line after Resources: {line[:80]!r}")
            resources.append(line[2:])
            continue
        if line == "Resources:":
            resources = []
            continue
        key, sep, value = line.partition(": ")
        if not sep or key not in _FIELD_NAMES:
            raise BadMessage(f"unexpected line {line[:80]!r}")
        if key in values:
            raise BadMessage(f"{key} appears twice")
        values[key] = value
    for key in _REQUIRED_FIELDS:
        if key not in values:
            raise BadMessage(f"no {key} line")
    return SignedMessage(
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


def parse_time(value: str, field: str) -> datetime:
    if not _RFC3339_RE.fullmatch(value):
        raise refused(f"{field} {value[:40]!r} is not an RFC 3339 timestamp with a time zone")
    try:
        return datetime.fromisoformat(value.upper()).astimezone(UTC)
    except (ValueError, OverflowError):
        raise refused(f"{field} {value[:40]!r} is not a valid timestamp") from None


# --- chains ------------------------------------------------------------------------------


def normalize_chain_id(chain_id: int | str) -> str:
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


def message_chain_id(message: SignedMessage) -> str:
    if message.family == "evm":
        if (number := _decimal(message.chain)) is None:
            raise refused(f"Chain ID {message.chain[:40]!r} in the message is not a number")
        return f"eip155:{number}"
    if message.chain in _SOLANA_MAINNET_NAMES:
        return SOLANA_MAINNET_CHAIN_ID
    chain = message.chain
    return chain if chain.startswith("solana:") else f"solana:{chain}"


def unsupported_chain(chain_id: str) -> ApiError:
    return refused(f"chain {chain_id[:80]!r} is not supported; use {BASE_CHAIN_ID} (Base) or "
                    f"{SOLANA_MAINNET_CHAIN_ID} (Solana mainnet)")

"""SIGN-IN-WITH-X: header decoding, message checks and signatures (EVM on Base, Solana)."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import base58
import pytest
from eth_account import Account
from eth_account.messages import encode_defunct
from nacl.signing import SigningKey
from solders.keypair import Keypair
from x402.extensions.sign_in_with_x import (
    SIWxExtension,
    create_siwx_client_hook,
    create_siwx_message,
    create_siwx_payload,
    encode_siwx_header,
    sign_evm_message,
    sign_solana_message,
)
from x402.mechanisms.svm.signers import KeypairSigner
from x402.schemas import PaymentRequired
from x402.schemas.hooks import PaymentRequiredContext

from serve_app.errors import ApiError
from serve_app.wallets import siwx
from serve_app.wallets.siwx import (
    BASE_CHAIN_ID,
    SOLANA_MAINNET_CHAIN_ID,
    SignIn,
    challenge,
    decode_header,
    discovery_extension,
    verify,
)

DOMAIN = "api.example.com"
URI = f"https://{DOMAIN}/api/v1/chat/completions"
NOW = datetime(2026, 4, 9, 12, 0, tzinfo=UTC)
SOLANA_REF = SOLANA_MAINNET_CHAIN_ID.split(":", 1)[1]


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def siwe_text(address: str, *, domain: str = DOMAIN, uri: str = URI, chain: str = "8453",
              nonce: str = "a1b2c3d4e5f60718", version: str = "1",
              issued_at: datetime = NOW - timedelta(seconds=5),
              expires: datetime | None = NOW + timedelta(minutes=5),
              not_before: datetime | None = None, account: str = "Ethereum") -> str:
    """A sign-in message in the EIP-4361 layout (the Solana one differs by the account word)."""
    lines = [f"{domain} wants you to sign in with your {account} account:", address, "",
             "Sign in to the inference API", "", f"URI: {uri}", f"Version: {version}",
             f"Chain ID: {chain}", f"Nonce: {nonce}", f"Issued At: {iso(issued_at)}"]
    if expires is not None:
        lines.append(f"Expiration Time: {iso(expires)}")
    if not_before is not None:
        lines.append(f"Not Before: {iso(not_before)}")
    return "\n".join(lines)


def siws_text(address: str, **fields: Any) -> str:
    fields.setdefault("chain", SOLANA_REF)
    return siwe_text(address, account="Solana", **fields)


def encode(obj: Any) -> str:
    return base64.b64encode(json.dumps(obj).encode()).decode()


def evm_header(account: Any, message: str | None = None, *, chain_id: Any = 8453,
               signer: Any = None, **extra: Any) -> str:
    message = message if message is not None else siwe_text(account.address)
    signature = (signer or account).sign_message(encode_defunct(text=message)).signature.hex()
    return encode({"address": account.address, "message": message,
                   "signature": "0x" + signature, "timestamp": 1_775_736_000_000,
                   "chainId": chain_id, **extra})


def solana_header(key: SigningKey, message: str | None = None, *, signer: SigningKey | None = None,
                  encoding: str = "base58", **extra: Any) -> str:
    address = base58.b58encode(bytes(key.verify_key)).decode()
    message = message if message is not None else siws_text(address)
    raw = (signer or key).sign(message.encode()).signature
    signature = (base58.b58encode(raw).decode() if encoding == "base58"
                 else base64.b64encode(raw).decode())
    payload = {"address": address, "message": message, "signature": signature,
               "timestamp": 1_775_736_000_000, "chainId": SOLANA_MAINNET_CHAIN_ID,
               "type": "ed25519", **extra}
    return encode(payload)


def sol_address(key: SigningKey) -> str:
    return base58.b58encode(bytes(key.verify_key)).decode()


def check(header: str, *, accepted: frozenset[str] = frozenset({DOMAIN}),
          host: str = DOMAIN, now: datetime = NOW) -> SignIn:
    return verify(decode_header(header), accepted_domains=accepted, request_host=host, now=now)


def refused(action: Callable[[], Any]) -> str:
    """Run `action`, expect the 401 of a failed sign-in and return its message."""
    with pytest.raises(ApiError) as info:
        action()
    assert info.value.status == 401
    assert info.value.code == "AUTHENTICATION_FAILED"
    return info.value.message


@pytest.fixture
def wallet():
    return Account.create()


@pytest.fixture
def sol_key():
    return SigningKey.generate()


# --- accepted sign-ins -------------------------------------------------------------------


@pytest.mark.parametrize("chain_id", [8453, "8453", "eip155:8453"])
def test_evm_sign_in_accepts_each_chain_id_form(wallet, chain_id):
    sign_in = check(evm_header(wallet, chain_id=chain_id))
    assert sign_in == SignIn(
        address=wallet.address, chain_id=BASE_CHAIN_ID, family="evm", nonce="a1b2c3d4e5f60718",
        issued_at=NOW - timedelta(seconds=5),
        expires_at=NOW + timedelta(minutes=5) + siwx.MAX_CLOCK_SKEW)


def test_evm_address_compared_case_insensitively_and_returned_checksummed(wallet):
    message = siwe_text(wallet.address.lower())
    signature = wallet.sign_message(encode_defunct(text=message)).signature.hex()
    header = encode({"address": wallet.address.upper().replace("0X", "0x"), "message": message,
                     "signature": signature, "timestamp": 0, "chainId": 8453})
    assert check(header).address == wallet.address


def test_evm_message_without_statement_or_expiration_gets_default_lifetime(wallet):
    message = siwe_text(wallet.address, expires=None).replace(
        "Sign in to the inference API\n\n", "\n")
    sign_in = check(evm_header(wallet, message))
    assert sign_in.expires_at == NOW - timedelta(seconds=5) + siwx.DEFAULT_LIFETIME \
        + siwx.MAX_CLOCK_SKEW


@pytest.mark.parametrize("encoding", ["base58", "base64"])
def test_solana_sign_in_accepts_base58_and_base64_signatures(sol_key, encoding):
    sign_in = check(solana_header(sol_key, encoding=encoding))
    assert sign_in.address == sol_address(sol_key)
    assert (sign_in.chain_id, sign_in.family) == (SOLANA_MAINNET_CHAIN_ID, "solana")
    assert sign_in.nonce == "a1b2c3d4e5f60718"


def test_solana_type_may_be_omitted(sol_key):
    header = json.loads(base64.b64decode(solana_header(sol_key)))
    del header["type"]
    assert check(encode(header)).family == "solana"


def test_empty_accepted_domains_fall_back_to_request_host(wallet):
    assert check(evm_header(wallet), accepted=frozenset(), host="API.example.com").address
    message = refused(lambda: check(evm_header(wallet), accepted=frozenset(), host="other.io"))
    assert "domain 'api.example.com'" in message and "other.io" in message


def test_domain_with_port_and_http_uri(wallet):
    message = siwe_text(wallet.address, domain="localhost:8000",
                        uri="http://localhost:8000/api/v1/models")
    sign_in = check(evm_header(wallet, message), accepted=frozenset({"localhost:8000"}))
    assert sign_in.address == wallet.address


def test_issued_at_within_clock_skew_is_accepted(wallet):
    message = siwe_text(wallet.address, issued_at=NOW + timedelta(seconds=30))
    assert check(evm_header(wallet, message)).issued_at == NOW + timedelta(seconds=30)


# --- the x402 package's own client -------------------------------------------------------


def x402_info(chain_id: str) -> dict[str, Any]:
    extension = discovery_extension(DOMAIN, URI, NOW)["sign-in-with-x"]
    sig_type = "ed25519" if chain_id.startswith("solana:") else "eip191"
    return {**extension["info"], "chainId": chain_id, "type": sig_type}


async def test_x402_client_evm_header_is_accepted_unchanged(wallet):
    payload = await create_siwx_payload(x402_info(BASE_CHAIN_ID), wallet, URI)
    sign_in = check(encode_siwx_header(payload))
    assert (sign_in.address, sign_in.family, sign_in.chain_id) == (
        wallet.address, "evm", BASE_CHAIN_ID)
    assert sign_in.nonce == payload.nonce


async def test_x402_client_solana_header_is_accepted_unchanged():
    signer = KeypairSigner(Keypair())
    payload = await create_siwx_payload(x402_info(SOLANA_MAINNET_CHAIN_ID), signer, URI)
    sign_in = check(encode_siwx_header(payload))
    assert (sign_in.address, sign_in.family) == (signer.address, "solana")


async def test_x402_client_header_with_a_changed_field_is_refused(wallet):
    payload = await create_siwx_payload(x402_info(BASE_CHAIN_ID), wallet, URI)
    tampered = payload.model_copy(update={"nonce": "ffffffffffffffff"})
    assert "signature was not made by" in refused(lambda: check(encode_siwx_header(tampered)))


async def test_x402_messages_in_the_published_header_shape(wallet):
    evm_message = create_siwx_message(x402_info(BASE_CHAIN_ID), wallet.address)
    evm_sig = await sign_evm_message(evm_message, wallet)
    header = encode({"address": wallet.address, "message": evm_message, "signature": evm_sig,
                     "timestamp": 0, "chainId": BASE_CHAIN_ID})
    assert check(header).address == wallet.address

    signer = KeypairSigner(Keypair())
    sol_message = create_siwx_message(x402_info(SOLANA_MAINNET_CHAIN_ID), signer.address)
    sol_sig = await sign_solana_message(sol_message, signer)
    header = encode({"address": signer.address, "message": sol_message, "signature": sol_sig,
                     "timestamp": 0, "chainId": SOLANA_MAINNET_CHAIN_ID, "type": "ed25519"})
    assert check(header).address == signer.address


@pytest.mark.parametrize("make_signer", [Account.create, lambda: KeypairSigner(Keypair())])
async def test_x402_client_hook_signs_in_from_our_402_extension(make_signer):
    signer = make_signer()
    required = PaymentRequired(accepts=[], extensions=discovery_extension(DOMAIN, URI, NOW))
    hook = create_siwx_client_hook(signer)
    result = await hook(PaymentRequiredContext(payment_required=required, request_url=URI))
    assert result is not None
    header = {name.upper(): value for name, value in result.headers.items()}["SIGN-IN-WITH-X"]
    assert check(header).address == signer.address


# --- refusals: signature and identity ----------------------------------------------------


def test_forged_evm_signature(wallet):
    header = json.loads(base64.b64decode(evm_header(wallet)))
    sig = bytearray(bytes.fromhex(header["signature"][2:]))
    sig[10] ^= 0xFF
    header["signature"] = "0x" + sig.hex()
    assert re.search(r"signature (is not valid|was not made by)",
                     refused(lambda: check(encode(header))))
    header["signature"] = "0x" + "00" * 65
    assert "signature is not valid" in refused(lambda: check(encode(header)))
    header["signature"] = "0xnothex"
    assert "65-byte hex" in refused(lambda: check(encode(header)))


def test_evm_signature_by_another_wallet(wallet):
    message = refused(lambda: check(evm_header(wallet, signer=Account.create())))
    assert f"signature was not made by {wallet.address}" in message


def test_forged_solana_signature(sol_key):
    header = json.loads(base64.b64decode(solana_header(sol_key)))
    header["signature"] = base58.b58encode(bytes(64)).decode()
    assert "signature was not made by" in refused(lambda: check(encode(header)))
    header["signature"] = "not-a-signature"
    assert "64-byte base58 or base64" in refused(lambda: check(encode(header)))


def test_solana_signature_by_another_wallet(sol_key):
    message = refused(lambda: check(solana_header(sol_key, signer=SigningKey.generate())))
    assert f"signature was not made by {sol_address(sol_key)}" in message


def test_evm_address_mismatch(wallet):
    other = Account.create()
    header = json.loads(base64.b64decode(evm_header(wallet)))
    header["address"] = other.address
    message = refused(lambda: check(encode(header)))
    assert "not as the payload address" in message and other.address in message


def test_solana_address_mismatch(sol_key):
    header = json.loads(base64.b64decode(solana_header(sol_key)))
    header["address"] = sol_address(SigningKey.generate())
    assert "not as the payload address" in refused(lambda: check(encode(header)))


# --- refusals: domain, URI, chain --------------------------------------------------------


def test_wrong_domain(wallet):
    message = siwe_text(wallet.address, domain="evil.example", uri="https://evil.example/")
    text = refused(lambda: check(evm_header(wallet, message)))
    assert "domain 'evil.example'" in text and "does not accept" in text


@pytest.mark.parametrize("uri", ["https://evil.example/api", "https://api.example.com:444/",
                                 "https://user@api.example.com/"])
def test_uri_on_another_host(wallet, uri):
    message = refused(lambda: check(evm_header(wallet, siwe_text(wallet.address, uri=uri))))
    assert "is not on the message's domain" in message


def test_uri_with_another_scheme(wallet):
    message = siwe_text(wallet.address, uri=f"ftp://{DOMAIN}/")
    assert "not an http or https URL" in refused(lambda: check(evm_header(wallet, message)))


def test_chain_in_message_differs_from_payload(wallet):
    message = siwe_text(wallet.address, chain="1")
    text = refused(lambda: check(evm_header(wallet, message)))
    assert "Chain ID (eip155:1) does not match chainId eip155:8453" in text


@pytest.mark.parametrize("chain_id", [1, "137", "eip155:1", "cosmos:cosmoshub-4",
                                      "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1"])
def test_unsupported_chain(wallet, chain_id):
    message = siwe_text(wallet.address, chain=str(chain_id).rpartition(":")[2])
    text = refused(lambda: check(evm_header(wallet, message, chain_id=chain_id)))
    assert "is not supported" in text and BASE_CHAIN_ID in text


def test_solana_message_with_evm_chain_id(sol_key):
    header = json.loads(base64.b64decode(solana_header(sol_key)))
    header["chainId"] = 8453
    del header["type"]
    assert "Solana sign-in message but chainId is eip155:8453" in refused(
        lambda: check(encode(header)))


def test_signature_type_must_match_the_chain(wallet):
    text = refused(lambda: check(evm_header(wallet, type="eip1271")))
    assert "signature type 'eip1271' is not supported" in text


# --- refusals: times, nonce, version -----------------------------------------------------


def test_expired(wallet):
    message = siwe_text(wallet.address, issued_at=NOW - timedelta(minutes=30),
                        expires=NOW - timedelta(minutes=2))
    assert "expired at" in refused(lambda: check(evm_header(wallet, message)))


def test_expiry_tolerates_clock_skew(wallet):
    message = siwe_text(wallet.address, issued_at=NOW - timedelta(minutes=5),
                        expires=NOW - timedelta(seconds=30))
    assert check(evm_header(wallet, message)).address == wallet.address


def test_default_lifetime_expires(wallet):
    message = siwe_text(wallet.address, issued_at=NOW - timedelta(minutes=12), expires=None)
    assert "expired at" in refused(lambda: check(evm_header(wallet, message)))


def test_issued_in_the_future(wallet):
    message = siwe_text(wallet.address, issued_at=NOW + timedelta(minutes=2),
                        expires=NOW + timedelta(minutes=7))
    assert "issued in the future" in refused(lambda: check(evm_header(wallet, message)))


def test_issued_too_long_ago(wallet):
    message = siwe_text(wallet.address, issued_at=NOW - timedelta(hours=2),
                        expires=NOW + timedelta(minutes=5))
    assert "issued more than 60 minutes ago" in refused(lambda: check(evm_header(wallet, message)))


def test_lifetime_too_long(wallet):
    message = siwe_text(wallet.address, issued_at=NOW, expires=NOW + timedelta(hours=2))
    assert "lifetime" in refused(lambda: check(evm_header(wallet, message)))


def test_expiration_before_issued_at(wallet):
    message = siwe_text(wallet.address, issued_at=NOW, expires=NOW - timedelta(seconds=1))
    assert "not after its Issued At" in refused(lambda: check(evm_header(wallet, message)))


def test_not_before_in_the_future(wallet):
    message = siwe_text(wallet.address, not_before=NOW + timedelta(minutes=2))
    assert "not valid before" in refused(lambda: check(evm_header(wallet, message)))
    message = siwe_text(wallet.address, not_before=NOW + timedelta(seconds=30))
    assert check(evm_header(wallet, message)).address == wallet.address


def test_timestamp_without_time_zone(wallet):
    message = siwe_text(wallet.address).replace(f"Issued At: {iso(NOW - timedelta(seconds=5))}",
                                                "Issued At: 2026-04-09T11:59:55")
    assert "RFC 3339" in refused(lambda: check(evm_header(wallet, message)))


@pytest.mark.parametrize("nonce", ["short1", "has-dash-123", "x" * 65, "ééééééééé"])
def test_bad_nonce(wallet, nonce):
    message = siwe_text(wallet.address, nonce=nonce)
    assert "Nonce must be 8 to 64" in refused(lambda: check(evm_header(wallet, message)))


def test_eip4361_nonce_of_eight_alphanumerics_is_accepted(wallet):
    message = siwe_text(wallet.address, nonce="AbCd1234")
    assert check(evm_header(wallet, message)).nonce == "AbCd1234"


def test_unsupported_version(wallet):
    message = siwe_text(wallet.address, version="2")
    assert "Version '2' is not supported" in refused(lambda: check(evm_header(wallet, message)))


# --- refusals: the header itself ---------------------------------------------------------


def test_bad_base64():
    assert "not valid base64" in refused(lambda: decode_header("%%% not base64 %%%"))
    assert "not valid base64" in refused(lambda: decode_header(""))


def test_bad_json():
    assert "not valid JSON" in refused(lambda: decode_header(encode_raw(b"{not json")))
    assert "not valid JSON" in refused(lambda: decode_header(encode_raw(b"\xff\xfe")))
    assert "not an object" in refused(lambda: decode_header(encode([1, 2])))


def encode_raw(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_missing_fields():
    message = refused(lambda: decode_header(encode({"address": "0xabc", "timestamp": 1})))
    assert "missing field(s): message, signature, chainId" in message


def test_wrongly_typed_fields():
    header = {"address": "0xabc", "message": ["x"], "signature": 5, "chainId": True}
    message = refused(lambda: decode_header(encode(header)))
    assert "invalid field(s): message, signature, chainId" in message


def test_x402_shape_with_missing_fields():
    message = refused(lambda: decode_header(encode({"domain": DOMAIN, "address": "0xabc"})))
    assert "missing field(s): uri, version, chainId, nonce, issuedAt, signature" in message


def test_oversized_header():
    header = "A" * (siwx.MAX_HEADER_BYTES + 1)
    assert "too large" in refused(lambda: decode_header(header))


def test_url_safe_unpadded_base64_is_accepted(sol_key):
    header = solana_header(sol_key)
    url_safe = base64.urlsafe_b64encode(base64.b64decode(header)).decode().rstrip("=")
    assert check(url_safe).address == sol_address(sol_key)


def test_garbage_messages_are_401_never_a_crash(wallet):
    good = siwe_text(wallet.address)
    variants = ["", "hello", good.replace("Ethereum", "Bitcoin"), good.replace("URI: ", "URL: "),
                good + "\nNonce: abcdefgh12", good + "\nResources:\n- x\nbad",
                good.replace("\n\n", "\n"), good.replace("Chain ID: 8453", "Chain ID: 8453" * 9),
                good.replace("Issued At: 2026", "Issued At: 0000"), "\n".join(good.split("\n")[:4])]
    variants += [good[:cut] for cut in range(0, len(good), 17)]
    for text in variants:
        header = encode({"address": wallet.address, "message": text or "x",
                         "signature": "0x" + "11" * 65, "timestamp": 0, "chainId": 8453})
        refused(lambda header=header: check(header))


# --- challenges --------------------------------------------------------------------------


def test_challenge_shape():
    first = challenge(DOMAIN, URI, NOW)
    info = first["info"]
    assert info == {"domain": DOMAIN, "uri": URI, "version": "1", "nonce": info["nonce"],
                    "issuedAt": "2026-04-09T12:00:00.000Z",
                    "expirationTime": "2026-04-09T12:05:00.000Z",
                    "statement": "Sign in to the inference API"}
    assert re.fullmatch(r"[0-9a-f]{16}", info["nonce"])
    assert challenge(DOMAIN, URI, NOW)["info"]["nonce"] != info["nonce"]
    assert first["supportedChains"] == [{"chainId": BASE_CHAIN_ID, "type": "eip191"},
                                        {"chainId": SOLANA_MAINNET_CHAIN_ID, "type": "ed25519"}]


def test_discovery_extension_parses_as_the_x402_extension():
    extension = discovery_extension(DOMAIN, URI, NOW)
    assert list(extension) == ["sign-in-with-x"]
    parsed = SIWxExtension.model_validate(extension["sign-in-with-x"])
    assert (parsed.info.domain, parsed.info.uri, parsed.info.resources) == (DOMAIN, URI, [URI])
    assert [c.chain_id for c in parsed.supported_chains] == [BASE_CHAIN_ID,
                                                             SOLANA_MAINNET_CHAIN_ID]
    assert "signature" in parsed.schema_["required"]


def test_a_signed_challenge_is_accepted(wallet, sol_key):
    info = challenge(DOMAIN, URI, NOW)["info"]
    issued = datetime.fromisoformat(info["issuedAt"])
    expires = datetime.fromisoformat(info["expirationTime"])
    evm = siwe_text(wallet.address, nonce=info["nonce"], issued_at=issued, expires=expires)
    assert check(evm_header(wallet, evm), now=NOW + timedelta(minutes=4)).nonce == info["nonce"]
    sol = siws_text(sol_address(sol_key), nonce=info["nonce"], issued_at=issued, expires=expires)
    assert check(solana_header(sol_key, sol)).family == "solana"


@pytest.mark.parametrize("chain_id", [BASE_CHAIN_ID, SOLANA_MAINNET_CHAIN_ID])
async def test_x402_client_header_without_optional_fields(wallet, chain_id):
    info = x402_info(chain_id)
    for name in ("statement", "expirationTime", "resources"):
        del info[name]
    info["requestId"] = "req-1"
    signer = wallet if chain_id == BASE_CHAIN_ID else KeypairSigner(Keypair())
    payload = await create_siwx_payload(info, signer, URI)
    sign_in = check(encode_siwx_header(payload))
    assert sign_in.expires_at == NOW + siwx.DEFAULT_LIFETIME + siwx.MAX_CLOCK_SKEW

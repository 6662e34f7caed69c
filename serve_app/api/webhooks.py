"""`/webhooks/secret`: the secret that signs the account's job events (admin keys only).
`GET` reads it (made on first use), `POST` replaces it with a new one."""

from __future__ import annotations

from fastapi import APIRouter

from serve_app.api.deps import AdminKey, Services
from serve_app.jobs.webhooks import SIGNATURE_HEADER

router = APIRouter(tags=["Webhooks"])


def _answer(secret: str) -> dict:
    return {"data": {"secret": secret, "header": SIGNATURE_HEADER,
                     "algorithm": "HMAC-SHA256", "signed_payload": "<t>.<body>"}}


@router.get("/webhooks/secret", summary="The secret that signs job events")
async def read_secret(key: AdminKey, services: Services) -> dict:
    return _answer(await services.webhooks.secrets.get(key.account_id))


@router.post("/webhooks/secret", summary="Rotate the secret that signs job events")
async def rotate_secret(key: AdminKey, services: Services) -> dict:
    return _answer(await services.webhooks.secrets.rotate(key.account_id))

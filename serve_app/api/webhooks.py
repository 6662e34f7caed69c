"""`/webhooks/secret`: the secret that signs the account's job events (admin keys only).
`GET` reads it (made on first use), `POST` replaces it with a new one; the one replaced still
signs beside it for a grace period (jobs/webhooks.py `ROTATION_GRACE`)."""

from __future__ import annotations

from serve_app.api.deps import AdminKey, Services
from serve_app.api.guarded_route import guarded_router
from serve_app.db.tables import as_utc, utcnow
from serve_app.jobs.webhooks import (
    ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    SigningSecrets,
)

router = guarded_router(tags=["Webhooks"])


def _answer(secrets: SigningSecrets) -> dict:
    data: dict = {"secret": secrets.secret, "scheme": "standard-webhooks",
                  "headers": [ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER],
                  "algorithm": "HMAC-SHA256", "signed_payload": "<id>.<timestamp>.<body>"}
    until = as_utc(secrets.previous_until)
    if secrets.previous and until is not None and until > utcnow():
        data["previous_secret_signs_until"] = int(until.timestamp())
    return {"data": data}


@router.get("/webhooks/secret", summary="The secret that signs job events")
async def read_secret(key: AdminKey, services: Services) -> dict:
    return _answer(await services.webhooks.secrets.current(key.account_id))


@router.post("/webhooks/secret", summary="Rotate the secret that signs job events")
async def rotate_secret(key: AdminKey, services: Services) -> dict:
    return _answer(await services.webhooks.secrets.rotate(key.account_id))

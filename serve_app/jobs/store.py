"""Where queued jobs keep their files: the inputs a job was queued with and the media it made.

`RESULT_STORE_URL` picks the store: unset, a directory under DATA_DIR (`results/`); a path or
`file:///...`, that directory; `s3://bucket/prefix`, an S3-compatible bucket (AWS, MinIO,
Ceph...), with the endpoint in `?endpoint=http://host:9000` or AWS_ENDPOINT_URL and the
credentials from the usual AWS variables. Every replica of a cluster must see the same store:
a directory only works on one machine (or on a shared volume).
"""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from pathlib import Path
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

_SAFE_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")


def _checked(key: str) -> str:
    if not _SAFE_KEY.fullmatch(key) or ".." in key.split("/"):
        raise ValueError(f"invalid store key {key!r}")
    return key


class ResultStore(Protocol):
    async def put(self, key: str, data: bytes, media_type: str) -> None: ...
    async def get(self, key: str) -> bytes | None: ...
    async def delete(self, key: str) -> None: ...


class DirectoryStore:
    """Files under one directory; each write lands whole (written aside, then renamed)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / _checked(key)

    async def put(self, key: str, data: bytes, media_type: str) -> None:
        def write() -> None:
            path = self._path(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f"{path.name}.{uuid.uuid4().hex}.partial")
            partial.write_bytes(data)
            os.replace(partial, path)
        await asyncio.to_thread(write)

    async def get(self, key: str) -> bytes | None:
        def read() -> bytes | None:
            try:
                return self._path(key).read_bytes()
            except FileNotFoundError:
                return None
        return await asyncio.to_thread(read)

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(self._path(key).unlink, missing_ok=True)


class BucketStore:
    """Objects in an S3-compatible bucket, under a key prefix."""

    def __init__(self, bucket: str, prefix: str, endpoint_url: str | None,
                 region: str | None) -> None:
        import boto3  # only for this store

        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region)

    def _key(self, key: str) -> str:
        key = _checked(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    async def put(self, key: str, data: bytes, media_type: str) -> None:
        await asyncio.to_thread(self.client.put_object, Bucket=self.bucket, Key=self._key(key),
                                Body=data, ContentType=media_type)

    async def get(self, key: str) -> bytes | None:
        def read() -> bytes | None:
            try:
                found = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            except self.client.exceptions.NoSuchKey:
                return None
            return found["Body"].read()
        return await asyncio.to_thread(read)

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(self.client.delete_object, Bucket=self.bucket,
                                Key=self._key(key))


def open_result_store(url: str | None, data_dir: Path) -> ResultStore:
    if not url:
        return DirectoryStore(data_dir / "results")
    parts = urlsplit(url)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ValueError("RESULT_STORE_URL s3://bucket/prefix names no bucket")
        query = parse_qs(parts.query)
        endpoint = query.get("endpoint", [os.environ.get("AWS_ENDPOINT_URL")])[0]
        region = query.get("region", [os.environ.get("AWS_REGION", "us-east-1")])[0]
        return BucketStore(parts.netloc, parts.path, endpoint, region)
    if parts.scheme in ("", "file"):
        return DirectoryStore(Path(parts.path if parts.scheme else url).expanduser().resolve())
    raise ValueError(f"RESULT_STORE_URL scheme {parts.scheme!r} is not supported "
                     "(a directory, file:// or s3://)")

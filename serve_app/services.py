"""The composition root of one Gateway replica: `GatewayServices.build` makes every service
with the collaborators it needs, as constructor arguments. Only the routers' dependencies
(api/deps.py) and the application builders (gateway.py, app.py) read the container; no
service below them sees it."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy.engine import Engine

from serve_app.accounts.key_events import KeyEvents, LocalKeyEvents
from serve_app.accounts.key_store import KeyStore
from serve_app.audio.jobs import QueuedAudio
from serve_app.audio.serving import AudioService
from serve_app.audio.sources import FETCH_TIMEOUT_S, MAX_AUDIO_BYTES
from serve_app.audio.voice_change import KIND as VOICE_CHANGE
from serve_app.audio.voice_change import VoiceChanger
from serve_app.audio.voice_pipeline import VoicePipeline
from serve_app.billing.service import Billing
from serve_app.chat.audio_parts import AudioReader
from serve_app.chat.extraction import Extractor
from serve_app.chat.files import FileReader
from serve_app.chat.media import MediaReader
from serve_app.chat.serving import ChatService
from serve_app.chat.web import WebTools
from serve_app.crypto.networks import load_nodes
from serve_app.crypto.serving import CryptoRpc
from serve_app.db.engine import make_engine
from serve_app.embeddings.serving import Embedder
from serve_app.images.inputs import ImageInspector, MediaSourceReader, image_fetcher
from serve_app.images.serving import ImageService
from serve_app.jobs.caps import FetchSlots, JobCaps
from serve_app.jobs.idempotency import QueueKeys
from serve_app.jobs.job_queue import JobQueue
from serve_app.jobs.service import JobService
from serve_app.jobs.store import ResultStore, open_result_store
from serve_app.jobs.webhooks import WebhookDeliveries, WebhookSecrets, callback_fetcher
from serve_app.jobs.worker import JobWorker
from serve_app.limits.backends import LimiterBackend, LocalLimiter, RayLimiter
from serve_app.limits.policy import load_tiers
from serve_app.limits.rate_limits import RateLimits
from serve_app.models.calls import bound_cold_starts
from serve_app.models.catalog import Catalog, load_catalog
from serve_app.models.router import ModelRouter
from serve_app.net_guard import GuardedFetcher
from serve_app.pipeline.admission import Admission
from serve_app.pipeline.runner import RequestRunner
from serve_app.responses.service import BackgroundResponses
from serve_app.settings import Settings
from serve_app.video.probe import probe as probe_video
from serve_app.video.serving import VideoService
from serve_app.wallets.limits import SignInsPerClient
from serve_app.wallets.sign_in import WalletAuth, sign_in_domains
from serve_app.wallets.topups import TopUps, listening_hosts
from serve_app.wallets.x402.requirements import PaymentConfig


def limiter_backend(settings: Settings) -> LimiterBackend:
    choice = settings.rate_limit_backend
    if choice == "auto":
        import ray

        choice = "redis" if settings.redis_url else "ray" if ray.is_initialized() else "local"
    if choice == "redis":
        if not settings.redis_url:
            raise ValueError("RATE_LIMIT_BACKEND=redis needs REDIS_URL")
        from serve_app.limits.redis_backend import RedisLimiter

        return RedisLimiter(settings.redis_url, prefix=settings.redis_prefix)
    if choice == "ray":
        return RayLimiter()
    return LocalLimiter()


def dev_solana_fee_payer(settings: Settings) -> str | None:
    """With the development facilitator, Solana's fee payer defaults to its own; it is
    imported only when configured."""
    if settings.x402_facilitator_url != "dev" or not settings.x402_pay_to_solana:
        return None
    from serve_app.wallets.x402.dev_facilitator import DEV_SOLANA_FEE_PAYER

    return DEV_SOLANA_FEE_PAYER


@dataclass
class GatewayServices:
    settings: Settings
    catalog: Catalog
    engine: Engine
    keys: KeyStore
    key_events: KeyEvents
    router: ModelRouter
    extractor: Extractor
    web: WebTools
    billing: Billing
    limits: RateLimits
    admission: Admission
    runner: RequestRunner
    embedder: Embedder
    media_sources: MediaSourceReader
    crypto_rpc: CryptoRpc
    wallets: WalletAuth
    payments: PaymentConfig
    top_ups: TopUps
    jobs: JobQueue
    results: ResultStore
    job_worker: JobWorker
    chat: ChatService
    images: ImageService
    audio: AudioService
    job_service: JobService
    queued_audio: QueuedAudio
    voice_changer: VoiceChanger
    video: VideoService
    webhooks: WebhookDeliveries
    responses: BackgroundResponses = field(init=False)  # built on `chat`
    _tasks: list[asyncio.Task] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        settings: Settings,
        *,
        handles: dict[str, Any] | None = None,
        key_events: KeyEvents | None = None,
        catalog: Catalog | None = None,
    ) -> GatewayServices:
        catalog = catalog or load_catalog(settings.model_catalog)
        engine = make_engine(settings.resolved_database_url)
        router = ModelRouter(catalog, handles or {})
        bound_cold_starts(settings.cold_start_wait_s)
        billing = Billing(settings.resolved_database_url)
        payments = PaymentConfig.from_settings(
            settings, default_solana_fee_payer=dev_solana_fee_payer(settings))
        jobs = JobQueue(engine, lease=timedelta(seconds=settings.job_lease_s))
        results = open_result_store(settings.result_store_url, settings.data_dir)
        limits = RateLimits(limiter_backend(settings), engine,
                            tiers=load_tiers(settings.rate_limit_tiers))
        admission = Admission(limits, billing)
        runner = RequestRunner(router, admission)
        extractor = Extractor()  # files and scraped pages are parsed by its processes
        web = WebTools(GuardedFetcher(allowed_hosts=settings.allowed_fetch_hosts),
                       settings.web_search_url, settings.web_search_api_key,
                       extractor=extractor)
        media_sources = MediaSourceReader(image_fetcher(settings.allowed_fetch_hosts))
        image_inspector = ImageInspector(limits, timeout_s=settings.image_inspect_timeout_s)
        job_worker = JobWorker(jobs, results, billing, catalog, router,
                               slots_per_deployment=settings.job_slots_per_deployment,
                               makers={VOICE_CHANGE: VoicePipeline(catalog, router).make})
        fetch_slots = FetchSlots(settings.media_fetches_per_account)  # chat's media too
        callbacks = callback_fetcher(settings.allowed_webhook_hosts)  # never the fetch list
        queue_keys = QueueKeys(engine)
        job_service = JobService(router, catalog, runner, jobs, results, job_worker, engine,
                                 fetch_slots,
                                 JobCaps(settings.job_open_per_account,
                                         settings.job_stored_mb_per_account * 1024 * 1024),
                                 queue_keys, callbacks)
        webhooks = WebhookDeliveries(engine, callbacks, WebhookSecrets(engine),
                                     max_attempts=settings.webhook_max_attempts,
                                     first_retry=timedelta(
                                         seconds=settings.webhook_first_retry_s))
        webhooks.upkeep.append(queue_keys.sweep)
        services = cls(
            settings=settings,
            catalog=catalog,
            engine=engine,
            keys=KeyStore(engine, ttl_s=settings.key_cache_ttl_s),
            key_events=key_events or LocalKeyEvents(),
            router=router,
            extractor=extractor,
            web=web,
            billing=billing,
            limits=limits,
            admission=admission,
            runner=runner,
            embedder=Embedder(router, settings.embedding_calls_in_flight,
                              settings.embedding_min_texts_beside),
            media_sources=media_sources,
            crypto_rpc=CryptoRpc(load_nodes(settings.crypto_rpc_nodes), runner=runner,
                                 limits=limits, database=engine,
                                 clock=billing.clock),
            wallets=WalletAuth(engine, sign_in_domains(settings),
                               settings.x402_requests_in_flight_per_wallet,
                               SignInsPerClient(settings.siwx_sign_ins_per_client_per_minute)),
            payments=payments,
            top_ups=TopUps(billing, payments, settings.x402_facilitator_url,
                           listen_hosts=listening_hosts(settings), database=engine,
                           limits=limits,
                           per_client_per_minute=settings.x402_top_ups_per_client_per_minute,
                           global_per_minute=settings.x402_top_ups_per_minute),
            jobs=jobs,
            results=results,
            job_worker=job_worker,
            chat=ChatService(router, catalog, web, engine, runner, FileReader(extractor),
                             AudioReader(router),
                             MediaReader(media_sources, probe_video, fetch_slots,
                                         image_inspector)),
            images=ImageService(catalog, router, runner, image_inspector),
            audio=AudioService(router, catalog, runner),
            job_service=job_service,
            queued_audio=QueuedAudio(router, job_service),
            voice_changer=VoiceChanger(router, job_service, MediaSourceReader(
                GuardedFetcher(allowed_hosts=settings.allowed_fetch_hosts,
                               timeout_s=FETCH_TIMEOUT_S, deadline_s=FETCH_TIMEOUT_S,
                               max_bytes=MAX_AUDIO_BYTES - 1),
                total_timeout_s=FETCH_TIMEOUT_S)),
            video=VideoService(router, media_sources, job_service, settings.public_api_url,
                               inspector=image_inspector),
            webhooks=webhooks,
        )
        services.responses = BackgroundResponses.from_settings(settings, engine, services.chat)
        return services

    async def start(self) -> None:
        """Background work of the replica: key change notices and the key sync, the sweeps."""
        self._tasks = [
            asyncio.create_task(self.key_events.run(self.keys.invalidate)),
            asyncio.create_task(self.keys.run_sync_loop(self.settings.key_sync_interval_s)),
            asyncio.create_task(self.billing.run_sweeper()),
            asyncio.create_task(self.wallets.run_nonce_sweeper()),
            asyncio.create_task(self.crypto_rpc.run_sweeper()),
            asyncio.create_task(self.job_worker.run()),
            asyncio.create_task(self.webhooks.run()),
            asyncio.create_task(self.responses.run()),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        with contextlib.suppress(Exception):
            await self.responses.stop()  # its generations handed over, or charged and failed
        with contextlib.suppress(Exception):
            await self.keys.sync()  # write the last `lastUsedAt` stamps
        with contextlib.suppress(Exception):
            await self.crypto_rpc.close()
        self.top_ups.close()
        self.images.inspector.close()
        await self.extractor.close()
        self.billing.close()
        await self.limits.close()
        self.engine.dispose()

    async def key_changed(self, key_hashes: list[str]) -> None:
        """Drop changed keys here and on every other replica before the change is answered."""
        self.keys.invalidate(key_hashes)
        await self.key_events.publish(key_hashes)

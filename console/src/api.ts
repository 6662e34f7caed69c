// Typed fetch client for the inference API (same origin: /api/v1) and its response shapes.

export const API_BASE = `${location.origin}/api/v1`;

/** The standard error body: `{error, code?, details?}`. */
export interface ApiErrorBody {
  error: string;
  code?: string;
  details?: unknown;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly code?: string,
    readonly headers?: Headers,
  ) {
    super(message);
    this.name = "ApiError";
  }

  /** The API answers 401 "Admin API key required" to INFERENCE keys on admin routes. */
  get adminRequired(): boolean {
    return this.status === 401 && /admin api key required/i.test(this.message);
  }
}

// ---------- Response shapes ----------

export interface Balance {
  canConsume: boolean;
  consumptionCurrency: "USD" | "DIEM" | null;
  balances: { usd: number | null; diem: number | null };
  diemEpochAllocation: number;
}

export interface RateLimitEntry {
  amount: number;
  type: "RPM" | "RPD" | "TPM" | string;
}

export interface RateLimits {
  accessPermitted: boolean;
  apiTier: { id: string; isCharged: boolean };
  balances: { USD: number; DIEM: number };
  keyExpiration: string | null;
  nextEpochBegins: string;
  rateLimits: { apiModelId: string; rateLimits: RateLimitEntry[] }[];
}

export type ApiKeyType = "INFERENCE" | "ADMIN";
export type LimitPeriod = "EPOCH" | "MONTH" | "LIFETIME";
export type ModelPrivacy = "ALL" | "PRIVATE_TEXT" | "PRIVATE_ONLY";

export interface ConsumptionLimit {
  usd: number | null;
  diem: number | null;
  vcu: number | null;
}

export interface ApiKeyRecord {
  id: string;
  apiKeyType: ApiKeyType;
  description: string;
  consumptionLimits: ConsumptionLimit;
  limitPeriod: LimitPeriod;
  modelPrivacy: ModelPrivacy;
  createdAt: string;
  expiresAt: string | null;
  last6Chars: string;
  lastUsedAt: string | null;
  usage?: { trailingSevenDays: { usd: string; vcu: string; diem: string } };
  currentPeriodUsage?: { usd: string; diem: string };
}

export interface CreatedApiKey {
  apiKey: string; // the secret: present in this answer only
  id: string;
  apiKeyType: ApiKeyType;
  description: string;
  consumptionLimit: ConsumptionLimit;
  limitPeriod: LimitPeriod;
  modelPrivacy: ModelPrivacy;
  expiresAt: string | null;
}

export interface CreateApiKeyRequest {
  apiKeyType: ApiKeyType;
  description: string;
  consumptionLimit?: Partial<ConsumptionLimit>;
  limitPeriod: LimitPeriod;
  modelPrivacy: ModelPrivacy;
  expiresAt?: string;
}

/** Only the fields present are changed; `expiresAt: ""` removes the expiry. */
export interface UpdateApiKeyRequest {
  id: string;
  description?: string;
  consumptionLimit?: Partial<ConsumptionLimit>;
  limitPeriod?: LimitPeriod;
  modelPrivacy?: ModelPrivacy;
  expiresAt?: string;
}

export interface UsageAnalytics {
  lookback: string;
  byDate: { date: string; USD: number; DIEM: number }[];
  byModel: {
    modelName: string;
    unitType: string;
    modelType: string | null;
    totalUsd: number;
    totalDiem: number;
    totalUnits: number;
    breakdown?: { type: string; usd: number; diem: number; units: number }[];
  }[];
  byModelDaily: ({ date: number } & Record<string, number>)[];
  topModels: string[];
  byKey: {
    apiKeyId: string | null;
    description: string;
    totalUsd: number;
    totalDiem: number;
    totalUnits: number;
  }[];
  byKeyDaily: ({ date: number } & Record<string, number>)[];
  topKeyNames: string[];
}

export interface UsageRecord {
  amount: number;
  currency: "USD" | "DIEM" | "BUNDLED_CREDITS" | string;
  inferenceDetails: {
    completionTokens: number | null;
    inferenceExecutionTime: number | null;
    promptTokens: number | null;
    requestId: string | null;
  } | null;
  notes: string;
  pricePerUnitUsd: number | null;
  sku: string;
  timestamp: string;
  units: number;
}

export interface UsageHistoryPage {
  data: UsageRecord[];
  nextCursor: string | null;
}

export interface ModelRecord {
  id: string;
  type: string;
  object: "model";
  owned_by: string;
  created: number;
  context_length?: number;
  model_spec: {
    name: string;
    description?: string;
    offline: boolean;
    beta?: boolean;
    traits: string[];
    [field: string]: unknown;
  };
}

export interface ModelList {
  object: "list";
  type: string;
  data: ModelRecord[];
}

export interface ChatMessage {
  role: "system" | "user" | "assistant";
  content: string;
}

/** One `data:` event of a streamed chat completion (OpenAI chunk format). */
export interface ChatChunk {
  id?: string;
  model?: string;
  choices?: {
    index: number;
    delta: { role?: string; content?: string | null; reasoning_content?: string | null };
    finish_reason: string | null;
  }[];
  usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number } | null;
  error?: string; // an error met mid-stream: `{error, code}`
  code?: string;
}

export interface EmbeddingResponse {
  object: "list";
  data: { object: "embedding"; index: number; embedding: number[] }[];
  model: string;
  usage: { prompt_tokens: number; total_tokens: number };
}

// ---------- Client ----------

let authKey: string | null = null;

export function setAuthKey(key: string | null): void {
  authKey = key;
}

export interface RequestOptions {
  method?: "GET" | "POST" | "PATCH" | "DELETE";
  query?: Record<string, string | number | undefined>;
  json?: unknown;
  body?: BodyInit;
  accept?: string;
  signal?: AbortSignal;
  /** Use this key instead of the session's (sign-in validation). */
  key?: string;
}

export function apiUrl(path: string, query?: RequestOptions["query"]): string {
  const url = new URL(API_BASE + path);
  for (const [name, value] of Object.entries(query ?? {})) {
    if (value !== undefined && value !== "") url.searchParams.set(name, String(value));
  }
  return url.toString();
}

/** Turn a failed answer into an ApiError carrying the API's own `error` text. */
async function toApiError(res: Response): Promise<ApiError> {
  let message = res.statusText || `HTTP ${res.status}`;
  let code: string | undefined;
  const text = await res.text().catch(() => "");
  try {
    const body = JSON.parse(text) as Partial<ApiErrorBody> & { detail?: unknown };
    if (typeof body.error === "string") message = body.error;
    else if (typeof body.detail === "string") message = body.detail;
    code = body.code;
  } catch {
    if (text.trim()) message = text.trim().slice(0, 300);
  }
  return new ApiError(res.status, message, code, res.headers);
}

/** Send a request; resolve with the Response when it is 2xx, reject with an ApiError otherwise. */
export async function apiFetch(path: string, opts: RequestOptions = {}): Promise<Response> {
  const headers = new Headers();
  const key = opts.key ?? authKey;
  if (key) headers.set("Authorization", `Bearer ${key}`);
  headers.set("Accept", opts.accept ?? "application/json");
  let body = opts.body;
  if (opts.json !== undefined) {
    headers.set("Content-Type", "application/json");
    body = JSON.stringify(opts.json);
  }
  let res: Response;
  try {
    res = await fetch(apiUrl(path, opts.query), {
      method: opts.method ?? "GET", headers, body, signal: opts.signal,
    });
  } catch (err) {
    if (err instanceof DOMException && err.name === "AbortError") throw err;
    throw new ApiError(0, `Network error: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (!res.ok) throw await toApiError(res);
  return res;
}

export async function apiJson<T>(path: string, opts: RequestOptions = {}): Promise<T> {
  const res = await apiFetch(path, opts);
  return (await res.json()) as T;
}

// ---------- Rate-limit headers seen in this session ----------

/** `GET /api_keys/rate_limits` gives the limits only; the remaining counts come with each
 *  inference answer (`x-ratelimit-remaining-*`), kept here per model. */
export interface SeenRateLimit {
  remainingRequests: string | null;
  remainingTokens: string | null;
  resetRequests: string | null;
  at: Date;
}

export const seenRateLimits = new Map<string, SeenRateLimit>();

export function noteRateLimitHeaders(headers: Headers): void {
  const model = headers.get("x-service-model-id");
  const remainingRequests = headers.get("x-ratelimit-remaining-requests");
  if (!model || remainingRequests === null) return;
  seenRateLimits.set(model, {
    remainingRequests,
    remainingTokens: headers.get("x-ratelimit-remaining-tokens"),
    resetRequests: headers.get("x-ratelimit-reset-requests"),
    at: new Date(),
  });
}

// ---------- Endpoints ----------

export const api = {
  rateLimits: (key?: string) =>
    apiJson<{ data: RateLimits }>("/api_keys/rate_limits", { key }).then((r) => r.data),
  balance: () => apiJson<Balance>("/billing/balance"),
  usageAnalytics: (lookback: string) =>
    apiJson<UsageAnalytics>("/billing/usage-analytics", { query: { lookback } }),
  usageHistory: (q: { cursor?: string; pageSize?: number; startTimestamp?: string }) =>
    apiJson<UsageHistoryPage>("/billing/usage-history",
      { query: q.cursor ? { cursor: q.cursor } : { pageSize: q.pageSize, startTimestamp: q.startTimestamp } }),
  /** CSV is asked for with `Accept: text/csv`; more pages follow through `x-next-cursor`. */
  usageHistoryCsv: (cursor?: string) =>
    apiFetch("/billing/usage-history", { accept: "text/csv", query: { cursor } }),
  listKeys: () => apiJson<{ data: ApiKeyRecord[] }>("/api_keys").then((r) => r.data),
  createKey: (req: CreateApiKeyRequest) =>
    apiJson<{ data: CreatedApiKey }>("/api_keys", { method: "POST", json: req }).then((r) => r.data),
  updateKey: (req: UpdateApiKeyRequest) =>
    apiJson<{ data: ApiKeyRecord }>("/api_keys", { method: "PATCH", json: req }).then((r) => r.data),
  deleteKey: (id: string) =>
    apiJson<{ success: boolean }>("/api_keys", { method: "DELETE", query: { id } }),
  models: (type: "text" | "embedding") =>
    apiJson<ModelList>("/models", { query: { type } }).then((r) => r.data),
};

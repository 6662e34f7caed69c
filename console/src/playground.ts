// Playground view: streamed chat, embeddings and image operations, with the response headers
// of the last call.

import {
  api, apiFetch, ApiError, noteRateLimitHeaders, type ChatChunk, type ChatMessage,
  type EmbeddingResponse, type ModelRecord,
} from "./api";
import { errorText, h, showError, type View } from "./dom";

const SHOWN_HEADERS: { name: string; label: string }[] = [
  { name: "CF-RAY", label: "Request id (CF-RAY)" },
  { name: "x-service-model-id", label: "Model" },
  { name: "x-service-balance-usd", label: "Balance before the call (USD)" },
  { name: "x-ratelimit-remaining-requests", label: "Remaining requests" },
  { name: "x-ratelimit-remaining-tokens", label: "Remaining tokens" },
  { name: "x-ratelimit-reset-requests", label: "Requests reset at" },
];

const IMAGE_OPS = {
  upscale: { path: "/image/upscale", label: "Upscale" },
  "background-remove": { path: "/image/background-remove", label: "Remove background" },
} as const;
type ImageOp = keyof typeof IMAGE_OPS;

function modelOptions(select: HTMLSelectElement, models: ModelRecord[]): void {
  select.replaceChildren(...(models.length
    ? models.map((m) => h("option", { value: m.id },
      `${m.model_spec.name || m.id}${m.model_spec.offline ? " (offline)" : ""}`))
    : [h("option", { value: "" }, "No models available")]));
}

export function createPlaygroundView(root: HTMLElement): View {
  // --- response headers ---
  const headersTitle = h("p", { class: "muted" }, "Make a call to see its headers.");
  const headersList = h("dl", { "data-testid": "response-headers", class: "headers" });
  function showHeaders(call: string, status: number, headers: Headers | undefined): void {
    headersTitle.textContent = `${call} → ${status || "no answer"}`;
    headersList.replaceChildren(...SHOWN_HEADERS.flatMap(({ name, label }) => {
      const value = headers?.get(name);
      if (value === null || value === undefined) return [];
      let shown = value;
      if (name === "x-ratelimit-reset-requests" && /^\d+$/.test(value)) {
        shown = `${new Date(Number(value) * 1000).toLocaleTimeString()} (${value})`;
      }
      return [h("div", { "data-header": name.toLowerCase() }, h("dt", {}, label), h("dd", { class: "mono" }, shown))];
    }));
    if (!headersList.children.length) headersList.append(h("div", {}, h("dd", { class: "muted" }, "None of the listed headers were sent.")));
    if (headers) noteRateLimitHeaders(headers);
  }
  /** Record the headers of a call that failed (an ApiError carries them). */
  function showFailure(call: string, err: unknown): void {
    if (err instanceof ApiError) showHeaders(call, err.status, err.headers);
  }

  // --- chat ---
  const chatModel = h("select", { id: "chat-model", "data-testid": "chat-model" }, h("option", { value: "" }, "Loading…"));
  const chatInput = h("textarea", { id: "chat-input", "data-testid": "chat-input", rows: 3, required: true,
    "aria-describedby": "chat-input-help" });
  const chatSend = h("button", { type: "submit", class: "primary", "data-testid": "chat-send" }, "Send");
  const chatStop = h("button", { type: "button", disabled: true }, "Stop");
  const chatMaxTokens = h("input", { id: "chat-max-tokens", type: "number", min: "1", max: "8192",
    value: "256", inputmode: "numeric", "data-testid": "chat-max-tokens" });
  const chatReset = h("button", { type: "button" }, "New conversation");
  const chatLog = h("ol", { class: "chat-log", "data-testid": "chat-log", "aria-label": "Conversation" });
  const chatOutput = h("div", { class: "chat-output", "data-testid": "chat-output", "aria-live": "polite",
    "aria-label": "Assistant reply" });
  const chatError = h("p", { class: "error", role: "alert", "data-testid": "chat-error", hidden: true });
  const chatForm = h("form", { class: "card stack", "aria-labelledby": "chat-title" },
    h("h2", { id: "chat-title" }, "Chat"),
    h("div", { class: "field" }, h("label", { for: "chat-model" }, "Model"), chatModel),
    h("div", { class: "field" }, h("label", { for: "chat-max-tokens" }, "Max tokens"), chatMaxTokens),
    chatLog, chatOutput, chatError,
    h("div", { class: "field" }, h("label", { for: "chat-input" }, "Message"), chatInput,
      h("p", { id: "chat-input-help", class: "muted small" }, "Ctrl+Enter (⌘+Enter) sends.")),
    h("div", { class: "actions" }, chatSend, chatStop, chatReset));

  // --- embeddings ---
  const embedModel = h("select", { id: "embed-model", "data-testid": "embed-model" }, h("option", { value: "" }, "Loading…"));
  const embedInput = h("textarea", { id: "embed-input", "data-testid": "embed-input", rows: 2, required: true });
  const embedSend = h("button", { type: "submit", class: "primary", "data-testid": "embed-send" }, "Embed");
  const embedOutput = h("div", { "data-testid": "embed-output", "aria-live": "polite" });
  const embedError = h("p", { class: "error", role: "alert", "data-testid": "embed-error", hidden: true });
  const embedForm = h("form", { class: "card stack", "aria-labelledby": "embed-title" },
    h("h2", { id: "embed-title" }, "Embeddings"),
    h("div", { class: "field" }, h("label", { for: "embed-model" }, "Model"), embedModel),
    h("div", { class: "field" }, h("label", { for: "embed-input" }, "Text"), embedInput),
    h("div", { class: "actions" }, embedSend), embedError, embedOutput);

  // --- images ---
  const imageOp = h("select", { id: "image-op", "data-testid": "image-op" },
    ...Object.entries(IMAGE_OPS).map(([value, op]) => h("option", { value }, op.label)));
  const imageFile = h("input", { id: "image-file", type: "file", accept: "image/*", "data-testid": "image-file", required: true });
  const imageScale = h("select", { id: "image-scale", "data-testid": "image-scale" },
    h("option", { value: "2" }, "2×"), h("option", { value: "4" }, "4×"));
  const scaleField = h("div", { class: "field" }, h("label", { for: "image-scale" }, "Scale"), imageScale);
  const imageSend = h("button", { type: "submit", class: "primary", "data-testid": "image-send" }, "Run");
  const imageError = h("p", { class: "error", role: "alert", "data-testid": "image-error", hidden: true });
  const imageOutput = h("img", { "data-testid": "image-output", alt: "", hidden: true, class: "result-image" });
  const imageDownload = h("a", { download: "result.png", hidden: true }, "Download the PNG");
  const imageForm = h("form", { class: "card stack", "aria-labelledby": "image-title" },
    h("h2", { id: "image-title" }, "Images"),
    h("div", { class: "field" }, h("label", { for: "image-op" }, "Operation"), imageOp),
    h("div", { class: "field" }, h("label", { for: "image-file" }, "Image file"), imageFile),
    scaleField,
    h("div", { class: "actions" }, imageSend), imageError, imageOutput, imageDownload);

  root.replaceChildren(
    h("h1", { class: "visually-hidden" }, "Playground"),
    h("div", { class: "playground" },
      h("div", { class: "stack" }, chatForm, embedForm, imageForm),
      h("section", { class: "card headers-panel", "aria-labelledby": "headers-title" },
        h("h2", { id: "headers-title" }, "Response headers"), headersTitle, headersList)));

  // --- chat behaviour ---
  let history: ChatMessage[] = [];
  let controller: AbortController | null = null;

  function logMessage(m: ChatMessage): HTMLLIElement {
    const item = h("li", { class: `msg ${m.role}` },
      h("span", { class: "role" }, m.role === "user" ? "You" : "Assistant"), h("div", { class: "text" }, m.content));
    chatLog.append(item);
    return item;
  }

  async function sendChat(): Promise<void> {
    const text = chatInput.value.trim();
    if (!text || !chatModel.value || controller) return;
    showError(chatError, null);
    // The previous reply joins the conversation log; the output shows the new one.
    const last = history[history.length - 1];
    if (last?.role === "assistant" && chatOutput.textContent) logMessage(last);
    const userMessage: ChatMessage = { role: "user", content: text };
    history.push(userMessage);
    const userItem = logMessage(userMessage);
    chatInput.value = "";

    const reply = document.createTextNode("");
    chatOutput.replaceChildren(reply);
    chatOutput.dataset.done = "false";
    chatOutput.setAttribute("aria-busy", "true");
    controller = new AbortController();
    chatSend.disabled = true;
    chatStop.disabled = false;
    const call = "POST /chat/completions";
    try {
      const res = await apiFetch("/chat/completions", {
        method: "POST", signal: controller.signal, accept: "text/event-stream",
        json: { model: chatModel.value, messages: history, stream: true,
          max_tokens: Math.max(1, Number(chatMaxTokens.value) || 256) },
      });
      showHeaders(call, res.status, res.headers);
      await readStream(res, (delta) => reply.appendData(delta));
      history.push({ role: "assistant", content: reply.data });
    } catch (err) {
      const aborted = err instanceof DOMException && err.name === "AbortError";
      if (reply.data) {
        history.push({ role: "assistant", content: reply.data }); // keep what arrived
      } else {
        history.pop(); // nothing answered: take the message back
        userItem.remove();
        chatInput.value = text;
      }
      if (!aborted) {
        showFailure(call, err);
        showError(chatError, err);
      }
    } finally {
      controller = null;
      chatOutput.removeAttribute("aria-busy");
      chatOutput.dataset.done = "true";
      chatSend.disabled = false;
      chatStop.disabled = true;
    }
  }

  /** Parse the SSE `data:` lines of a streamed chat completion until `[DONE]`. */
  async function readStream(res: Response, onDelta: (text: string) => void): Promise<void> {
    if (!res.body) throw new Error("The answer has no body to stream");
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let newline: number;
      while ((newline = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, newline).replace(/\r$/, "");
        buffer = buffer.slice(newline + 1);
        if (!line.startsWith("data:")) continue;
        const payload = line.slice(5).trim();
        if (payload === "[DONE]") return; // the server closes the stream right after
        const chunk = JSON.parse(payload) as ChatChunk;
        if (chunk.error) throw new ApiError(res.status, chunk.error, chunk.code, res.headers);
        const delta = chunk.choices?.[0]?.delta.content;
        if (delta) onDelta(delta);
      }
    }
  }

  chatForm.addEventListener("submit", (e) => {
    e.preventDefault();
    void sendChat();
  });
  chatInput.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      void sendChat();
    }
  });
  chatStop.addEventListener("click", () => controller?.abort());
  chatReset.addEventListener("click", () => {
    controller?.abort();
    history = [];
    chatLog.replaceChildren();
    chatOutput.replaceChildren();
    delete chatOutput.dataset.done;
    showError(chatError, null);
    chatInput.focus();
  });

  // --- embeddings behaviour ---
  embedForm.addEventListener("submit", async (e) => {
    e.preventDefault();
    if (!embedInput.value.trim() || !embedModel.value) return;
    showError(embedError, null);
    embedSend.disabled = true;
    const call = "POST /embeddings";
    try {
      const res = await apiFetch("/embeddings", {
        method: "POST", json: { model: embedModel.value, input: embedInput.value },
      });
      showHeaders(call, res.status, res.headers);
      const body = (await res.json()) as EmbeddingResponse;
      const vector = body.data[0]?.embedding ?? [];
      embedOutput.replaceChildren(h("dl", { class: "facts" },
        h("div", {}, h("dt", {}, "Model"), h("dd", {}, body.model)),
        h("div", {}, h("dt", {}, "Dimensions"), h("dd", { "data-field": "dimensions" }, vector.length)),
        h("div", {}, h("dt", {}, "Tokens"), h("dd", { "data-field": "tokens" },
          `${body.usage.prompt_tokens} prompt, ${body.usage.total_tokens} total`)),
        h("div", {}, h("dt", {}, "First 8 values"), h("dd", { class: "mono", "data-field": "values" },
          `[${vector.slice(0, 8).map((v) => v.toFixed(6)).join(", ")}${vector.length > 8 ? ", …" : ""}]`))));
    } catch (err) {
      showFailure(call, err);
      showError(embedError, err);
      embedOutput.replaceChildren();
    } finally {
      embedSend.disabled = false;
    }
  });

  // --- images behaviour ---
  let imageUrl: string | null = null;
  const syncScale = () => { scaleField.hidden = imageOp.value !== "upscale"; };
  imageOp.addEventListener("change", syncScale);
  syncScale();

  imageForm.addEventListener("submit", async (e) => {
    e.preventDefault();
    const file = imageFile.files?.[0];
    if (!file) {
      showError(imageError, new Error("Choose an image file."));
      return;
    }
    const op = IMAGE_OPS[imageOp.value as ImageOp];
    const form = new FormData();
    form.append("image", file, file.name);
    if (imageOp.value === "upscale") form.append("scale", imageScale.value);
    showError(imageError, null);
    imageSend.disabled = true;
    const call = `POST ${op.path}`;
    try {
      const res = await apiFetch(op.path, { method: "POST", body: form, accept: "image/png, application/json" });
      showHeaders(call, res.status, res.headers);
      const blob = await res.blob();
      if (!blob.type.startsWith("image/")) throw new Error(`Expected an image, got ${blob.type || "no content type"}`);
      if (imageUrl) URL.revokeObjectURL(imageUrl);
      imageUrl = URL.createObjectURL(blob);
      imageOutput.src = imageUrl;
      imageOutput.alt = `${op.label} result of ${file.name}`;
      imageOutput.hidden = false;
      imageDownload.href = imageUrl;
      imageDownload.download = `${file.name.replace(/\.[^.]+$/, "")}-${imageOp.value}.png`;
      imageDownload.hidden = false;
    } catch (err) {
      showFailure(call, err);
      imageError.textContent = err instanceof ApiError
        ? `${op.label} failed with HTTP ${err.status}: ${err.message}${err.code ? ` (${err.code})` : ""}`
        : errorText(err);
      imageError.hidden = false;
      imageOutput.hidden = imageDownload.hidden = true;
    } finally {
      imageSend.disabled = false;
    }
  });

  // --- models ---
  async function loadModels(): Promise<void> {
    const [text, embedding] = await Promise.allSettled([api.models("text"), api.models("embedding")]);
    if (text.status === "fulfilled") modelOptions(chatModel, text.value);
    else showError(chatError, text.reason);
    if (embedding.status === "fulfilled") modelOptions(embedModel, embedding.value);
    else showError(embedError, embedding.reason);
  }

  let loaded = false;
  return {
    show() {
      if (!loaded) {
        loaded = true;
        void loadModels();
      }
    },
    destroy() {
      controller?.abort();
      if (imageUrl) URL.revokeObjectURL(imageUrl);
      root.replaceChildren();
    },
  };
}

